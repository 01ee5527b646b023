"""Audit other agents' logs: where the money went and why (``stayer audit``).

Totals per day and session are what people already get from their logs; this package
answers *why*: which calls cost most, where the prompt cache broke and for what likely
reason, how the context grew, which sub-agent spent what — and, as an estimate through the
what-if engine, what a session would have cost under another model or context policy.

Layers: importers (``claude_code``, ``codex``, ``stayer_runs``, ``swe_agent``,
``mini_swe_agent``, ``openhands``, ``atif``) turn logs into
:class:`~stayer.audit.calls.Call` records per session; ``analysis`` prices them
(``costing``, through ``PriceBook``) and explains them; ``engine`` runs sessions in
parallel with bounded memory; ``report``, ``html`` and ``whatif`` present the results.
"""

from stayer.audit.analysis import SessionReport, analyse
from stayer.audit.calls import Call, ImportedSession, Importer, SessionRef
from stayer.audit.document import AuditReport, build
from stayer.audit.engine import analyse_all, default_paths, discover

__all__ = [
    "AuditReport",
    "Call",
    "ImportedSession",
    "Importer",
    "SessionRef",
    "SessionReport",
    "analyse",
    "analyse_all",
    "build",
    "default_paths",
    "discover",
]

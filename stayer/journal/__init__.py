"""Durable runs: an append-only journal per run, content-addressed blobs, exact resume.

* ``store`` — the Store protocol and its rows; ``backends`` — ``open_store`` (SQLite under
  ``$STAYER_HOME`` by default, PostgreSQL with ``STAYER_DB=postgresql://…``);
* ``session`` — ``RunJournal``: a run's journal from creation or resume to its end, and
  the loop's hooks; ``replay`` — the journaled model, tools, sandbox and probe, which write
  to it and answer from it on resume; ``digest`` — request digests;
* ``log`` — a journal read back (a torn tail cut off, corruption refused);
* ``snapshot`` — workspace snapshots in the blob store (for Postgres; SQLite journals use
  the sandbox's ``FileSnapshotStore`` beside the database).

The names are imported when first used: ``stayer runs`` needs only the store, and the
session pulls in the agent and the price data (a third of a second).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

# name → the module that defines it
_EXPORTS = {
    "RunLog": "log",
    "load_log": "log",
    "CacheStateful": "replay",
    "JournaledModel": "replay",
    "JournaledProbe": "replay",
    "JournaledTool": "replay",
    "ReplayingSandbox": "replay",
    "JournalStats": "session",
    "ReplayDiverged": "replay",
    "RunFinished": "session",
    "RunJournal": "session",
    "lost_ledger_entries": "session",
    "BlobSnapshots": "snapshot",
    "SCHEMA_VERSION": "store",
    "JournalEvent": "store",
    "JournalCorrupt": "store",
    "JournalError": "store",
    "LeaseLost": "store",
    "RunRow": "store",
    "Store": "store",
    "open_store": "backends",
    "stayer_home": "backends",
}

if TYPE_CHECKING:
    from stayer.journal.backends import open_store, stayer_home
    from stayer.journal.log import RunLog, load_log
    from stayer.journal.replay import (
        CacheStateful,
        JournaledModel,
        JournaledProbe,
        JournaledTool,
        ReplayDiverged,
        ReplayingSandbox,
    )
    from stayer.journal.session import JournalStats, RunFinished, RunJournal, lost_ledger_entries
    from stayer.journal.snapshot import BlobSnapshots
    from stayer.journal.store import (
        SCHEMA_VERSION,
        JournalCorrupt,
        JournalError,
        JournalEvent,
        LeaseLost,
        RunRow,
        Store,
    )


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{module}"), name)


__all__ = [
    "BlobSnapshots",
    "CacheStateful",
    "JournalEvent",
    "JournalCorrupt",
    "JournalError",
    "JournalStats",
    "JournaledModel",
    "JournaledProbe",
    "JournaledTool",
    "LeaseLost",
    "ReplayDiverged",
    "ReplayingSandbox",
    "RunFinished",
    "RunJournal",
    "RunLog",
    "RunRow",
    "SCHEMA_VERSION",
    "Store",
    "load_log",
    "lost_ledger_entries",
    "open_store",
    "stayer_home",
]

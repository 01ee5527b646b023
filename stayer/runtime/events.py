"""A run's public event stream, read from its journal.

Every public event carries an id that only grows: journal event number ``seq`` becomes id
``seq + 1``, and id 0 is the ``queued`` status a run has before any worker journaled it.
A client that reconnects with ``Last-Event-ID: N`` (or ``?after=N``) gets exactly the
events after N: nothing lost, nothing repeated, whichever API process it reaches, because
the journal is the one source. Events the public does not need (snapshots, observations,
lease bookkeeping) are skipped; ids stay increasing across the gaps.

Public types: ``run.status`` (``queued``, ``running``, ``requires_action`` and the final
status with its stop reason), ``requires_action`` (the call awaiting a person, with what
waiting costs), ``message`` (the model's text and tool calls), ``tool.call``, ``tool.result``,
``step`` (the ledger entry), ``outcome_unknown`` (a side-effecting call whose result a crash
lost, not sent again: ``stayer.ledger.OutcomeUnknown``), ``compaction``, ``breaker``,
``failover`` and any other event the agent emits, under its own name.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from stayer.journal.log import JOURNAL_KINDS
from stayer.journal.store import JournalEvent
from stayer.ledger import RunReport

#: Tool output beyond this many characters is cut in the stream (the journal has it all).
TOOL_OUTPUT_LIMIT = 8_000


@dataclass(frozen=True)
class PublicEvent:
    id: int
    type: str
    data: dict[str, Any]

    def to_json(self) -> str:
        return json.dumps({"id": self.id, "type": self.type, **self.data}, separators=(",", ":"))


def status_event(
    event_id: int, run_id: str, status: str, stop_reason: str | None = None
) -> PublicEvent:
    return PublicEvent(
        event_id, "run.status", {"run_id": run_id, "status": status, "stop_reason": stop_reason}
    )


def public_event(run_id: str, ev: JournalEvent, blob: Callable[[str], bytes]) -> PublicEvent | None:
    """The public form of journal event ``ev`` (with ``at``, when it was journaled), or
    None for bookkeeping events."""
    event = _public(run_id, ev, blob)
    if event is not None:
        event.data["at"] = ev.at
    return event


def _public(run_id: str, ev: JournalEvent, blob: Callable[[str], bytes]) -> PublicEvent | None:
    d, kind, event_id = ev.data, ev.kind, ev.seq + 1
    if kind == "run_created":
        return status_event(event_id, run_id, "running")
    if kind == "resumed":
        return PublicEvent(
            event_id,
            "run.status",
            {"run_id": run_id, "status": "running", "resumed": True, "stop_reason": None},
        )
    if kind == "run_finished":
        result = RunReport.read(blob(d["result"]))
        return status_event(event_id, run_id, d["status"], result.stop_reason or None)
    if kind == "model_finished":
        message = json.loads(blob(d["message"]))
        return PublicEvent(
            event_id, "message", {"run_id": run_id, "model": d.get("model"), **message}
        )
    if kind == "tool_started":
        return PublicEvent(
            event_id, "tool.call", {"run_id": run_id, "t": d["t"], "name": d["name"]}
        )
    if kind == "tool_finished":
        output = blob(d["output"]).decode(errors="replace")
        cut = len(output) > TOOL_OUTPUT_LIMIT
        return PublicEvent(
            event_id,
            "tool.result",
            {
                "run_id": run_id,
                "t": d["t"],
                "name": d["name"],
                "is_error": bool(d.get("is_error")),
                "output": output[:TOOL_OUTPUT_LIMIT],
                "truncated": cut,
            },
        )
    if kind == "step":
        return PublicEvent(event_id, "step", {"run_id": run_id, **d["entry"]})
    if kind == "requires_action":
        return PublicEvent(event_id, "requires_action", {"run_id": run_id, **d})
    if kind == "suspended":
        return status_event(event_id, run_id, d["status"], d.get("reason", d["status"]))
    if kind == "model_lost":
        return PublicEvent(event_id, "step", {"run_id": run_id, "kind": "lost_in_flight", **d})
    if kind == "outcome_unknown":
        return PublicEvent(event_id, "outcome_unknown", {"run_id": run_id, **d})
    if kind in JOURNAL_KINDS:
        return None
    payload = json.loads(blob(d["payload"]))
    return PublicEvent(event_id, kind.removeprefix("agent:"), {"run_id": run_id, **payload})

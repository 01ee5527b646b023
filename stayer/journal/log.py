"""A run's journal read back: what happened, indexed for replay, with any torn tail cut off.

Events are numbered 0, 1, 2, … per run. The usable journal is the longest prefix in which
the numbering has no gap, every record parses and every blob an event refers to is present
and matches its address; anything after the first damaged event is a torn tail (a write cut
short by a crash) and is dropped, so a resume continues from the last complete event.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from stayer.journal.blobs import BlobError
from stayer.journal.store import Event, Store

#: Event kinds the journal itself writes. Any other kind is an agent event (compaction,
#: breaker, …) recorded through ``on_event``; an agent kind that collides with one of these
#: is stored with an ``agent:`` prefix.
JOURNAL_KINDS = frozenset({
    "run_created", "resumed", "truncated",
    "model_started", "model_finished", "model_failed", "model_lost",
    "tool_started", "tool_finished", "tool_diverged",
    "step", "snapshot", "run_finished", "observed",
    # Written by the runtime while no process runs the run: a person's decision is awaited.
    "requires_action", "suspended",
})


def blob_refs(event: Event) -> list[str]:
    """The blobs an event cannot be used without."""
    d = event.data
    key = {
        "model_finished": "message",
        "tool_finished": "output",
        "run_finished": "result",
    }.get(event.kind)
    if key is not None:
        return [d[key]]
    if event.kind not in JOURNAL_KINDS and "payload" in d:
        return [d["payload"]]
    return []


@dataclass
class CallRecord:
    """Model call number ``n`` of the run, over all its attempts."""

    attempts: int = 0  # model_started events: a started attempt with no outcome was lost
    digest: str = ""
    now: float | None = None  # the request's timestamp (the simulator's cache clock)
    finished: dict[str, Any] | None = None
    failed: dict[str, Any] | None = None


@dataclass
class RunLog:
    run_id: str
    events: list[Event] = field(default_factory=list)  # the complete prefix
    torn: int = 0  # events dropped after it
    blobs: dict[str, bytes] = field(default_factory=dict)  # every blob the events refer to
    header: dict[str, Any] = field(default_factory=dict)
    calls: dict[int, CallRecord] = field(default_factory=dict)
    tools: dict[int, dict[str, Any]] = field(default_factory=dict)  # t → tool_finished
    steps: dict[int, dict[str, Any]] = field(default_factory=dict)  # step → ledger entry
    lost: list[dict[str, Any]] = field(default_factory=list)  # model_lost records
    snapshots: list[dict[str, Any]] = field(default_factory=list)  # oldest first
    agent_events: dict[int, tuple[str, str]] = field(default_factory=dict)  # i → (kind, payload)
    observations: dict[int, Any] = field(default_factory=dict)  # i → value
    finished: dict[str, Any] | None = None
    resumes: int = 0

    @property
    def next_seq(self) -> int:
        return len(self.events)

    def blob_text(self, address: str) -> str:
        return self.blobs[address].decode()


def load_log(store: Store, run_id: str) -> RunLog:
    log = RunLog(run_id)
    raw = store.events(run_id)
    wanted = {a for ev in raw for a in blob_refs(ev)}
    missing = store.missing_blobs(wanted)
    for i, ev in enumerate(raw):
        if ev.seq != i:
            break
        try:
            refs = blob_refs(ev)
            if any(a in missing for a in refs):
                break
            for a in refs:
                if a not in log.blobs:
                    log.blobs[a] = store.get_blob(a)
            _index(log, ev)
        except (BlobError, KeyError, TypeError, ValueError):
            break
        log.events.append(ev)
    log.torn = len(raw) - len(log.events)
    return log


def _index(log: RunLog, ev: Event) -> None:
    d, kind = ev.data, ev.kind
    if kind == "run_created":
        log.header = d["header"]
    elif kind == "resumed":
        log.resumes += 1
    elif kind == "model_started":
        rec = log.calls.setdefault(int(d["n"]), CallRecord())
        rec.attempts += 1
        rec.digest, rec.now = d["digest"], d.get("now")
    elif kind == "model_finished":
        log.calls.setdefault(int(d["n"]), CallRecord()).finished = d
    elif kind == "model_failed":
        log.calls.setdefault(int(d["n"]), CallRecord()).failed = d
    elif kind == "model_lost":
        log.lost.append(d)
    elif kind == "tool_finished":
        log.tools[int(d["t"])] = d
    elif kind == "step":
        log.steps[int(d["step"])] = d["entry"]
    elif kind == "snapshot":
        log.snapshots.append(d)
    elif kind == "run_finished":
        log.finished = d
    elif kind == "observed":
        log.observations[int(d["i"])] = d["value"]
    elif kind not in JOURNAL_KINDS:
        log.agent_events[int(d["i"])] = (kind, d["payload"])

"""A run's journal read back: what happened, indexed for replay, with a torn tail cut off.

Events are numbered 0, 1, 2, … per run. An event is damaged when its record cannot be read
or indexed, its number leaves a gap, or a blob it refers to is missing or does not match
its address. Damage confined to the run's last write (the events appended together, which
share one ``at``) is a torn tail, a write cut short by a crash: it is dropped, and a resume
continues from the last complete event. Damage anywhere before the last write is
corruption: the events after it record work that was done and paid for, so the journal is
refused (``JournalCorrupt``, naming the run and the event) rather than read as a shorter
run or resumed by paying for that work again.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Self

from msgspec import UNSET, UnsetType, structs

from stayer.journal.blobs import BlobError
from stayer.journal.store import JournalCorrupt, JournalEvent, Store
from stayer.records import Record
from stayer.usage import Usage

if TYPE_CHECKING:
    from stayer.ledger import LedgerEntry, LostCall, OutcomeUnknown
    from stayer.tools.base import ResultFields, ToolResult

#: Event kinds the journal itself writes. Any other kind is an agent event (compaction,
#: breaker, …) recorded through ``on_event``; an agent kind that collides with one of these
#: is stored with an ``agent:`` prefix.
JOURNAL_KINDS = frozenset(
    {
        "run_created",
        "resumed",
        "truncated",
        "model_started",
        "model_finished",
        "model_failed",
        "model_lost",
        "outcome_unknown",
        "tool_started",
        "tool_finished",
        "tool_diverged",
        "step",
        "snapshot",
        "run_finished",
        "observed",
        # Written by the runtime while no process runs the run: a person's decision is awaited.
        "requires_action",
        "suspended",
        # A team's thread began, on which message (``stayer.teams``).
        "thread_started",
    }
)


def blob_refs(event: JournalEvent) -> list[str]:
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


class RunCreatedRecord(Record):
    """A ``run_created`` event: the run's header (``stayer.prepare.run_header``)."""

    header: dict[str, Any]


class ResumedRecord(Record):
    """A ``resumed`` event: ``owner`` took the run over at event ``from_seq``, after
    dropping ``torn`` torn events."""

    owner: str
    from_seq: int
    torn: int


class ThreadStartedRecord(Record):
    """A ``thread_started`` event: a team's ``thread`` began on ``message`` (its id)."""

    thread: str
    message: str


class ModelStartedRecord(Record, kw_only=True):
    """A ``model_started`` event: attempt ``attempt`` at call ``n`` (its request's digest
    and timestamp) was sent."""

    n: int
    digest: str
    now: float | None = None
    attempt: int = 1


class ToolStartedRecord(Record):
    """A ``tool_started`` event: tool call ``t`` (of tool ``name``) began."""

    t: int
    name: str


class ToolFinishedRecord(Record, kw_only=True):
    """A ``tool_finished`` event: tool call ``t`` (of tool ``name``) done, its output in a
    blob; ``nested``: it made journaled calls of its own (a sub-agent). The result's other
    fields follow, as ``ToolResult.fields`` gives them."""

    t: int
    name: str = ""  # a row without one reads as ""
    output: str
    nested: bool = False
    is_error: bool = False
    submitted: bool = False
    kind: str = "observation"
    outcome: str | UnsetType = UNSET

    @classmethod
    def of(cls, t: int, name: str, output: str, nested: bool, kept: ResultFields) -> Self:
        return cls(t=t, name=name, output=output, nested=nested, **structs.asdict(kept))

    def result(self, text: str) -> ToolResult:
        """The journaled result, its text ``text`` (the output's blob)."""
        from stayer.tools.base import ResultFields, ToolResult  # not for listing runs

        kept = ResultFields(self.is_error, self.submitted, self.kind, self.outcome)
        return ToolResult.of(text, kept)


class ToolDivergedRecord(Record):
    """A ``tool_diverged`` event: tool call ``t``, run again, gave another output (its
    blob) than the journaled one, which is kept."""

    t: int
    name: str
    output: str


class ObservedRecord(Record):
    """An ``observed`` event: the ``i``-th value the loop read from outside itself."""

    i: int
    value: Any  # whatever JSON value was read: a time, a fingerprint, a message document


class AgentEventRecord(Record):
    """An agent event (any kind not in ``JOURNAL_KINDS``): the ``i``-th, its payload in a
    blob."""

    i: int
    payload: str


class ModelFinishedRecord(Record, kw_only=True):
    """A ``model_finished`` event: call ``n`` answered, its message in a blob."""

    n: int
    message: str  # the reply's blob
    usage: Usage
    raw_usage: dict[str, Any]  # the provider's own usage object, as it sent it
    model: str
    latency_s: float
    stop_reason: str = ""
    service_tier: str | None = None


class ModelFailedRecord(Record):
    """A ``model_failed`` event: call ``n`` failed with ``error``."""

    n: int
    error: str


class RunFinishedRecord(Record):
    """A ``run_finished`` event: the run's final status, its report in a blob."""

    status: str
    result: str  # the report's blob


class SnapshotRecord(Record, kw_only=True):
    """A ``snapshot`` event: the workspace after step ``step`` (snapshot ``id``) and how
    many tool and model calls the run had made; a team's also each thread's tool calls and
    steps, by thread."""

    step: int
    id: str
    tools_done: int
    model_calls: int
    threads: dict[str, int] | UnsetType = UNSET
    thread_steps: dict[str, int] | UnsetType = UNSET


@dataclass
class CallRecord:
    """Model call number ``n`` of the run, over all its attempts."""

    attempts: int = 0  # model_started events: a started attempt with no outcome was lost
    digest: str = ""
    now: float | None = None  # the request's timestamp (the simulator's cache clock)
    finished: ModelFinishedRecord | None = None
    failed: ModelFailedRecord | None = None


@dataclass
class RunLog:
    run_id: str
    events: list[JournalEvent] = field(default_factory=list)  # the complete prefix
    torn: int = 0  # events dropped after it
    blobs: dict[str, bytes] = field(default_factory=dict)  # every blob the events refer to
    header: dict[str, Any] = field(default_factory=dict)
    calls: dict[int, CallRecord] = field(default_factory=dict)
    tools: dict[int, ToolFinishedRecord] = field(default_factory=dict)
    steps: dict[int, LedgerEntry] = field(default_factory=dict)  # step → its ledger entry
    lost: list[LostCall] = field(default_factory=list)  # model_lost records
    unknown: list[OutcomeUnknown] = field(default_factory=list)  # outcome_unknown records
    snapshots: list[SnapshotRecord] = field(default_factory=list)  # oldest first
    agent_events: dict[int, tuple[str, str]] = field(default_factory=dict)  # i → (kind, payload)
    observations: dict[int, Any] = field(default_factory=dict)  # i → value
    finished: RunFinishedRecord | None = None
    resumes: int = 0
    # A team run's threads: each one's events (tagged ``thread``), indexed as a log of its own.
    threads: dict[str, RunLog] = field(default_factory=dict)
    thread_starts: dict[str, str] = field(default_factory=dict)  # thread → id of its first message

    @property
    def next_seq(self) -> int:
        return len(self.events)


def load_log(store: Store, run_id: str) -> RunLog:
    """The run's journal up to any torn tail; JournalCorrupt if it is damaged before its
    last write."""
    log = RunLog(run_id)
    raw = store.events(run_id)
    wanted = {a for ev in raw if ev.damage is None for a in _refs(ev)}
    missing = store.missing_blobs(wanted)
    for i, ev in enumerate(raw):
        damage = _damage(store, log, ev, i, missing)
        if damage is not None:
            if any(later.at != raw[-1].at for later in raw[i:]):
                raise JournalCorrupt(
                    run_id, i, ev.kind if ev.seq == i else "missing", damage, len(raw)
                )
            break
        log.events.append(ev)
    log.torn = len(raw) - len(log.events)
    return log


def _refs(ev: JournalEvent) -> list[str]:
    try:
        return blob_refs(ev)
    except (KeyError, TypeError):
        return []  # a malformed record: reported as damaged when it is reached


def _damage(store: Store, log: RunLog, ev: JournalEvent, i: int, missing: set[str]) -> str | None:
    """Why event ``ev`` (the ``i``-th) cannot be used, or None once it is indexed."""
    if ev.seq != i:
        return f"event {i} is missing (the next one is numbered {ev.seq})"
    if ev.damage is not None:
        return ev.damage
    try:
        refs = blob_refs(ev)
        for a in refs:
            if a in missing:
                return f"blob {a[:12]} is missing from {store.location}"
            if a not in log.blobs:
                log.blobs[a] = store.get_blob(a)
        _index(log, ev)
    except BlobError as e:
        return str(e)
    except (KeyError, TypeError, ValueError) as e:
        return f"malformed {ev.kind} record ({type(e).__name__}: {e})"
    return None


def _index(log: RunLog, ev: JournalEvent) -> None:
    # The records' modules load with the first log read, not with every journal import
    # (``stayer runs`` lists rows without them).
    from stayer.ledger import LedgerEntry, LostCall, OutcomeUnknown
    from stayer.records import from_json

    d, kind = ev.data, ev.kind
    thread = d.get("thread")
    if thread is not None and kind != "thread_started":
        sub = log.threads.get(thread)
        if sub is None:
            sub = log.threads[thread] = RunLog(log.run_id, blobs=log.blobs, header=log.header)
        sub.events.append(ev)
        _index(sub, replace(ev, data={k: v for k, v in d.items() if k != "thread"}))
        return
    if kind == "thread_started":
        log.thread_starts[d["thread"]] = d["message"]
    elif kind == "run_created":
        log.header = d["header"]
    elif kind == "resumed":
        log.resumes += 1
    elif kind == "model_started":
        sent = from_json(d, ModelStartedRecord)
        rec = log.calls.setdefault(sent.n, CallRecord())
        rec.attempts += 1
        rec.digest, rec.now = sent.digest, sent.now
    elif kind == "model_finished":
        done = from_json(d, ModelFinishedRecord)
        log.calls.setdefault(done.n, CallRecord()).finished = done
    elif kind == "model_failed":
        failed = from_json(d, ModelFailedRecord)
        log.calls.setdefault(failed.n, CallRecord()).failed = failed
    elif kind == "model_lost":
        log.lost.append(from_json(d, LostCall))
    elif kind == "outcome_unknown":
        log.unknown.append(from_json(d, OutcomeUnknown))
    elif kind == "tool_finished":
        done_tool = from_json(d, ToolFinishedRecord)
        log.tools[done_tool.t] = done_tool
    elif kind == "step":
        log.steps[int(d["step"])] = from_json(d["entry"], LedgerEntry)
    elif kind == "snapshot":
        log.snapshots.append(from_json(d, SnapshotRecord))
    elif kind == "run_finished":
        log.finished = from_json(d, RunFinishedRecord)
    elif kind == "observed":
        seen = from_json(d, ObservedRecord)
        log.observations[seen.i] = seen.value
    elif kind not in JOURNAL_KINDS:
        event = from_json(d, AgentEventRecord)
        log.agent_events[event.i] = (kind, event.payload)

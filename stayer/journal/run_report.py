"""A run's ledger and totals, read from its journal (finished or not): ``JournalReport``,
what ``stayer report --json`` prints."""

from __future__ import annotations

import msgspec

from stayer.events import MessageReceived, MessageSent
from stayer.journal.lease import run_status
from stayer.journal.log import RunLog, load_log
from stayer.journal.session import lost_ledger_entries
from stayer.journal.store import RunRow, Store
from stayer.ledger import LedgerEntry, OutcomeUnknown, RunReport, ledger_order
from stayer.money import Usd, usd_sum
from stayer.records import Record, decode
from stayer.usage import Usage


class Totals(Record, kw_only=True):
    """What the run's journal adds up to: tokens, cost, calls (lost ones included)."""

    usage: Usage
    cost: str = msgspec.field(name="cost_usd")  # the total's text, or "unknown"
    model_calls: int
    lost_in_flight: int
    lost_in_flight_cost: str = msgspec.field(name="lost_in_flight_cost_usd")
    tool_calls: int
    outcome_unknown: int


class ReportedMessage(Record, kw_only=True):
    """A team run's message, with what reading it cost its receiver (None while unread)."""

    id: str
    sender: str
    to: str
    kind: str
    tokens: int
    read_cost: str | None = msgspec.field(name="read_cost_usd")
    content: str


class JournalFacts(Record, kw_only=True):
    """Where the journal is and what it holds."""

    store: str
    events: int
    torn_events: int
    resumes: int
    snapshots: int
    blobs: int
    blob_bytes: int


class JournalReport(Record, kw_only=True):
    """One run as its journal has it (``stayer report --json``, ``Session.report``)."""

    run_id: str
    task: str
    model: str
    status: str
    reward: float | None
    started: str
    updated: str
    steps: int
    ledger: list[LedgerEntry]
    totals: Totals
    outcome_unknown: list[OutcomeUnknown]
    messages: list[ReportedMessage]
    journal: JournalFacts


def run_report(store: Store, row: RunRow) -> JournalReport:
    """Per-step ledger (``lost_in_flight`` entries included) and totals for ``row``, and
    the calls whose outcome a crash lost (``outcome_unknown``)."""
    log = load_log(store, row.id)
    steps = [*log.steps.values(), *(e for t in log.threads.values() for e in t.steps.values())]
    ledger = journal_ledger(log)
    lost = [e for e in ledger if e.lost]
    unknown = journal_unknown(log)
    result = RunReport.read(log.blobs[log.finished.result]) if log.finished else None
    calls = sum(1 for t in (log, *log.threads.values()) for c in t.calls.values() if c.finished)
    return JournalReport(
        run_id=row.id,
        task=row.task,
        model=row.model,
        status=run_status(row),
        reward=result.reward if result else None,
        started=row.started,
        updated=row.updated,
        steps=len(steps),
        ledger=ledger,
        totals=Totals(
            usage=sum((e.usage for e in ledger), Usage()),
            cost=str(ledger_cost(ledger)),
            model_calls=calls + len(lost),
            lost_in_flight=len(lost),
            lost_in_flight_cost=str(usd_sum(e.cost.total for e in lost)),
            tool_calls=len(log.tools) + sum(len(t.tools) for t in log.threads.values()),
            outcome_unknown=len(unknown),
        ),
        outcome_unknown=unknown,
        messages=messages(log),
        journal=JournalFacts(
            store=store.location,
            events=len(log.events),
            torn_events=log.torn,
            resumes=log.resumes,
            snapshots=len(log.snapshots),
            blobs=len(log.blobs),
            blob_bytes=store.blob_bytes(log.blobs),
        ),
    )


def journal_ledger(log: RunLog) -> list[LedgerEntry]:
    """Every billed call the journal holds, finished run or not: each step of each agent
    (a team's threads too) and each attempt lost in flight (``lost_in_flight``), by step."""
    steps = [*log.steps.values(), *(e for t in log.threads.values() for e in t.steps.values())]
    return sorted(
        [
            *steps,
            *lost_ledger_entries(log.lost),
            *(lost for t in log.threads.values() for lost in lost_ledger_entries(t.lost)),
        ],
        key=ledger_order,
    )


def journal_unknown(log: RunLog) -> list[OutcomeUnknown]:
    """The run's ``outcome_unknown`` records (a team's threads' too), by step."""
    found = [*log.unknown, *(u for t in log.threads.values() for u in t.unknown)]
    return sorted(found, key=lambda u: u.step)


def ledger_cost(ledger: list[LedgerEntry]) -> Usd:
    """What a ledger adds up to (unknown if any entry's price is)."""
    cost = Usd()
    for e in ledger:
        cost += e.cost.total
        if e.compaction:
            cost += e.compaction.spent  # a summarising compaction is billed too
    return cost


def journal_spend(store: Store, run_id: str) -> Usd:
    """What the run has spent as its journal holds it (``journal_ledger``'s total);
    nothing for a run with no journal (it never started)."""
    if store.run(run_id) is None:
        return Usd()
    return ledger_cost(journal_ledger(load_log(store, run_id)))


def messages(log: RunLog) -> list[ReportedMessage]:
    """A team run's messages (``message.sent`` events), in the order sent, each with what
    reading it cost its receiver (from its ``message.received``; None while unread)."""
    sent: list[MessageSent] = []
    read: dict[str, MessageReceived] = {}
    for t in log.threads.values():
        for i in sorted(t.agent_events):
            kind, address = t.agent_events[i]
            if kind == "message.sent":
                sent.append(decode(log.blobs[address], MessageSent))
            elif kind == "message.received":
                received = decode(log.blobs[address], MessageReceived)
                read[received.id] = received
    return [
        ReportedMessage(
            id=m.id,
            sender=m.sender,
            to=m.to,
            kind=m.kind,
            tokens=m.tokens,
            read_cost=r.read_cost_usd if (r := read.get(m.id)) is not None else None,
            content=m.content,
        )
        for m in sent
    ]

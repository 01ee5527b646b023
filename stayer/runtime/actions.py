"""People in the loop: tool calls a person confirms, priced while they wait.

A run created with ``confirm_tools: ["bash"]`` has each such tool wrapped by a
``ConfirmedTool`` (outside the journal's own wrapper). The n-th confirmable call of the run
is action ``act-n``: with no decision yet, the wrapper records the call as pending and
raises ``RunSuspended``, which ends the worker's execution of the run: the journal keeps
everything up to the call, the worker gives the run up, and no slot and no sandbox process
is held while the person thinks. A decision (``POST /v1/runs/{id}/actions``) queues the
run again; a worker resumes it from the journal, the replayed calls meet their recorded
decisions, and the approved call runs (a rejected one returns the person's reason to the
model as an error).

Details and rationale: docs/notes.md, ``stayer/runtime/actions.py``.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any, ClassVar

import msgspec

from stayer.errors import OrderlyStop
from stayer.journal import load_log, lost_ledger_entries
from stayer.journal.blobs import digest
from stayer.journal.codec import canonical
from stayer.journal.lease import new_owner, owner_is_dead
from stayer.journal.run_report import journal_unknown
from stayer.journal.sql import SqlStore, record_of, utc_now
from stayer.journal.store import RunUpdate
from stayer.ledger import RunReport, TokenTotals
from stayer.models.base import Model
from stayer.models.caching import miss_premium
from stayer.money import MTOK, Usd, usd_sum
from stayer.pricing import PriceBook
from stayer.records import Record, decode, encode
from stayer.routing.router import rules_for
from stayer.tools.base import Tool, ToolContext, ToolResult
from stayer.usage import Usage

PENDING, APPROVED, REJECTED = "pending", "approved", "rejected"

_DDL = """CREATE TABLE IF NOT EXISTS stayer_actions (
    run_id TEXT NOT NULL,
    n INTEGER NOT NULL,
    tool TEXT NOT NULL,
    arguments TEXT NOT NULL,
    status TEXT NOT NULL,
    message TEXT,
    requested_at TEXT NOT NULL,
    decided_at TEXT,
    price TEXT,
    PRIMARY KEY (run_id, n)
)"""


class RunSuspended(OrderlyStop):
    """A confirmable call has no decision yet: the run stops here until it has one."""

    def __init__(self, action: Action) -> None:
        super().__init__(f"awaiting a decision on {action.call_id}")
        self.action = action


class WaitCost(Record, kw_only=True):
    """What waiting for a person costs (``pause_price``): the prompt cache of
    ``context_tokens`` expires at ``cache_expires_at``; a decision after it makes the next
    call write them again, at ``cost_if_cache_expires_usd`` ("unknown" without prices)."""

    context_tokens: int
    cache_ttl_s: float
    cache_expires_at: str
    cost_if_expired: str = msgspec.field(name="cost_if_cache_expires_usd")


class ActionView(Record, kw_only=True):
    """A confirmable call as the API shows it (``pending_action``, ``GET .../actions``)
    and the journal's ``requires_action`` event holds it. ``arguments``: the model's."""

    call_id: str
    tool: str
    arguments: dict[str, Any]
    status: str
    message: str | None
    requested_at: str
    decided_at: str | None
    wait_cost: WaitCost | None


class JournalNote(Record, kw_only=True):
    """An event the runtime writes to the journal of a run no process is running: of
    kind ``kind``, its fields the payload."""

    kind: ClassVar[str]


class ActionRequired(ActionView, JournalNote, kw_only=True):
    """The ``requires_action`` note: the action, as the API shows it."""

    kind: ClassVar[str] = "requires_action"


class Suspended(JournalNote, kw_only=True, omit_defaults=True):
    """The ``suspended`` note: the run stopped for now (``status``: why it waits)."""

    kind: ClassVar[str] = "suspended"
    status: str
    reason: str | None = None
    detail: str | None = None


class RunFinishedNote(JournalNote, kw_only=True):
    """The ``run_finished`` note: ``result``, the address of the run's report blob."""

    kind: ClassVar[str] = "run_finished"
    status: str
    result: str


@dataclass
class Action:
    run_id: str
    n: int
    tool: str
    arguments: dict[str, Any]
    status: str
    message: str | None = None
    requested_at: str = ""
    decided_at: str | None = None
    price: WaitCost | None = None

    @property
    def call_id(self) -> str:
        return f"act-{self.n}"

    def view(self) -> ActionView:
        return ActionView(
            call_id=self.call_id,
            tool=self.tool,
            arguments=self.arguments,
            status=self.status,
            message=self.message,
            requested_at=self.requested_at,
            decided_at=self.decided_at,
            wait_cost=self.price,
        )

    def note(self) -> ActionRequired:
        """The journal's ``requires_action`` note of it."""
        return ActionRequired(**msgspec.structs.asdict(self.view()))


_COLUMNS = "run_id, n, tool, arguments, status, message, requested_at, decided_at, price"
_FIELDS = _COLUMNS.split(", ")  # Action's, in the same order


class Actions:
    """The ``stayer_actions`` table in the journal's database."""

    def __init__(self, store: SqlStore) -> None:
        self.store = store
        store.create_tables([_DDL])

    def _rows(self, where: str, params: tuple[Any, ...]) -> list[Action]:
        rows = self.store._read(f"SELECT {_COLUMNS} FROM stayer_actions {where}", params)
        return [
            record_of(
                Action,
                _FIELDS,
                r,
                n=int,
                arguments=json.loads,
                price=lambda v: decode(v, WaitCost) if v else None,
            )
            for r in rows
        ]

    def get(self, run_id: str, n: int) -> Action | None:
        found = self._rows("WHERE run_id = ? AND n = ?", (run_id, n))
        return found[0] if found else None

    def of_run(self, run_id: str) -> list[Action]:
        return self._rows("WHERE run_id = ? ORDER BY n", (run_id,))

    def pending(self, run_id: str) -> Action | None:
        found = self._rows("WHERE run_id = ? AND status = 'pending' ORDER BY n", (run_id,))
        return found[0] if found else None

    def request(self, run_id: str, n: int, tool: str, arguments: dict[str, Any]) -> Action:
        """Record call ``n`` as awaiting a decision (again: a no-op)."""
        with self.store._tx() as cur:
            if not cur.execute(
                "SELECT 1 FROM stayer_actions WHERE run_id = ? AND n = ?", (run_id, n)
            ).fetchone():
                cur.execute(
                    "INSERT INTO stayer_actions (run_id, n, tool, arguments, status, requested_at) VALUES (?, ?, ?, ?, ?, ?)",
                    (run_id, n, tool, json.dumps(arguments), PENDING, utc_now()),
                )
        action = self.get(run_id, n)
        assert action is not None
        return action

    def set_price(self, run_id: str, n: int, price: WaitCost) -> None:
        with self.store._tx() as cur:
            cur.execute(
                "UPDATE stayer_actions SET price = ? WHERE run_id = ? AND n = ?",
                (encode(price).decode(), run_id, n),
            )

    def decide(self, run_id: str, n: int, approve: bool, message: str | None) -> bool:
        """Record a person's decision on a pending call; False if it was not pending."""
        with self.store._tx() as cur:
            cur.execute(
                "UPDATE stayer_actions SET status = ?, message = ?, decided_at = ? "
                "WHERE run_id = ? AND n = ? AND status = 'pending'",
                (APPROVED if approve else REJECTED, message, utc_now(), run_id, n),
            )
            return cur.rowcount == 1


class ConfirmedTool:
    """``inner``, run only once a person approved the call (see the module docstring)."""

    def __init__(self, inner: Tool, gate: Gate) -> None:
        self.inner = inner
        self.gate = gate
        self.spec = inner.spec

    async def __call__(self, args: dict[str, Any], ctx: ToolContext) -> ToolResult:
        n = self.gate.next_call()
        action = self.gate.actions.get(self.gate.run_id, n)
        if action is None or action.status == PENDING:
            raise RunSuspended(self.gate.actions.request(self.gate.run_id, n, self.spec.name, args))
        if action.status == REJECTED:
            why = f": {action.message}" if action.message else ""
            return ToolResult(f"{self.spec.name}: a person rejected this call{why}", is_error=True)
        result = await self.inner(args, ctx)
        if action.message:
            # ToolResult is frozen: a copy carries the person's words.
            result = replace(
                result,
                output=result.output
                + f"\n[a person approved this call and said: {action.message}]",
            )
        return result


class Gate:
    """Wraps the tools named in ``confirm`` with ``ConfirmedTool``; counts their calls in
    the order the loop makes them, which replay repeats exactly."""

    def __init__(self, actions: Actions, run_id: str, confirm: Sequence[str]) -> None:
        self.actions = actions
        self.run_id = run_id
        self.confirm = frozenset(confirm)
        self._n = 0

    def next_call(self) -> int:
        self._n += 1
        return self._n

    def __call__(self, tools: list[Tool]) -> list[Tool]:
        return [ConfirmedTool(t, self) if t.spec.name in self.confirm else t for t in tools]


def pause_price(
    model: Model, prices: PriceBook, context_tokens: int, now: datetime | None = None
) -> WaitCost:
    """What waiting costs: the prompt cache expires ``cache_ttl_s`` after the last call;
    a decision after ``cache_expires_at`` makes the next call write ``context_tokens`` again
    instead of reading them (``cost_if_cache_expires_usd``, "unknown" without prices)."""
    rules = rules_for(model)
    now = now or datetime.now(UTC)
    rates = prices.rates(model.model_id, model.provider, None, context_tokens)
    extra = None if rates is None else Decimal(context_tokens) * miss_premium(rules, rates) / MTOK
    return WaitCost(
        context_tokens=context_tokens,
        cache_ttl_s=rules.ttl_s,
        cache_expires_at=(now + timedelta(seconds=rules.ttl_s)).isoformat(timespec="seconds"),
        cost_if_expired=str(Usd(extra)),
    )


def last_context_tokens(store: SqlStore, run_id: str) -> int:
    """The prompt the run's next call re-sends: the last call's prompt and its reply."""
    log = load_log(store, run_id)
    finished = [c.finished for _, c in sorted(log.calls.items()) if c.finished is not None]
    if not finished:
        return 0
    usage = finished[-1].usage
    return usage.input_tokens + usage.output_tokens


def note_in_journal(
    store: SqlStore,
    run_id: str,
    events: list[JournalNote],
    blobs: dict[str, bytes] | None = None,
    update: RunUpdate | None = None,
) -> None:
    """Append events to a run that no process is running (the runtime's notes, or its
    final status), under a lease of our own for the one write."""
    owner = new_owner()
    holder = store.claim(run_id, owner, 30.0, owner_is_dead)
    if holder is not None:
        raise RuntimeError(f"run {run_id} is being run by another process ({holder})")
    try:
        tail = store._read("SELECT MAX(seq) FROM stayer_events WHERE run_id = ?", (run_id,))
        first = 0 if not tail or tail[0][0] is None else int(tail[0][0]) + 1
        store.append(run_id, owner, first, [(e.kind, e) for e in events], blobs or {}, update)
    finally:
        store.release(run_id, owner)


def close_journal(store: SqlStore, run_id: str, status: str, stop_reason: str) -> RunReport:
    """Finish a run no process is running (cancelled while it waited): its result carries
    every step the journal holds and every lost call, so all it spent is accounted."""
    log = load_log(store, run_id)
    ledger = [log.steps[s] for s in sorted(log.steps)] + lost_ledger_entries(log.lost)
    usage = sum((e.usage for e in ledger), Usage())
    header = log.header
    report = RunReport(
        run_id=run_id,
        task=header.get("task") or "",
        model=header.get("model") or "",
        status=status,
        stop_reason=stop_reason,
        steps=max(log.steps, default=0),
        usage=TokenTotals.of(usage),
        cost_usd=str(usd_sum(e.cost.total for e in ledger)),
        ledger=ledger,
        finished=datetime.now(UTC).isoformat(),
    )
    if unknown := journal_unknown(log):
        report.outcome_unknown = unknown
    raw = canonical(report.to_json())
    address = digest(raw)
    note_in_journal(
        store,
        run_id,
        [RunFinishedNote(status=status, result=address)],
        {address: raw},
        RunUpdate(status=status, steps=report.steps, cost=report.cost_usd),
    )
    return report

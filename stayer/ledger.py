"""The ledger: one entry per model call of a run. An entry is the one shape of a step that
the journal stores, reports total and ``--json`` prints; its JSON field names are a
contract, and ``stayer.records`` alone turns it into JSON and back.

``LedgerEntry.made`` is a step the loop (or the gateway) made; ``LostCall.entry`` an
attempt lost in flight at a crash (billed by the provider, its reply never seen); a ``cut_short``
entry the step a time limit stopped. An ``OutcomeUnknown`` is a tool call of a step whose
outcome was lost at a crash (its ``ToolCallEntry`` says ``outcome: unknown``). All share the one record, so totals and reports treat
them alike. A field a kind never has is ``UNSET`` and absent from its JSON, so an entry
read back (an older journal's too) is written out with exactly the fields it had.

``RunReport`` is a finished run (``result.json``, ``stayer run --json``, the journal's
result and the runtime's): its ledger, totals, breaker trips and verdict, as records.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from decimal import Decimal
from typing import Any

import msgspec
from msgspec import UNSET, UnsetType

from stayer.context.compactor import Compacted, ToolsTaken
from stayer.context.forensics import CacheBreak
from stayer.guard.attribution import AgentCost
from stayer.guard.breakers import ToolCallRecord, Trip
from stayer.money import Usd
from stayer.pricing import Cost
from stayer.records import Record, decode, from_json, to_json
from stayer.routing.router import RouteRecord
from stayer.tokens import PromptEstimate
from stayer.usage import Usage


class ToolCallEntry(Record):
    """One tool call of a step: which, and whether it failed."""

    id: str
    name: str
    is_error: bool
    # A command's exit status, when the tool ran one (absent from older journals).
    exit_code: int | None | UnsetType = UNSET
    # "unknown": a side-effecting call whose result was lost at a crash and that was not
    # sent again (``OutcomeUnknown``); absent otherwise.
    outcome: str | UnsetType = UNSET

    @property
    def failed(self) -> bool:
        """Failed as the breakers count it: an error, or a command that exited non-zero."""
        code = self.exit_code if isinstance(self.exit_code, int) else None
        return ToolCallRecord(self.name, "", self.is_error, code).failed


class BreakerTrip(Record, kw_only=True):
    """A breaker trip decided at a step, with the agent whose guard decided it."""

    agent: str | UnsetType = UNSET
    reason: str
    detail: str
    step: int
    action: str
    soft: bool

    @classmethod
    def of(cls, trip: Trip, agent: str | UnsetType = UNSET) -> BreakerTrip:
        return cls(agent=agent, **asdict(trip))


class PromptBound(Record, dict=True):
    """What the budget expected the provider to count for the prompt (``tokens``) and the
    bound it reserved for (``upper``); the usage's input_tokens is what it did count.
    ``exact``: the provider counted it itself (kept in memory, not in the JSON)."""

    tokens: int
    upper: int

    @classmethod
    def of(cls, estimate: PromptEstimate) -> PromptBound:
        bound = cls(tokens=estimate.tokens, upper=estimate.upper)
        bound.__dict__["exact"] = estimate.exact
        return bound

    @property
    def exact(self) -> bool:
        return bool(self.__dict__.get("exact", False))


class ModelAlias(Record):
    """A gateway call whose model was an alias: the model asked for and the one served."""

    asked: str
    served: str


class FailedAttempt(Record):
    """An upstream a gateway call failed over from: nothing billed there."""

    upstream: str
    cost: Usd = msgspec.field(name="cost_usd")
    status: int | UnsetType = UNSET
    error: str | UnsetType = UNSET


class AutoCache(Record):
    """The cache breakpoints ``--auto-cache`` added, and the call priced without them."""

    breakpoints: int
    cost_without: Usd = msgspec.field(name="cost_without_usd")
    saved: Usd = msgspec.field(name="saved_usd")


class LedgerEntry(Record, kw_only=True):
    agent: str = "main"  # the agent's path in the tree: main, main/sub-1, ...
    step: int
    kind: str | UnsetType = UNSET  # lost_in_flight, cut_short; absent for a step made
    model: str
    model_calls: int | UnsetType = UNSET  # cut_short: the calls answered in the step
    usage: Usage
    # In JSON the total's text (or "unknown"); read back, a cost knows only its total
    # and the entry's model.
    cost: Cost = msgspec.field(name="cost_usd")
    estimated: bool | UnsetType = UNSET  # lost_in_flight: usage and cost estimated
    cache_hit_ratio: float = 0.0
    context_tokens: int | None = None
    latency_s: float | None = None
    tool_calls: list[ToolCallEntry] = msgspec.field(default_factory=list)
    tool_errors: int = 0
    cache_break: CacheBreak | None = None
    compaction: Compacted | None | UnsetType = UNSET
    # Tool lists taken at a call of the step before (a compaction's are in its record).
    tools_changed: ToolsTaken | UnsetType = UNSET
    breakers: list[BreakerTrip] | UnsetType = UNSET
    route: RouteRecord | None | UnsetType = UNSET  # a model switch, or one weighed and declined
    prompt_estimate: PromptBound | None | UnsetType = UNSET
    # A gateway's call: what was charged against the cap, whether the reply was read
    # whole, and the output bound the call was sent with.
    charged_usd: Usd | None | UnsetType = UNSET
    complete: bool | UnsetType = UNSET
    max_tokens: int | None | UnsetType = UNSET
    # A gateway's savings: an alias served, the upstream that answered after a failover
    # (and the attempts before it), the breakpoints --auto-cache added.
    alias: ModelAlias | UnsetType = UNSET
    upstream: str | UnsetType = UNSET
    failed_attempts: list[FailedAttempt] | UnsetType = UNSET
    auto_cache: AutoCache | UnsetType = UNSET

    def __post_init__(self) -> None:
        if not self.cost.model_ref:  # read back from JSON: the cost's model is the entry's
            self.cost = Cost(self.cost.total, None, None, self.model)

    @classmethod
    def made(
        cls,
        *,
        step: int,
        model: str,
        usage: Usage,
        cost: Cost,
        context_tokens: int,
        latency_s: float,
        tool_calls: Sequence[ToolCallEntry] = (),
        cache_break: CacheBreak | None = None,
        compaction: Compacted | None = None,
        agent: str = "main",
        breakers: Iterable[BreakerTrip] = (),
        route: RouteRecord | None = None,
        prompt_estimate: PromptEstimate | None = None,
    ) -> LedgerEntry:
        """A step made: the hit ratio and the failed calls derived, figures rounded."""
        return cls(
            agent=agent,
            step=step,
            model=model,
            usage=usage,
            cost=cost,
            cache_hit_ratio=round(usage.cache_hit_ratio, 4),
            context_tokens=context_tokens,
            latency_s=round(latency_s, 4),
            tool_calls=list(tool_calls),
            tool_errors=sum(1 for c in tool_calls if c.failed),
            cache_break=cache_break,
            compaction=compaction,
            breakers=list(breakers),
            route=route,
            prompt_estimate=None if prompt_estimate is None else PromptBound.of(prompt_estimate),
        )

    def to_dict(self) -> dict[str, Any]:
        """The entry's JSON document (``stayer.records.to_json``)."""
        return to_json(self)

    @property
    def trips(self) -> list[BreakerTrip]:
        """The breaker trips decided at this step (none for an entry that has no field)."""
        return self.breakers or []

    @property
    def lost(self) -> bool:
        return self.kind == "lost_in_flight"


class LostCall(Record, kw_only=True):
    """A ``model_lost`` record: a call attempt in flight at a crash, billed by the provider,
    its reply never seen; its usage and cost estimated as the re-issued call's."""

    agent: str = "main"  # a team's thread whose call it was
    n: int = 0  # the call's index in its journal
    attempt: int = 0
    step: int
    model: str
    usage: Usage
    cost: Cost = msgspec.field(name="cost_usd")
    estimated: bool = True

    def entry(self) -> LedgerEntry:
        """The attempt as a ledger entry (``kind: lost_in_flight``)."""
        return LedgerEntry(
            agent=self.agent,
            step=self.step,
            kind="lost_in_flight",
            model=self.model,
            usage=self.usage,
            cost=self.cost,
            estimated=True,
            cache_hit_ratio=round(self.usage.cache_hit_ratio, 4),
        )


class OutcomeUnknown(Record, kw_only=True):
    """An ``outcome_unknown`` record: a side-effecting, non-idempotent tool call that was
    in flight at a crash, its result lost; it was not sent again, and the agent was told to
    check what it did (``stayer.journal.effects``). Written to the journal once per call."""

    agent: str = "main"
    step: int
    tool: str
    call_id: str
    idempotency_key: str
    sent_at: str  # when its intent was committed (UTC, ISO 8601)


def ledger_order(entry: LedgerEntry) -> tuple[int, bool]:
    """The ledger's order: by step, an attempt lost in flight before the step made."""
    return entry.step, not entry.lost


@dataclass
class RunResult:
    status: str  # running; then submitted, budget_exhausted, error (``stayer.errors.RunEnded``)
    steps: int = 0
    usage: Usage = field(default_factory=Usage)
    cost_usd: Decimal | None = Decimal(0)  # None: some step's price is unknown
    ledger: list[LedgerEntry] = field(default_factory=list)
    summary: str = ""
    error: str | None = None
    stop_reason: str = ""
    peak_context_tokens: int = 0
    breakers: list[BreakerTrip] = field(default_factory=list)  # every agent's trips

    def add_cost(self, amount: Decimal | None) -> None:
        """Unknown stays unknown: one unpriced call makes the total unknown, never 0."""
        self.cost_usd = (Usd(self.cost_usd) + amount).amount

    def adopt(self, child: RunResult) -> None:
        """Roll a sub-agent's usage, cost and ledger (entries keep its path) into this run."""
        self.usage += child.usage
        self.add_cost(child.cost_usd)
        self.ledger.extend(child.ledger)


class TokenTotals(msgspec.Struct, kw_only=True):
    """A run's tokens, every call of every agent (``usage`` of the result)."""

    input_tokens: int = 0
    cache_read_tokens: int = 0
    cache_write_tokens: int = 0
    cache_write_5m_tokens: int = 0
    cache_write_1h_tokens: int = 0
    output_tokens: int = 0
    reasoning_tokens: int = 0

    @classmethod
    def of(cls, usage: Usage) -> TokenTotals:
        """``usage``'s counts (summed over a run's calls), as the report carries them."""
        return cls(**usage.to_dict())


class VerifierReport(Record, kw_only=True):
    """What the task's tests said (``verifier`` of the result; ``Verdict.to_dict``)."""

    outcome: str
    infrastructure: str | None = None
    exit_code: int | None = None
    timed_out: bool = False
    error: str | None = None
    voided: str | None = None
    output_tail: str = ""


class RunReport(Record, kw_only=True, eq=False):
    """A finished run: what ``execute`` returns, ``result.json`` holds and ``stayer run
    --json`` prints (``to_json``: the fields in this order; ``rewards`` and ``verifier`` only
    when the verifier ran). Read its attributes; ``report["key"]`` reads the JSON form, for
    callers that held the document. ``read`` takes a stored document back."""

    run_id: str = ""
    task: str = ""
    task_path: str = ""
    model: str = ""
    status: str = "error"
    reward: float | None = None
    steps: int = 0
    usage: TokenTotals = msgspec.field(default_factory=TokenTotals)
    cost_usd: str = "0"  # the total's text, or "unknown"
    stop_reason: str | None = None
    stop_detail: str | None = None
    policy: str = ""
    peak_context_tokens: int = 0
    compactions: int = 0
    summary: str | None = None
    breakers: list[BreakerTrip] = msgspec.field(default_factory=list)
    agents: list[AgentCost] = msgspec.field(default_factory=list)
    error: str | None = None
    ledger: list[LedgerEntry] = msgspec.field(default_factory=list)
    started: str = ""
    finished: str = ""
    run_dir: str = ""
    tokenizer: str | None = None
    rewards: dict[str, float] | UnsetType = UNSET
    verifier: VerifierReport | UnsetType = UNSET
    mcp_tools: str | UnsetType = UNSET  # with MCP servers: eager or lazy
    # Side-effecting calls whose outcome a crash lost: only when there were any.
    outcome_unknown: list[OutcomeUnknown] | UnsetType = UNSET

    def to_json(self) -> dict[str, Any]:
        """The JSON document (``result.json``, ``--json``, the journal's result)."""
        return to_json(self)

    @classmethod
    def read(cls, doc: dict[str, Any] | bytes) -> RunReport:
        """A stored document (its builtins or its JSON bytes) as a report."""
        return decode(doc, cls) if isinstance(doc, bytes) else from_json(doc, cls)

    @property
    def spent(self) -> Usd:
        """What the run spent (unknown when a price is)."""
        return Usd.parse(self.cost_usd)

    def __iter__(self) -> Iterator[str]:
        return iter(self.to_json())

    def keys(self) -> Any:
        return self.to_json().keys()

    def __contains__(self, key: object) -> bool:
        return key in self.to_json()

    def get(self, key: str, default: Any = None) -> Any:
        return self.to_json().get(key, default)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, dict):
            return self.to_json() == other
        return isinstance(other, RunReport) and self.to_json() == other.to_json()

    __hash__ = None  # type: ignore[assignment]

"""Why a session cost what it did: prices, cache breaks, context growth, costliest calls.

Everything here works on :class:`~stayer.audit.calls.Call` records, so it is the same for
every log format. A session is analysed chain by chain (its own agent and each sub-agent),
because each chain has its own prompt and therefore its own cache.

Details and rationale: docs/notes.md, ``stayer/audit/analysis.py``.
"""

from __future__ import annotations

import builtins
import heapq
import time
from collections.abc import Iterable
from decimal import Decimal
from functools import cache
from typing import Any, TypeVar

import msgspec
import orjson
from msgspec import UNSET, UnsetType

from stayer.audit.calls import MAIN_CHAIN, Call, ImportedSession, LoggedTotal, same_cost
from stayer.audit.costing import PER_CURRENCY, CallPricer, Units, usd
from stayer.errors import ConfigError
from stayer.models.caching import CacheRules, cache_rules, cached_length, provider_of
from stayer.money import MTOK, UNKNOWN, amount_json
from stayer.pricing import Rates
from stayer.records import Record
from stayer.usage import Usage

MIN_LOST_TOKENS = 1024
COSTLIEST = 5
_FALLBACK_RULES = CacheRules("automatic", 1024)


#: A Decimal USD amount as the JSON string every stayer command uses.
money = amount_json


def iso(ts: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(ts))


def doc_json(doc: Record) -> Any:
    """The JSON builtins of the audit document or a part of it: the one place they are
    made. A session encoded ahead (an ``orjson.Fragment``) stays as it is."""
    return msgspec.to_builtins(doc, builtin_types=(orjson.Fragment,))


# The report and its parts are msgspec Structs: workers send thousands of them back to the
# caller as MessagePack (stayer.audit.engine), and a Struct class is made in a tenth of a
# dataclass's time, at every start of the command. Each has a record of the document
# (``…Doc``, made by its ``doc()``), which ``doc_json`` turns into JSON.


class Tokens(Record):
    """Tokens by kind (those of ``stayer.usage.Usage``)."""

    input_tokens: int = 0
    cache_read_tokens: int = 0
    cache_write_5m_tokens: int = 0
    cache_write_1h_tokens: int = 0
    output_tokens: int = 0
    reasoning_tokens: int = 0


class UsageDoc(Tokens, kw_only=True):
    """Tokens in the document: by kind, cache writes of both lifetimes, and the uncached
    remainder of the input."""

    cache_write_tokens: int
    uncached_input_tokens: int


class TallyDoc(Record, kw_only=True):
    """A tally in the document. What it is a tally of (a model, a group, a sub-agent, a
    session and its head) comes first there, so it is declared here, left out (UNSET) where
    the tally stands alone; each subclass names ``label``."""

    label: str | UnsetType = UNSET
    project: str | UnsetType = UNSET
    source: str | UnsetType = UNSET
    first_ts: str | UnsetType = UNSET
    last_ts: str | UnsetType = UNSET
    approximate_ts: bool | UnsetType = UNSET
    calls: int
    usage: UsageDoc
    cost: str = msgspec.field(name="cost_usd")  # "unknown" when any call is unpriced
    cost_priced: str = msgspec.field(name="cost_usd_priced")
    unpriced_calls: int
    unpriced_models: list[str]
    cache_hit_ratio: float


class ModelTallyDoc(TallyDoc, kw_only=True):
    label: str = msgspec.field(name="model")


class GroupDoc(TallyDoc, kw_only=True):
    label: str = msgspec.field(name="key")


class SubagentDoc(TallyDoc, kw_only=True):
    label: str = msgspec.field(name="id")


D = TypeVar("D", bound=TallyDoc)


class Tally(Tokens):
    """Calls, tokens by kind and money of a set of calls; unpriced calls are kept apart."""

    calls: int = 0
    cost_units: Units = 0  # of the priced calls (stayer.audit.costing.UNIT_EXPONENT)
    unpriced_calls: int = 0
    unpriced_models: set[str] = msgspec.field(default_factory=set)

    def add(self, u: Usage, model: str, units: Units | None) -> None:
        """One call of ``model`` that used ``u`` and cost ``units`` (None: unknown)."""
        self.calls += 1
        self._add_tokens(u)
        if units is None:
            self.unpriced_calls += 1
            self.unpriced_models.add(model)
        else:
            self.cost_units += units

    def merge(self, o: Tally) -> None:
        self.calls += o.calls
        self._add_tokens(o)
        self.cost_units += o.cost_units
        self.unpriced_calls += o.unpriced_calls
        self.unpriced_models |= o.unpriced_models

    def _add_tokens(self, t: Usage | Tally) -> None:
        # Field by field rather than ``Usage.__add__``: this runs for every call of every
        # session audited.
        self.input_tokens += t.input_tokens
        self.cache_read_tokens += t.cache_read_tokens
        self.cache_write_5m_tokens += t.cache_write_5m_tokens
        self.cache_write_1h_tokens += t.cache_write_1h_tokens
        self.output_tokens += t.output_tokens
        self.reasoning_tokens += t.reasoning_tokens

    @property
    def usage(self) -> Usage:
        return Usage(
            self.input_tokens,
            self.cache_read_tokens,
            self.cache_write_5m_tokens,
            self.cache_write_1h_tokens,
            self.output_tokens,
            self.reasoning_tokens,
        )

    @property
    def cost_priced(self) -> Decimal:
        """What the priced calls cost."""
        return usd(self.cost_units)

    @property
    def cost(self) -> Decimal | None:
        """The total, or None when any call's price is unknown (a partial sum is not a total)."""
        return None if self.unpriced_calls else self.cost_priced

    @property
    def cache_hit_ratio(self) -> float:
        return round(self.cache_read_tokens / self.input_tokens, 4) if self.input_tokens else 0.0

    def doc(self, kind: type[D], **of: Any) -> D:
        """The tally as a ``kind`` of the document, of what ``of`` names (its fields)."""
        written = self.cache_write_5m_tokens + self.cache_write_1h_tokens
        priced = money(self.cost_priced)  # (once: it is also the total when all are priced)
        return kind(
            **of,
            calls=self.calls,
            usage=UsageDoc(
                input_tokens=self.input_tokens,
                cache_read_tokens=self.cache_read_tokens,
                cache_write_5m_tokens=self.cache_write_5m_tokens,
                cache_write_1h_tokens=self.cache_write_1h_tokens,
                output_tokens=self.output_tokens,
                reasoning_tokens=self.reasoning_tokens,
                cache_write_tokens=written,
                uncached_input_tokens=self.input_tokens - self.cache_read_tokens - written,
            ),
            cost=UNKNOWN if self.unpriced_calls else priced,
            cost_priced=priced,
            unpriced_calls=self.unpriced_calls,
            unpriced_models=sorted(self.unpriced_models),
            cache_hit_ratio=self.cache_hit_ratio,
        )


class CallDoc(Record, kw_only=True):
    """A call in the document; ``session`` where the list spans sessions."""

    session: str | UnsetType = UNSET
    call: int
    chain: str  # "main" for the session's own agent
    ts: str


class CacheBreakDoc(CallDoc, kw_only=True):
    reason: str
    lost_tokens: int
    gap_s: float | None
    extra_cost: str = msgspec.field(name="extra_cost_usd")


class CallCostDoc(CallDoc, kw_only=True):
    model: str
    context_tokens: int
    cost: str = msgspec.field(name="cost_usd")


C = TypeVar("C", bound=CallDoc)


class CallAt(msgspec.Struct):
    """Which call of a session a finding is about: its place, its chain and its time."""

    call: int  # 1-based position in the session's calls, in time order
    chain: str
    ts: float

    def _doc(self, kind: type[C], **rest: Any) -> C:
        return kind(call=self.call, chain=self.chain or "main", ts=iso(self.ts), **rest)


class CacheBreakAt(CallAt):
    reason: str
    lost_tokens: int  # reusable prompt tokens that were not read from cache
    gap_s: float | None
    extra_cost: Decimal | None

    def doc(self) -> CacheBreakDoc:
        return self._doc(
            CacheBreakDoc,
            reason=self.reason,
            lost_tokens=self.lost_tokens,
            gap_s=None if self.gap_s is None else round(self.gap_s, 1),
            extra_cost=money(self.extra_cost),
        )


class CallCost(CallAt):
    model: str
    context_tokens: int
    cost: Decimal

    def doc(self, session: str | UnsetType = UNSET) -> CallCostDoc:
        return self._doc(
            CallCostDoc,
            session=session,
            model=self.model,
            context_tokens=self.context_tokens,
            cost=money(self.cost),
        )


class ContextGrowth(Record):
    """How a session's prompt grew, call by call (rounded as the document has it)."""

    calls: int
    first_tokens: int
    last_tokens: int
    peak_tokens: int
    # fitted slope, tokens per call
    growth_per_call: float = msgspec.field(name="growth_per_call_tokens")
    fit_r2: float
    cumulative_input_tokens: int
    growth_share: float  # share of cumulative input due to the growth term
    quadratic: bool


def context_growth(contexts: list[int]) -> ContextGrowth | None:
    """Least-squares line through (call index, context size); see the module docstring."""
    n = len(contexts)
    if n == 0:
        return None
    total = sum(contexts)
    slope, r2 = 0.0, 0.0
    if n >= 2:
        mean_x, mean_y = (n - 1) / 2, total / n
        sxx = sum((i - mean_x) ** 2 for i in range(n))
        sxy = sum((i - mean_x) * (y - mean_y) for i, y in enumerate(contexts))
        syy = sum((y - mean_y) ** 2 for y in contexts)
        slope = sxy / sxx
        r2 = (sxy * sxy) / (sxx * syy) if syy else 0.0
    share = max(slope, 0.0) * n * (n - 1) / 2 / total if total else 0.0
    return ContextGrowth(
        calls=n,
        first_tokens=contexts[0],
        last_tokens=contexts[-1],
        peak_tokens=max(contexts),
        growth_per_call=round(slope, 1),
        fit_r2=round(r2, 4),
        cumulative_input_tokens=total,
        growth_share=round(min(share, 1.0), 4),
        quadratic=n >= 3 and slope > 0 and r2 >= 0.5 and share >= 0.2,
    )


class CallSeries(msgspec.Struct):
    """Per-call values for plots, in session order."""

    ts: list[float] = msgspec.field(default_factory=list)
    chain: list[str] = msgspec.field(default_factory=list)
    context: list[int] = msgspec.field(default_factory=list)
    cumulative_cost: list[float] = msgspec.field(default_factory=list)
    hit_ratio: list[float] = msgspec.field(default_factory=list)


class Reference(Record):
    """A total the log records of itself, next to the audit's count of the same."""

    what: str  # calls, input_tokens, cache_read_tokens, cache_write_tokens, output_tokens, cost_usd
    field: str  # where the log keeps it
    logged: int | str
    audited: int | str
    matches: bool
    why: str  # why they differ ("" when they match)


class SessionReport(msgspec.Struct):
    source: str
    id: str
    project: str
    files: int
    bytes: int
    skipped_lines: int
    first_ts: float = 0.0
    last_ts: float = 0.0
    approximate_ts: bool = False
    total: Tally = msgspec.field(default_factory=Tally)
    by_model: dict[str, Tally] = msgspec.field(default_factory=dict)
    by_day: dict[str, Tally] = msgspec.field(default_factory=dict)
    by_chain: dict[str, Tally] = msgspec.field(default_factory=dict)
    cache_breaks: list[CacheBreakAt] = msgspec.field(default_factory=list)
    costliest: list[CallCost] = msgspec.field(default_factory=list)
    context: ContextGrowth | None = None
    series: CallSeries | None = None
    ref_id: str = ""  # the id discovery gave the session (before its log named it)
    first_main_context: int = 0  # prompt size of the session's own agent's first call
    main_models: dict[str, int] = msgspec.field(
        default_factory=dict
    )  # its own agent's calls per model
    # ``to_json()`` encoded ahead where the report was analysed (a worker process: see
    # ``stayer.audit.engine``), as it stands in the audit document (``AuditReport.doc``):
    # bytes cross from a worker far faster than the objects they encode.
    json_fragment: builtins.bytes | None = None  # (``bytes`` here is the field above)
    # The log's own totals (formats that record them: SWE-agent, mini-swe-agent, ATIF, …)
    # against the audit's.
    recorded: list[Reference] = msgspec.field(default_factory=list)

    @property
    def break_cost(self) -> Decimal | None:
        costs = [b.extra_cost for b in self.cache_breaks]
        known = [c for c in costs if c is not None]
        return sum(known, Decimal(0)) if len(known) == len(costs) else None

    def doc(self) -> SessionDoc:
        return self.total.doc(
            SessionDoc,
            label=self.id,
            project=self.project,
            source=self.source,
            first_ts=iso(self.first_ts),
            last_ts=iso(self.last_ts),
            approximate_ts=self.approximate_ts,
            models=[t.doc(ModelTallyDoc, label=m) for m, t in sorted(self.by_model.items())],
            cache_breaks=[b.doc() for b in self.cache_breaks],
            cache_break_cost=money(self.break_cost),
            context=self.context,
            costliest_calls=[c.doc() for c in self.costliest],
            subagents=[
                t.doc(SubagentDoc, label=chain)
                for chain, t in sorted(self.by_chain.items())
                if chain != MAIN_CHAIN
            ],
            skipped_lines=self.skipped_lines,
            recorded=self.recorded,
        )

    def to_json(self) -> dict[str, Any]:
        """The session's entry of the audit document, as JSON builtins."""
        return doc_json(self.doc())


class SessionDoc(TallyDoc, kw_only=True):
    """A session in the audit document."""

    label: str = msgspec.field(name="id")
    project: str
    source: str
    first_ts: str
    last_ts: str
    approximate_ts: bool
    models: list[ModelTallyDoc]
    cache_breaks: list[CacheBreakDoc]
    cache_break_cost: str = msgspec.field(name="cache_break_cost_usd")
    context: ContextGrowth | None
    costliest_calls: list[CallCostDoc]
    subagents: list[SubagentDoc]
    skipped_lines: int
    recorded: list[Reference]


@cache
def _rules(provider: str | None, model: str) -> CacheRules:
    model_id = model.split(":", 1)[1] if ":" in model else model
    try:
        return cache_rules(provider or provider_of(model_id), model_id)
    except ConfigError:
        return _FALLBACK_RULES


def _lost_tokens(previous: Call, call: Call, rules: CacheRules) -> int:
    u, p = call.usage, previous.usage
    if rules.mode == "explicit":
        reusable = p.cache_read_tokens + p.cache_write_tokens
    else:
        reusable = p.input_tokens
    expected = cached_length(rules, min(reusable, u.input_tokens))
    return max(expected - u.cache_read_tokens, 0)


def _extra_cost(u: Usage, lost: int, rates: Rates | None) -> Decimal | None:
    if rates is None:
        return None
    written = min(lost, u.cache_write_tokens)
    uncached = min(lost - written, max(u.uncached_input_tokens, 0))
    w1h = written * u.cache_write_1h_tokens // u.cache_write_tokens if u.cache_write_tokens else 0
    w5m = written - w1h
    read = rates.cache_read
    return (
        w5m * (rates.cache_write_5m - read)
        + w1h * (rates.cache_write_1h - read)
        + uncached * (rates.input - read)
    ) / MTOK


def _reason(previous: Call, call: Call, gap: float, ttl_s: float, rules: CacheRules) -> str:
    if call.model != previous.model:
        return "model_switch"
    if call.compacted:
        return "compaction"
    if gap > ttl_s:
        return "ttl_expired"
    return "prefix_edit" if rules.mode == "explicit" else "unknown"


def analyse(
    session: ImportedSession,
    pricer: CallPricer,
    since: float | None = None,
    keep_series: bool = False,
) -> SessionReport:
    """One session's report. A session with no calls (at or after ``since``) still gets
    one, with ``total.calls == 0``, so that its unreadable lines are counted."""
    calls: Iterable[Call] = session.calls
    if since is not None:
        calls = [c for c in calls if c.ts >= since]
    calls = sorted(calls, key=lambda c: c.ts)
    r = SessionReport(
        session.source,
        session.id,
        session.project,
        session.files,
        session.bytes,
        session.skipped_lines,
    )
    if not calls:
        return r
    r.first_ts, r.last_ts = calls[0].ts, calls[-1].ts
    r.approximate_ts = any(c.approximate_ts for c in calls)
    r.series = CallSeries() if keep_series else None
    # chain → (its previous call, the lifetime of what that call left in the cache)
    chains: dict[str, tuple[Call, float]] = {}
    # Each call is tallied once, in its (model, day, chain) group; the session's total and
    # its tallies by model, day and chain are sums of these few groups.
    groups: dict[tuple[str, int, str], Tally] = {}
    top: list[tuple[Units, int, Call]] = []
    main_context: list[int] = []
    all_context: list[int] = []
    running: Units = 0  # the cost so far, exact
    price, series, main_models = pricer.units, r.series, r.main_models
    for n, call in enumerate(calls, 1):
        u, model, chain = call.usage, call.model, call.chain
        units, rates = price(u, model, call.provider, call.service_tier, call.ts)
        key = (model, int(call.ts // 86400), chain)
        group = groups.get(key)
        if group is None:
            group = groups[key] = Tally()
        group.add(u, model, units)
        if call.count != 1:  # a log's totals, not one call: no prompt size, no cache
            group.calls += call.count - 1
            if units is None:
                group.unpriced_calls += call.count - 1
            continue
        if units is not None:  # keep the COSTLIEST dearest (earlier first among equals)
            item = (units, -n, call)
            if len(top) < COSTLIEST:
                heapq.heappush(top, item)
            elif item > top[0]:
                heapq.heapreplace(top, item)
        prompt = u.input_tokens
        all_context.append(prompt)
        if chain == MAIN_CHAIN:
            if not main_context:
                r.first_main_context = prompt
            main_context.append(prompt)
            main_models[model] = main_models.get(model, 0) + 1

        rules = _rules(call.provider, model)
        state = chains.get(chain)
        if state is None:
            ttl = rules.ttl_s
        else:
            previous, ttl = state
            lost = _lost_tokens(previous, call, rules)
            if call.cache_break_reason is not None or lost >= MIN_LOST_TOKENS:
                brk = _break(n, previous, ttl, lost, call, rules, rates)
                if brk is not None:
                    r.cache_breaks.append(brk)
        if u.cache_write_5m_tokens:
            ttl = rules.ttl_s
        elif u.cache_write_1h_tokens:
            ttl = 3600.0
        chains[chain] = (call, ttl)

        if series is not None:
            running += units or 0
            series.ts.append(call.ts)
            series.chain.append(chain)
            series.context.append(prompt)
            series.cumulative_cost.append(float(running / PER_CURRENCY))
            series.hit_ratio.append(u.cache_hit_ratio)
    for (model, day_no, chain), group in groups.items():
        day = time.strftime("%Y-%m-%d", time.gmtime(day_no * 86400))
        for tally in (
            r.total,
            _slot(r.by_model, model),
            _slot(r.by_day, day),
            _slot(r.by_chain, chain),
        ):
            tally.merge(group)
    r.costliest = [
        CallCost(-neg, c.chain, c.ts, c.model, c.usage.input_tokens, usd(units))
        for units, neg, c in sorted(top, reverse=True)
    ]
    r.context = context_growth(main_context or all_context)
    if not main_context and all_context:
        r.first_main_context = all_context[0]
    if session.recorded:
        r.recorded = references(session.recorded, r.total, _price_note(calls, pricer))
    return r


def _audited(what: str, total: Tally) -> int | str:
    if what == "cost_usd":
        return money(total.cost)
    if what == "calls":
        return total.calls
    if what == "cache_write_tokens":
        return total.cache_write_5m_tokens + total.cache_write_1h_tokens
    return int(getattr(total, what))


def references(checks: list[LoggedTotal], total: Tally, price_note: str) -> list[Reference]:
    """The log's totals next to the audit's, each with why they differ."""
    out = []
    for c in checks:
        audited = _audited(c.what, total)
        if c.what == "cost_usd":
            ours = total.cost
            matches = ours is not None and same_cost(Decimal(str(c.value)), ours)
            why = c.why or (
                f"no price data for {', '.join(sorted(total.unpriced_models))}"
                if ours is None
                else f"the log priced the calls with its own table; {price_note}"
            )
        else:
            matches = audited == c.value
            why = c.why or "unexplained"
        out.append(Reference(c.what, c.field, c.value, audited, matches, "" if matches else why))
    return out


def _price_note(calls: Iterable[Call], pricer: CallPricer) -> str:
    """The rates the audit used, per model: "genai-prices: gpt-4o $2.5 in, …"."""
    seen: dict[str, str] = {}
    for c in calls:
        if c.model in seen:
            continue
        rates = pricer.units(Usage(), c.model, c.provider, c.service_tier, c.ts)[1]
        if rates is not None:
            write = (
                f", ${rates.cache_write_5m} cache write"
                if rates.cache_write_5m != rates.input
                else ""
            )
            seen[c.model] = (
                f"{c.model} ${rates.input} in, ${rates.cache_read} cache read{write}, "
                f"${rates.output} out"
            )
    if not seen:
        return "genai-prices has no rates for its models"
    return "genai-prices, per million tokens: " + "; ".join(seen.values())


def _slot(d: dict[str, Tally], key: str) -> Tally:
    t = d.get(key)
    if t is None:
        t = d[key] = Tally()
    return t


def _break(
    n: int,
    previous: Call,
    ttl_s: float,
    lost: int,
    call: Call,
    rules: CacheRules,
    rates: Rates | None,
) -> CacheBreakAt | None:
    """The break at the ``n``-th call, which read ``lost`` reusable tokens less than
    ``previous`` left in the cache for ``ttl_s``; None when there is none."""
    gap = call.ts - previous.ts
    if call.cache_break_reason is not None:  # the log's own verdict
        if not call.cache_break_reason:
            return None
        reason = call.cache_break_reason
    elif lost < MIN_LOST_TOKENS:
        return None
    else:
        reason = _reason(previous, call, gap, ttl_s, rules)
    return CacheBreakAt(
        call=n,
        chain=call.chain,
        ts=call.ts,
        reason=reason,
        lost_tokens=lost,
        gap_s=None if call.approximate_ts else gap,
        extra_cost=_extra_cost(call.usage, lost, rates),
    )

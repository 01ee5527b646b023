"""A provider call admitted against its budgets, then priced and settled.

``Meter.admit`` counts the request's prompt, quotes its worst case (every prompt token at
the dearest input rate, plus ``max_tokens`` of output: ``stayer.guard.reserve``) and holds
it in every account the call is charged to (a tenant's, a key's, a session's), all or
none. A call whose ``max_tokens`` does not fit gets the most that does, down to
``MIN_OUTPUT_TOKENS``; below that it is refused, with the numbers. A model without price
data is refused under any cap: an unknown price never passes a cap. ``Meter.settle``
prices the usage the provider reported and replaces each hold by it; a call whose usage
never came (a stream cut before its usage event) is settled at its worst case, so that
money the provider may have billed is never lost.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from decimal import Decimal

from stayer.errors import ConfigError
from stayer.guard.budget import Account, BudgetStore, Rows, reserve_in, settle_in
from stayer.guard.reserve import MIN_OUTPUT_TOKENS, CallQuote, quote
from stayer.metering.requests import Parsed
from stayer.metering.usage import Reading
from stayer.pricing import Cost, PriceBook
from stayer.tokens import MessageCounter, canonical_tools, counter_for
from stayer.usage import Usage


class Refused(Exception):
    """The call cannot be made within its budgets; the message says which and why."""


@dataclass(slots=True)
class Admission:
    """A call let through: what is held for it, and the ``max_tokens`` it may use."""

    model: str
    provider: str
    tier: str | None
    prompt_tokens: int
    max_tokens: int
    worst_case: Decimal | None  # None: unpriced, and uncapped
    holds: list[int] = field(default_factory=list)
    counts: list[int] = field(default_factory=list)  # one call held in each of ``counted``
    settled: bool = False


@dataclass(slots=True)
class Metered:
    """A settled call: its usage (None when the provider never reported it) and cost."""

    usage: Usage | None
    cost: Cost
    charged: Decimal | None  # what the accounts were charged: the cost, or the worst case
    complete: bool


class Meter:
    def __init__(self, prices: PriceBook, budgets: BudgetStore) -> None:
        self.prices = prices
        self.budgets = budgets
        self._counters: dict[tuple[str, str], MessageCounter] = {}

    def prompt_tokens(self, parsed: Parsed, provider: str) -> int:
        """Our count of the request's prompt (tools, system, messages)."""
        key = (provider, parsed.model)
        counter = self._counters.get(key)
        if counter is None:
            counter = self._counters[key] = MessageCounter(counter_for(provider, parsed.model))
        r = parsed.request
        return (
            counter.text(canonical_tools(r.tools))
            + counter.text(r.system)
            + sum(counter.message(m) for m in r.messages)
        )

    def quote(self, parsed: Parsed, provider: str, prompt_tokens: int) -> CallQuote | None:
        tier = parsed.request.service_tier
        return quote(
            lambda n: self.prices.rates(parsed.model, provider, tier, prompt_tokens=n),
            prompt_tokens,
            parsed.request.cache_ttl,
        )

    def admit(
        self,
        parsed: Parsed,
        provider: str,
        accounts: Sequence[str],
        opening: Mapping[str, Opening] | None = None,
        counted: Mapping[str, str] | None = None,
    ) -> Admission:
        """Hold the call's worst case in each of ``accounts``, and one call in each of
        ``counted`` (account → why it is refused when full), or raise :class:`Refused`:
        one transaction, so that a refusal holds nothing and a call costs one commit. An
        account not open yet is opened as ``opening`` says (else ConfigError)."""
        tokens = self.prompt_tokens(parsed, provider)
        q = self.quote(parsed, provider, tokens)
        wanted = parsed.request.max_tokens
        base = Admission(parsed.model, provider, parsed.request.service_tier, tokens, wanted, None)
        with self.budgets.transaction() as rows:
            held = [_opened(rows, name, (opening or {}).get(name)) for name in accounts]
            calls = [_opened(rows, name, None) for name in counted or ()]
            for a in calls:
                if a.available is not None and a.available < 1:
                    raise Refused((counted or {})[a.name])
            capped = [(a.name, a.available) for a in held if a.cap is not None]
            if q is None:
                if capped:
                    raise Refused(
                        f"model {parsed.model!r} ({provider}) has no price data, so no call of "
                        f"it can be held under the cap of {capped[0][0]}"
                    )
                base.counts = [_held(rows, a, ONE) for a in calls]
                return base
            available = min((v for _, v in capped if v is not None), default=None)
            allowed = q.affordable_output(available, wanted)
            if allowed < min(wanted, MIN_OUTPUT_TOKENS):
                raise Refused(
                    f"budget: this call's worst case does not fit what is left "
                    f"(${available} in {min(capped, key=lambda c: c[1] or 0)[0]}): about "
                    f"{tokens:,} prompt tokens cost up to ${q.input_cost:.6f} before any "
                    f"output, and {min(wanted, MIN_OUTPUT_TOKENS):,} output tokens up to "
                    f"${q.output_rate * min(wanted, MIN_OUTPUT_TOKENS):.6f}"
                )
            base.max_tokens, base.worst_case = allowed, q.worst_case(allowed)
            base.holds = [_held(rows, a, base.worst_case) for a in held]
            base.counts = [_held(rows, a, ONE) for a in calls]
        return base

    def settle(self, admission: Admission, reading: Reading) -> Metered:
        """Price what the provider reported and charge it in place of the holds."""
        usage = reading.usage
        cost = self.cost(admission, reading, usage)
        charged = cost.total if cost.total is not None and reading.complete else None
        if charged is None and admission.worst_case is not None:
            charged = max(admission.worst_case, cost.total or Decimal(0))
        self._settle(admission, charged if charged is not None else Decimal(0), ONE)
        return Metered(usage, cost, charged, reading.complete)

    def cost(self, admission: Admission, reading: Reading, usage: Usage | None) -> Cost:
        """``usage`` priced as this call is: at the model and tier the provider reported,
        else those admitted (a counterfactual usage is priced alike)."""
        tier = reading.service_tier or admission.tier
        model = reading.model or admission.model
        if usage is None:
            return Cost.unknown(model, admission.provider, tier)
        return self.prices.cost(usage, model, admission.provider, tier)

    def release(self, admission: Admission) -> None:
        """Give back the holds of a call that was never sent (or was refused upstream
        before anything was billed)."""
        self._settle(admission, Decimal(0), Decimal(0))

    def _settle(self, admission: Admission, actual: Decimal, calls: Decimal) -> None:
        """Every hold of ``admission`` replaced by ``actual`` (its counts by ``calls``), in
        one transaction, once."""
        if admission.settled:
            return
        admission.settled = True
        if admission.holds or admission.counts:
            with self.budgets.transaction() as rows:
                for hold in admission.holds:
                    settle_in(rows, hold, actual)
                for hold in admission.counts:
                    settle_in(rows, hold, calls)


ONE = Decimal(1)


def _held(rows: Rows, a: Account, amount: Decimal) -> int:
    hold = reserve_in(rows, a, amount)
    assert hold is not None  # it fits: read in this transaction
    return hold


@dataclass(frozen=True, slots=True)
class Opening:
    """How an account is opened by the call that finds it missing: with ``cap``; with
    ``strict``, an account open already with another cap refuses the call."""

    cap: Decimal | None
    strict: bool = False


class CapClash(Exception):
    """A strict opening met the account open with another cap (``args``: name, cap)."""


def _opened(rows: Rows, name: str, opening: Opening | None) -> Account:
    a = rows.get(name)
    if a is None:
        if opening is None:
            raise ConfigError(f"budget {name!r} is not open")
        a = Account(name, opening.cap)
        rows.put(a)
    elif opening is not None and opening.strict and a.cap != opening.cap:
        raise CapClash(name, a.cap)
    if a.closed:
        raise Refused(f"budget: {name} is closed")
    return a

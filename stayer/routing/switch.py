"""What a model switch costs, against the prompt cache.

Caches are per model: staying, the next step reads the previous prompt at the cache-read
price; switching, the new model re-reads the context uncached at its own rates (unless it
holds a warm prefix). ``price_switch`` compares the two futures over the expected horizon
H — first step plus (H − 1) steady steps on each side, plus, for the switch, p times the
miss of coming back to the current model later — and switches only when it pays back.

The comeback term and its cases: ``docs/internals.md#routing-switch``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from decimal import Decimal

from stayer.money import MTOK
from stayer.pricing import Rates


@dataclass(frozen=True)
class Outlook:
    """What the router expects of the run ahead."""

    context_tokens: int
    growth: float  # new prompt tokens per step
    output_tokens: float  # output tokens per step
    horizon: int  # steps the candidate would run before the next decision point
    step_interval_s: float  # wall time between calls


@dataclass(frozen=True)
class Priced:
    """A model as the pricing sees it, with its cache state for this context."""

    spec: str
    rates_at: Callable[[int], Rates | None]
    explicit_cache: bool  # a miss is billed as a cache write (Anthropic), else as input
    warm_tokens: int  # prefix of the current context still cached on this model
    ttl_s: float

    def miss_rate(self, rates: Rates) -> Decimal:
        return rates.cache_write_5m if self.explicit_cache else rates.input


def step_cost(m: Priced, prompt: float, cached: float, output: float) -> Decimal | None:
    rates = m.rates_at(int(prompt))
    if rates is None:
        return None
    cached = min(max(cached, 0.0), prompt)
    return (
        Decimal(cached) * rates.cache_read
        + Decimal(prompt - cached) * m.miss_rate(rates)
        + Decimal(output) * rates.output
    ) / MTOK


def run_cost(m: Priced, o: Outlook) -> Decimal | None:
    """``o.horizon`` steps on ``m`` from now: the first at its warm prefix, the rest steady
    (at the context size halfway through the horizon)."""
    first = step_cost(m, o.context_tokens, m.warm_tokens, o.output_tokens)
    if first is None or o.horizon <= 1:
        return first
    mid = o.context_tokens + o.growth * o.horizon / 2
    steady = step_cost(m, mid, mid - o.growth, o.output_tokens)
    return None if steady is None else first + steady * (o.horizon - 1)


def comeback_miss(m: Priced, o: Outlook, cold_p: float) -> Decimal | None:
    """What returning to ``m`` after the horizon costs beyond a cached read, when its cache
    is cold by then with probability ``cold_p``."""
    later = o.context_tokens + o.growth * o.horizon
    rates = m.rates_at(int(later))
    if rates is None:
        return None
    rebilled = cold_p * later + (1 - cold_p) * o.growth * o.horizon
    return Decimal(rebilled) * (m.miss_rate(rates) - rates.cache_read) / MTOK


@dataclass(frozen=True)
class SwitchQuote:
    stay: Decimal
    switch: Decimal
    comeback: Decimal
    horizon: int

    @property
    def pays(self) -> bool:
        return self.switch + self.comeback < self.stay


def price_switch(
    current: Priced, candidate: Priced, o: Outlook, comeback_p: float = 0.0, cold_p: float = 1.0
) -> SwitchQuote | None:
    """None when either model has no price data (then there is nothing to weigh)."""
    stay, switch = run_cost(current, o), run_cost(candidate, o)
    if stay is None or switch is None:
        return None
    comeback = Decimal(0)
    if comeback_p > 0:
        miss = comeback_miss(current, o, cold_p)
        if miss is None:
            return None
        comeback = miss * Decimal(str(comeback_p))
    return SwitchQuote(stay, switch, comeback, o.horizon)

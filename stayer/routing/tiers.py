"""Service and speed tiers: standard, fast/priority, flex, batch — chosen by a latency target.

A tier changes two things: the price (``PriceBook`` knows each provider's tier prices or
multipliers; a tier it cannot price is never chosen, since an unknown price cannot be held
against a budget) and the speed. Speeds are a *model* of latency, not a measurement:
time to first token plus prefill and output at a per-tier throughput. The figures are
round numbers in line with what providers state about the tiers (Anthropic fast mode: up
to ~2.5× output speed; OpenAI flex: slower responses; batch: results within hours) — good
enough to rank tiers against a target, and overridable.

``TierPolicy.choose`` picks the cheapest priced tier whose modelled latency meets the
target, else the fastest priced one; in batch mode the cheapest priced tier outright.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from decimal import Decimal

from stayer.pricing import Rates


@dataclass(frozen=True)
class Speed:
    ttft_s: float
    prefill_tok_s: float
    output_tok_s: float

    def latency(self, prompt_tokens: int, output_tokens: int) -> float:
        return self.ttft_s + prompt_tokens / self.prefill_tok_s + output_tokens / self.output_tok_s


STANDARD = Speed(ttft_s=0.8, prefill_tok_s=40_000, output_tok_s=60)

#: Tier name (as the provider's API spells it) → speed, per provider.
TIER_SPEEDS: dict[str, dict[str | None, Speed]] = {
    "anthropic": {
        None: STANDARD,
        "fast": Speed(0.6, 60_000, 150),
        "batch": Speed(1800.0, 40_000, 60),
    },
    "openai": {
        None: STANDARD,
        "priority": Speed(0.5, 60_000, 100),
        "flex": Speed(4.0, 20_000, 30),
        "batch": Speed(1800.0, 40_000, 60),
    },
}


@dataclass(frozen=True)
class TierChoice:
    tier: str | None  # None: the standard tier
    latency_s: float


@dataclass
class TierPolicy:
    latency_target_s: float | None = None
    batch: bool = False
    speeds: Mapping[str, Mapping[str | None, Speed]] = field(default_factory=lambda: TIER_SPEEDS)

    def latency(
        self, provider: str, tier: str | None, prompt_tokens: int, output_tokens: int
    ) -> float:
        speed = self.speeds.get(provider, {}).get(tier) or STANDARD
        return speed.latency(prompt_tokens, output_tokens)

    def choose(
        self,
        provider: str,
        rates_for: Callable[[str | None], Rates | None],
        prompt_tokens: int,
        output_tokens: int,
    ) -> TierChoice:
        """``rates_for(tier)`` prices a tier for this model (None: unknown, not eligible)."""
        options: list[tuple[Decimal, float, str | None]] = []
        for tier in self.speeds.get(provider, {None: STANDARD}):
            if tier == "batch" and not self.batch:
                continue  # a batch tier answers in hours: only when asked for
            rates = rates_for(tier)
            if rates is None:
                continue
            price = prompt_tokens * rates.cache_read + output_tokens * rates.output
            options.append(
                (price, self.latency(provider, tier, prompt_tokens, output_tokens), tier)
            )
        if not options:
            return TierChoice(None, self.latency(provider, None, prompt_tokens, output_tokens))
        if self.batch or self.latency_target_s is None:
            price, latency, tier = min(options, key=lambda o: (o[0], o[1]))
            return TierChoice(tier, latency)
        fitting = [o for o in options if o[1] <= self.latency_target_s]
        if fitting:
            price, latency, tier = min(fitting, key=lambda o: (o[0], o[1]))
        else:
            price, latency, tier = min(options, key=lambda o: (o[1], o[0]))
        return TierChoice(tier, latency)

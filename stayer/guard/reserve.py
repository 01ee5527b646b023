"""A model call's worst-case cost: what the budget must hold before the call is sent.

Worst case = every prompt token billed at the dearest input rate the request can incur
(uncached input, or a cache write at the request's TTL), plus ``max_tokens`` of output —
at the rates of the largest prompt the provider might count. Our token counts come from
one tokenizer and providers' differ by a few percent, so the prompt is inflated by
``TOKEN_MARGIN``; long-context tiers are cliffs (the whole request is billed at the higher
rates once the prompt passes a threshold), so the rates are taken at the inflated size
too, and the larger of each rate at either size is used.

When the budget cannot cover the usual ``max_tokens``, the call gets a smaller one, so
the cap still holds; below ``MIN_OUTPUT_TOKENS`` a call is not worth making.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from decimal import Decimal

from stayer.money import MTOK
from stayer.pricing import Rates

TOKEN_MARGIN = Decimal("1.2")
MIN_OUTPUT_TOKENS = 256

RatesAt = Callable[[int], Rates | None]


@dataclass(frozen=True)
class CallQuote:
    """The worst case of one call: the input part, and the price of each output token."""

    input_cost: Decimal
    output_rate: Decimal  # USD per output token
    prompt_tokens: int = 0  # the prompt size held (with its error bound)
    input_rate: Decimal = Decimal(0)  # USD per prompt token: the dearest the call can incur

    def explain(self, max_tokens: int, why: str = "") -> str:
        """The parts of the worst case at ``max_tokens``: prompt × dearest input rate +
        max_tokens × output rate (rates per million tokens); ``why`` follows max_tokens."""

        def per_m(rate: Decimal) -> str:
            return f"${(rate * MTOK).normalize():f}/M"

        return (
            f"{self.prompt_tokens:,} prompt tokens × {per_m(self.input_rate)} (the dearest "
            f"input rate) + {max_tokens:,} max_tokens{why} × {per_m(self.output_rate)}"
        )

    def worst_case(self, max_tokens: int) -> Decimal:
        return self.input_cost + max_tokens * self.output_rate

    def affordable_output(self, available: Decimal | None, wanted: int) -> int:
        """The most output tokens (≤ ``wanted``) whose worst case fits ``available``."""
        if available is None or self.output_rate <= 0:
            return wanted if available is None or self.input_cost <= available else -1
        return min(wanted, math.floor((available - self.input_cost) / self.output_rate))


def margin_tokens(prompt_tokens: int) -> int:
    return math.ceil(prompt_tokens * TOKEN_MARGIN)


def quote(
    rates_at: RatesAt, prompt_tokens: int, cache_ttl: str = "5m", upper: int | None = None
) -> CallQuote | None:
    """The worst case of a call with a prompt of about ``prompt_tokens`` (our count);
    None when the model has no price data. ``upper``, when given, is a bound on the
    provider's count that replaces the blanket ``TOKEN_MARGIN`` (``stayer.tokens``'s
    estimate anchored to the provider's reports, or an exact count from the provider)."""
    counted = margin_tokens(prompt_tokens) if upper is None else max(upper, prompt_tokens)
    candidates = [r for r in (rates_at(prompt_tokens), rates_at(counted)) if r is not None]
    if not candidates:
        return None
    write = "cache_write_1h" if cache_ttl == "1h" else "cache_write_5m"
    dearest_input = max(max(r.input, getattr(r, write)) for r in candidates)
    output_rate = max(r.output for r in candidates)
    return CallQuote(
        Decimal(counted) * dearest_input / MTOK, output_rate / MTOK, counted, dearest_input / MTOK
    )

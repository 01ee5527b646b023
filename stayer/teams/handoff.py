"""Pricing a handoff: what passing history costs the receiver, against what lacking it does.

Over the receiver's expected steps S, at its model's rates::

    cost(option) = passed × (first + read·(S−1))
                 + missing × (input + read·(S−1))
                 + extra_steps(option) × ((brief + needed) × read + STEP_OUTPUT_TOKENS × output)

The cheapest option is chosen, and the quote is kept on the ledger like a route switch.
Why the formula has this shape: docs/teams.md, "Priced handoffs".
"""

from __future__ import annotations

from dataclasses import dataclass
from decimal import Decimal

from stayer.events import Handoff
from stayer.pricing import Rates

OPTIONS = ("none", "summary", "full")
#: Reply tokens of a step spent finding missing context (a tool call and a few words).
STEP_OUTPUT_TOKENS = 300
PER_TOKEN = Decimal(1_000_000)


@dataclass(frozen=True)
class HandoffSizes:
    brief: int  # tokens of the brief itself
    summary: int  # of the local digest of the sender's history
    full: int  # of the whole history as a transcript


@dataclass(frozen=True)
class HandoffQuote:
    chosen: str
    costs: dict[str, Decimal | None]  # expected cost per option; None: unpriced
    sizes: HandoffSizes
    steps: int
    receiver_model: str

    def event(self, agent: str, to: str, asked: str | None, passed: str) -> Handoff:
        """The handoff as ``agent`` made it: to ``to``, the history ``asked`` for and the
        one ``passed``."""
        return Handoff(
            agent=agent,
            kind="handoff",
            chosen=self.chosen,
            receiver_model=self.receiver_model,
            expected_steps=self.steps,
            tokens={
                "brief": self.sizes.brief,
                "summary": self.sizes.summary,
                "full": self.sizes.full,
            },
            expected_cost_usd={k: None if v is None else str(v) for k, v in self.costs.items()},
            to=to,
            asked=asked,
            passed=passed,
        )


def price_handoff(
    rates: Rates | None,
    sizes: HandoffSizes,
    steps: int,
    receiver_model: str,
    *,
    relevance: float = 0.3,
    rediscovery_steps: int = 5,
) -> HandoffQuote:
    """The expected cost of each history option; unpriced (no rates): the brief alone."""
    if rates is None:
        return HandoffQuote("none", dict.fromkeys(OPTIONS), sizes, steps, receiver_model)
    later = rates.cache_read * (steps - 1)
    first = rates.cache_write_5m if rates.cache_write_5m > 0 else rates.input
    needed = Decimal(str(relevance)) * sizes.full
    passed = {"none": 0, "summary": sizes.summary, "full": sizes.full}
    missing = {
        "none": needed,
        "summary": max(needed - sizes.summary, Decimal(0)),
        "full": Decimal(0),
    }
    step = (sizes.brief + needed) * rates.cache_read + STEP_OUTPUT_TOKENS * rates.output
    costs: dict[str, Decimal | None] = {}
    for option in OPTIONS:
        extra = rediscovery_steps * (missing[option] / needed if needed else Decimal(0))
        total = (
            (sizes.brief + passed[option]) * (first + later)
            + missing[option] * (rates.input + later)
            + extra * step
        )
        costs[option] = (total / PER_TOKEN).quantize(Decimal("1e-9"))
    chosen = min(OPTIONS, key=lambda o: costs[o])  # type: ignore[arg-type,return-value]
    return HandoffQuote(chosen, costs, sizes, steps, receiver_model)

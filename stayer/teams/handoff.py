"""Pricing a handoff: what passing history costs the receiver, against what lacking it does.

Passed history is read cold by the receiver once (a cache write, or uncached input where
the provider caches on its own) and then from its cache at every later step. History not
passed costs too: the part the receiver needs (``relevance`` of it) must be found again
with tools, at ``rediscovery`` tokens of exploration per token needed, each read uncached
once and from the cache afterwards. A summary carries up to its own size of what is needed.

    cost(option) = passed × (first + read·(S−1)) + rediscovery × missing × (input + read·(S−1))

over the receiver's expected steps S, at the receiver's model's rates. The cheapest option
wins; the quote is kept on the ledger like a route switch.
"""

from __future__ import annotations

from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from stayer.pricing import Rates

OPTIONS = ("none", "summary", "full")
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

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": "handoff",
            "chosen": self.chosen,
            "receiver_model": self.receiver_model,
            "expected_steps": self.steps,
            "tokens": {"brief": self.sizes.brief, "summary": self.sizes.summary, "full": self.sizes.full},
            "expected_cost_usd": {k: None if v is None else str(v) for k, v in self.costs.items()},
        }


def price_handoff(
    rates: Rates | None,
    sizes: HandoffSizes,
    steps: int,
    receiver_model: str,
    *,
    relevance: float = 0.3,
    rediscovery: float = 3.0,
) -> HandoffQuote:
    """The expected cost of each history option; unpriced (no rates): the brief alone."""
    if rates is None:
        return HandoffQuote("none", dict.fromkeys(OPTIONS), sizes, steps, receiver_model)
    later = rates.cache_read * (steps - 1)
    first = rates.cache_write_5m if rates.cache_write_5m > 0 else rates.input
    needed = Decimal(str(relevance)) * sizes.full
    passed = {"none": 0, "summary": sizes.summary, "full": sizes.full}
    missing = {"none": needed, "summary": max(needed - sizes.summary, Decimal(0)), "full": Decimal(0)}
    costs: dict[str, Decimal | None] = {}
    for option in OPTIONS:
        held = (sizes.brief + passed[option]) * (first + later)
        found = Decimal(str(rediscovery)) * missing[option] * (rates.input + later)
        costs[option] = ((held + found) / PER_TOKEN).quantize(Decimal("1e-9"))
    chosen = min(OPTIONS, key=lambda o: costs[o])  # type: ignore[arg-type,return-value]
    return HandoffQuote(chosen, costs, sizes, steps, receiver_model)

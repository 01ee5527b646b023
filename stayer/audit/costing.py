"""Per-call prices for audits of large logs, from :class:`~stayer.pricing.PriceBook`.

An audit prices every call of every session — tens of thousands per 100 MB of logs — and
``PriceBook.cost`` takes ~0.1 ms a call, longer than reading the call did. The rates a call
pays depend only on (model, provider, service tier, time, prompt size), and change rarely
along both of the last two axes, so this module asks ``PriceBook.rates`` once per
distinct answer and prices each call with ``Rates.price`` — the same rates and the same
arithmetic ``PriceBook`` uses, just not recomputed per call:

* time: price data changes at dated boundaries (midnight) or time-of-day windows that
  start on a quarter hour (e.g. DeepSeek's off-peak hours), so rates are looked up per
  UTC quarter hour;
* prompt size: long-context tiers are steps that only raise prices as the prompt grows,
  so within a quarter hour the rates are a step function of the prompt size; it is
  resolved lazily by bisection and each step costs about 40 lookups, once.
"""

from __future__ import annotations

from bisect import bisect_left
from datetime import UTC, datetime
from decimal import Decimal

from stayer.pricing import PriceBook, Rates
from stayer.usage import Usage

__all__ = ["CallPricer"]

_QUARTER_HOUR = 900
_MAX_PROMPT = 1 << 40  # above any prompt a model accepts


class _Steps:
    """Rates as a function of prompt size at one time: sorted sample points, refined on demand."""

    __slots__ = ("xs", "rs")

    def __init__(self, lo: Rates | None, hi: Rates | None) -> None:
        self.xs = [0, _MAX_PROMPT]
        self.rs = [lo, hi]


class CallPricer:
    """Prices calls through one ``PriceBook``; holds only a memo of rates already looked up."""

    def __init__(self, book: PriceBook) -> None:
        self.book = book
        self._steps: dict[tuple[str, str | None, str | None, int], _Steps] = {}

    def rates(
        self,
        model: str,
        provider: str | None,
        service_tier: str | None,
        prompt_tokens: int,
        ts: float,
    ) -> Rates | None:
        """The rates ``PriceBook.rates`` gives for this call; None when the price is unknown."""
        quarter = int(ts // _QUARTER_HOUR)
        key = (model, provider, service_tier, quarter)
        steps = self._steps.get(key)
        if steps is None:
            steps = _Steps(self._lookup(key, 0), self._lookup(key, _MAX_PROMPT))
            self._steps[key] = steps
        xs, rs = steps.xs, steps.rs
        x = min(max(prompt_tokens, 0), _MAX_PROMPT)
        while True:
            i = bisect_left(xs, x)
            if xs[i] == x:
                return rs[i]
            lo, hi = i - 1, i
            if rs[lo] == rs[hi]:
                return rs[lo]
            mid = (xs[lo] + xs[hi]) // 2
            xs.insert(hi, mid)
            rs.insert(hi, self._lookup(key, mid))

    def _lookup(self, key: tuple[str, str | None, str | None, int], prompt_tokens: int) -> Rates | None:
        model, provider, tier, quarter = key
        at = datetime.fromtimestamp(quarter * _QUARTER_HOUR, UTC)
        return self.book.rates(model, provider, tier, prompt_tokens, at=at)

    def cost(
        self,
        usage: Usage,
        model: str,
        provider: str | None,
        service_tier: str | None,
        ts: float,
    ) -> tuple[Decimal | None, Rates | None]:
        """(cost of the call, the rates it paid); cost None when unknown — never 0 — except
        that a call with no tokens at all costs 0 whatever its model."""
        rates = self.rates(model, provider, service_tier, usage.input_tokens, ts)
        if rates is None:
            if usage.input_tokens == 0 and usage.output_tokens == 0:
                return Decimal(0), None
            return None, None
        inp, out = rates.price(usage)
        return inp + out, rates

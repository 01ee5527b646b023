"""Per-call prices for audits of large logs, from :class:`~stayer.pricing.PriceBook`.

Details and rationale: docs/notes.md, ``stayer/audit/costing.py``.
"""

from __future__ import annotations

import marshal
import os
from bisect import bisect_left, bisect_right
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path

from stayer.pricing import PriceBook, Rates
from stayer.usage import Usage

__all__ = ["UNIT_EXPONENT", "CallPricer", "CompiledSteps", "load_steps", "save_steps", "usd"]

#: A call's cost is counted in units of 10**-UNIT_EXPONENT of the currency: integers, so
#: that pricing and summing tens of thousands of calls is integer arithmetic, exact. Rates
#: per million tokens with up to UNIT_EXPONENT - 6 decimals (all known: genai-prices
#: quotes at most 6) are whole units per token; a finer one is priced in Decimal, as exact
#: as before, its units then a Decimal.
UNIT_EXPONENT = 18
_RATE_SHIFT = UNIT_EXPONENT - 6  # a rate per million tokens, in units per token

_QUARTER_HOUR = 900
_MAX_PROMPT = 1 << 40  # above any prompt a model accepts
_STEPS_FORMAT = 1

#: (model, provider, service tier) → (prompt sizes where a step starts, rates from there),
#: or None when the rates depend on the time of the call.
CompiledSteps = dict[
    tuple[str, str | None, str | None], tuple[tuple[int, ...], tuple[Rates | None, ...]] | None
]


class _Steps:
    """Rates as a function of prompt size at one time: sorted sample points, refined on demand."""

    __slots__ = ("xs", "rs")

    def __init__(self, lo: Rates | None, hi: Rates | None) -> None:
        self.xs = [0, _MAX_PROMPT]
        self.rs = [lo, hi]


Units = int | Decimal  # of 10**-UNIT_EXPONENT of the currency; Decimal only for finer rates
_UnitRates = tuple[int, int, int, int, int]  # input, cache read, writes 5m and 1h, output


#: Units in one of the currency: ``units / PER_CURRENCY`` is a float, correctly rounded.
PER_CURRENCY = 10**UNIT_EXPONENT


def usd(units: Units) -> Decimal:
    """An amount in units (:data:`UNIT_EXPONENT`) as a Decimal of the currency, exact."""
    return Decimal(units).scaleb(-UNIT_EXPONENT)


def _unit_rates(rates: Rates) -> _UnitRates | None:
    """``rates`` in whole units per token; None when one is finer than a unit."""
    out = []
    for name in _RATE_FIELDS:
        per_token = getattr(rates, name).scaleb(_RATE_SHIFT)
        if per_token != per_token.to_integral_value():
            return None
        out.append(int(per_token))
    inp, cache_read, write_5m, write_1h, output = out
    return inp, cache_read, write_5m, write_1h, output


class CallPricer:
    """Prices calls through one ``PriceBook``; holds only a memo of rates already looked up."""

    def __init__(self, book: PriceBook, compiled: CompiledSteps | None = None) -> None:
        self.book = book
        self.compiled: CompiledSteps = dict(compiled or {})
        self.learned: CompiledSteps = {}  # compiled here, not given: for the caller to keep
        self._steps: dict[tuple[str, str | None, str | None, int], _Steps] = {}
        # id of a Rates (kept alive here, so that the id is not reused) → its unit rates
        self._unit_rates: dict[int, tuple[Rates, _UnitRates | None]] = {}
        # (model, provider, tier) → its compiled steps with each step's unit rates, or ()
        # when its rates depend on the time: what ``units`` looks up first, once per call
        self._priced: dict[
            tuple[str, str | None, str | None],
            tuple[tuple[int, ...], tuple[tuple[Rates | None, _UnitRates | None], ...]] | tuple[()],
        ] = {}

    def rates(
        self,
        model: str,
        provider: str | None,
        service_tier: str | None,
        prompt_tokens: int,
        ts: float,
    ) -> Rates | None:
        """The rates ``PriceBook.rates`` gives for this call; None when the price is unknown."""
        group = (model, provider, service_tier)
        compiled = self._compiled(group)
        if compiled is not None:
            starts, rates = compiled
            return rates[0] if len(starts) == 1 else rates[bisect_right(starts, prompt_tokens) - 1]
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

    def _compiled(
        self, group: tuple[str, str | None, str | None]
    ) -> tuple[tuple[int, ...], tuple[Rates | None, ...]] | None:
        """The group's steps (compiled now if they were not given or compiled before); None
        when its rates depend on the time."""
        return self.compiled[group] if group in self.compiled else self._compile(group)

    def _compile(
        self, group: tuple[str, str | None, str | None]
    ) -> tuple[tuple[int, ...], tuple[Rates | None, ...]] | None:
        steps = self.book.rate_steps(*group)
        compiled = (
            None if steps is None else (tuple(n for n, _ in steps), tuple(r for _, r in steps))
        )
        self.compiled[group] = self.learned[group] = compiled
        return compiled

    def _lookup(
        self, key: tuple[str, str | None, str | None, int], prompt_tokens: int
    ) -> Rates | None:
        model, provider, tier, quarter = key
        at = datetime.fromtimestamp(quarter * _QUARTER_HOUR, UTC)
        return self.book.rates(model, provider, tier, prompt_tokens, at=at)

    def units(
        self,
        usage: Usage,
        model: str,
        provider: str | None,
        service_tier: str | None,
        ts: float,
    ) -> tuple[Units | None, Rates | None]:
        """(cost of the call in units, the rates it paid); cost None when unknown — never
        0 — except that a call with no tokens at all costs 0 whatever its model."""
        group = (model, provider, service_tier)
        priced = self._priced.get(group)
        if priced is None:
            priced = self._priced[group] = self._priced_steps(group)
        if priced:  # compiled: the rates by prompt size alone
            starts, steps = priced
            rates, per_token = (
                steps[0]
                if len(starts) == 1
                else steps[bisect_right(starts, usage.input_tokens) - 1]
            )
        else:
            rates = self.rates(model, provider, service_tier, usage.input_tokens, ts)
            per_token = None if rates is None else self._per_token(rates)
        if rates is None:
            if usage.input_tokens == 0 and usage.output_tokens == 0:
                return 0, None
            return None, None
        w5m, w1h = usage.cache_write_5m_tokens, usage.cache_write_1h_tokens
        uncached = usage.input_tokens - usage.cache_read_tokens - w5m - w1h
        if per_token is None or uncached < 0:
            # A rate finer than a unit: Rates.price's Decimal arithmetic (which raises on
            # inconsistent usage, cache reads and writes above the input).
            inp_cost, out_cost = rates.price(usage)
            return (inp_cost + out_cost).scaleb(UNIT_EXPONENT), rates
        inp, cache_read, write_5m, write_1h, output = per_token
        return (
            inp * uncached
            + cache_read * usage.cache_read_tokens
            + write_5m * w5m
            + write_1h * w1h
            + output * usage.output_tokens
        ), rates

    def _per_token(self, rates: Rates) -> _UnitRates | None:
        known = self._unit_rates.get(id(rates))
        if known is None:
            known = self._unit_rates[id(rates)] = (rates, _unit_rates(rates))
        return known[1]

    def _priced_steps(
        self, group: tuple[str, str | None, str | None]
    ) -> tuple[tuple[int, ...], tuple[tuple[Rates | None, _UnitRates | None], ...]] | tuple[()]:
        """The group's compiled steps, each with its unit rates; () when it has none."""
        compiled = self._compiled(group)
        if compiled is None:
            return ()
        starts, rates = compiled
        return starts, tuple((r, None if r is None else self._per_token(r)) for r in rates)

    def cost(
        self,
        usage: Usage,
        model: str,
        provider: str | None,
        service_tier: str | None,
        ts: float,
    ) -> tuple[Decimal | None, Rates | None]:
        """:meth:`units`, the cost as a Decimal of the currency."""
        units, rates = self.units(usage, model, provider, service_tier, ts)
        return (None if units is None else usd(units)), rates


# --- compiled steps kept between audits ----------------------------------------------

_RATE_FIELDS = ("input", "cache_read", "cache_write_5m", "cache_write_1h", "output")


def load_steps(path: Path, fingerprint: str) -> CompiledSteps:
    """The steps saved at ``path`` for this ``fingerprint`` of the price book; {} when there
    are none, they were compiled from other prices, or the file is unreadable (it is a cache)."""
    try:
        doc = marshal.loads(path.read_bytes())
        if doc["format"] != _STEPS_FORMAT or doc["fingerprint"] != fingerprint:
            return {}
        return {
            tuple(group): None
            if steps is None
            else (
                tuple(steps[0]),
                tuple(None if r is None else _saved_rates(r) for r in steps[1]),
            )
            for group, steps in doc["steps"].items()
        }
    except (OSError, EOFError, ValueError, TypeError, KeyError, IndexError, ArithmeticError):
        return {}


def _saved_rates(saved: tuple[str, ...]) -> Rates:
    """The rates :func:`save_steps` wrote as one tuple: ``_RATE_FIELDS`` then the currency."""
    inp, cache_read, cache_write_5m, cache_write_1h, out, currency = saved
    return Rates(
        Decimal(inp),
        Decimal(cache_read),
        Decimal(cache_write_5m),
        Decimal(cache_write_1h),
        Decimal(out),
        currency,
    )


def save_steps(path: Path, fingerprint: str, steps: CompiledSteps) -> None:
    """Write ``steps`` for this ``fingerprint`` whole (a temporary file renamed over ``path``);
    a cache that cannot be written is skipped."""
    doc = {
        "format": _STEPS_FORMAT,
        "fingerprint": fingerprint,
        "steps": {
            group: None
            if s is None
            else (
                s[0],
                tuple(
                    None if r is None else (*(str(getattr(r, f)) for f in _RATE_FIELDS), r.currency)
                    for r in s[1]
                ),
            )
            for group, s in steps.items()
        },
    }
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_bytes(marshal.dumps(doc))
        os.replace(tmp, path)
    except OSError:
        tmp.unlink(missing_ok=True)

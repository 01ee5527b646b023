"""The cost equation as a function: what an agent loop costs with and without caching.

Why: it shows, before anything runs, how the input cost of an agent loop grows
quadratically with its steps and how much of it prefix caching removes. That is the
argument behind stayer's context layout and compaction scheduling (DESIGN.md). This
module backs ``stayer estimate``.

Convention. It reproduces the published example exactly: 30 steps, 20,000 new input
tokens and 2,000 output tokens per step, prices miss = 10, hit = 1, out = 50 per million,
giving 17.7 with caching and 96.0 without.

Details and rationale: docs/notes.md, ``stayer/estimate.py``.
"""

from __future__ import annotations

from collections.abc import Callable
from decimal import Decimal, InvalidOperation
from typing import TYPE_CHECKING, Literal

from stayer.errors import ConfigError
from stayer.money import MTOK
from stayer.pricing import Rates
from stayer.records import Record

if TYPE_CHECKING:
    from rich.console import Console

__all__ = ["Estimate", "estimate", "rates_from_flags", "render_estimate"]


def _s(d: Decimal) -> str:
    """Exact, without trailing zeros, but always with a decimal point: "96.0", "17.7"."""
    d = d.normalize()
    exponent = d.as_tuple().exponent  # "n", "N" or "F" for NaN and infinity
    return format(d, "f") if isinstance(exponent, int) and exponent < 0 else format(d, ".1f")


def _price(v: Decimal | str | int | float, flag: str) -> Decimal:
    if isinstance(v, bool):
        raise ConfigError(f"{flag}: expected a price per million tokens, got {v!r}")
    try:
        # floats go through str() so 0.1 stays 0.1, not its binary approximation
        d = Decimal(str(v)) if isinstance(v, float) else Decimal(v)
    except (InvalidOperation, TypeError, ValueError):
        raise ConfigError(f"{flag}: {v!r} is not a number") from None
    if not d.is_finite() or d < 0:
        raise ConfigError(f"{flag}: must be a number >= 0, got {v!r}")
    return d


def rates_from_flags(
    price_miss: Decimal | str | int | float,
    price_hit: Decimal | str | int | float,
    price_out: Decimal | str | int | float,
    price_write: Decimal | str | int | float | None = None,
) -> Rates:
    """Rates from ``--price-miss/--price-hit/--price-out[/--price-write]`` (per million).

    With no write price, cache writes cost the miss price (no write premium).
    """
    miss = _price(price_miss, "--price-miss")
    write = miss if price_write is None else _price(price_write, "--price-write")
    return Rates(
        input=miss,
        cache_read=_price(price_hit, "--price-hit"),
        cache_write_5m=write,
        cache_write_1h=write,
        output=_price(price_out, "--price-out"),
    )


class EstimateInputs(Record, kw_only=True):
    steps: int
    new_tokens: int
    output_tokens: int
    cache_ttl: str
    rates: dict[str, str]  # per million tokens, and the currency (``Rates.to_dict``)


class WithCache(Record, kw_only=True):
    total: str
    cache_read: str
    cache_write: str
    output: str
    input_tokens: int
    cached_tokens: int


class WithoutCache(Record, kw_only=True):
    total: str
    input: str
    output: str
    input_tokens: int


class StepEstimate(Record, kw_only=True):
    step: int
    context_tokens: int
    with_cache: str
    without_cache: str


class Estimate(Record, kw_only=True):
    """The estimate (``stayer estimate --json``): money as strings, token counts as ints."""

    inputs: EstimateInputs
    currency: str
    with_cache: WithCache
    without_cache: WithoutCache
    savings: str
    steps: list[StepEstimate]


def estimate(
    steps: int,
    new_tokens: int,
    output_tokens: int,
    rates: Rates | Callable[[int], Rates],
    *,
    cache_ttl: Literal["5m", "1h"] = "5m",
) -> Estimate:
    """Per-step and total cost of an agent loop with ideal caching and with none."""
    for name, v in (("steps", steps), ("new_tokens", new_tokens), ("output_tokens", output_tokens)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 0:
            raise ConfigError(f"--{name.replace('_', '-')}: must be a whole number >= 0, got {v!r}")
    rates_at = rates if callable(rates) else (lambda _tokens: rates)
    rows: list[StepEstimate] = []
    read_total = write_total = miss_total = output_total = Decimal(0)
    cached_tokens = context_total = 0
    for t in range(1, steps + 1):
        context = t * new_tokens
        step_rates = rates_at(context)
        write_price = step_rates.cache_write_1h if cache_ttl == "1h" else step_rates.cache_write_5m
        out_cost = Decimal(output_tokens) * step_rates.output / MTOK
        output_total += out_cost
        cached = (t - 1) * new_tokens
        read = Decimal(cached) * step_rates.cache_read / MTOK
        write = Decimal(new_tokens) * write_price / MTOK
        miss = Decimal(context) * step_rates.input / MTOK
        read_total += read
        write_total += write
        miss_total += miss
        cached_tokens += cached
        context_total += context
        rows.append(
            StepEstimate(
                step=t,
                context_tokens=context,
                with_cache=_s(read + write + out_cost),
                without_cache=_s(miss + out_cost),
            )
        )

    with_total = read_total + write_total + output_total
    without_total = miss_total + output_total
    return Estimate(
        inputs=EstimateInputs(
            steps=steps,
            new_tokens=new_tokens,
            output_tokens=output_tokens,
            cache_ttl=cache_ttl,
            rates=rates_at(new_tokens).to_dict(),
        ),
        currency=rates_at(new_tokens).currency,
        with_cache=WithCache(
            total=_s(with_total),
            cache_read=_s(read_total),
            cache_write=_s(write_total),
            output=_s(output_total),
            input_tokens=context_total,
            cached_tokens=cached_tokens,
        ),
        without_cache=WithoutCache(
            total=_s(without_total),
            input=_s(miss_total),
            output=_s(output_total),
            input_tokens=context_total,
        ),
        savings=_s(without_total - with_total),
        steps=rows,
    )


def render_estimate(result: Estimate, console: Console, *, max_rows: int = 20) -> None:
    """Print a per-step table and the totals; only the first and last rows when long."""
    from stayer.tables import Col, FitTable, print_table

    cur = result.currency
    table = FitTable(
        Col("step", number=True),
        Col("context tokens", number=True),
        Col(f"with cache ({cur})", number=True),
        Col(f"without cache ({cur})", number=True),
        title="Cost per step",
        title_justify="left",
    )
    rows = result.steps
    if len(rows) > max_rows:
        head, tail = max_rows // 2, max_rows - max_rows // 2
        shown: list[StepEstimate | None] = [*rows[:head], None, *rows[-tail:]]
    else:
        shown = list(rows)
    for r in shown:
        if r is None:
            table.add_row("…", f"({len(rows) - max_rows} steps)", "…", "…")
        else:
            table.add_row(str(r.step), f"{r.context_tokens:,}", r.with_cache, r.without_cache)
    print_table(console, table)
    w, wo = result.with_cache, result.without_cache
    console.print(
        f"[bold]with cache[/]    {w.total} {cur}  "
        f"(reads {w.cache_read}, writes {w.cache_write}, output {w.output})"
    )
    console.print(
        f"[bold]without cache[/] {wo.total} {cur}  (input {wo.input}, output {wo.output})"
    )
    console.print(f"[bold]savings[/]       {result.savings} {cur}")

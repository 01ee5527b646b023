"""The cost equation (stayer/estimate.py) against the published example and its shape."""

from __future__ import annotations

import io
from decimal import Decimal as D

import pytest
from rich.console import Console

from stayer.errors import ConfigError
from stayer.estimate import estimate, rates_from_flags, render_estimate
from stayer.pricing import Rates

PUBLISHED = rates_from_flags(price_miss=10, price_hit=1, price_out=50)


def test_published_example_exact() -> None:
    r = estimate(30, 20_000, 2_000, PUBLISHED)
    assert D(r["with_cache"]["total"]) == D("17.7")
    assert D(r["without_cache"]["total"]) == D("96.0")
    # hand check: hits 20000×Σ(t−1)=8.7M ×1 = 8.7; new 0.6M ×10 = 6.0; output 0.06M ×50 = 3.0
    assert D(r["with_cache"]["cache_read"]) == D("8.7")
    assert D(r["with_cache"]["cache_write"]) == D("6.0")
    assert D(r["with_cache"]["output"]) == D("3.0")
    # without: 20000×Σt = 9.3M ×10 = 93.0, plus 3.0
    assert D(r["without_cache"]["input"]) == D("93.0")
    assert D(r["savings"]) == D("78.3")
    assert len(r["steps"]) == 30
    first, last = r["steps"][0], r["steps"][-1]
    assert first == {
        "step": 1,
        "context_tokens": 20_000,
        "with_cache": "0.3",
        "without_cache": "0.3",
    }
    # step 30: 580000 hits ×1 + 20000 ×10 + 2000 ×50 = 0.88; 600000 ×10 + 100000 = 6.1
    assert (last["context_tokens"], D(last["with_cache"]), D(last["without_cache"])) == (
        600_000,
        D("0.88"),
        D("6.1"),
    )
    assert sum(D(s["with_cache"]) for s in r["steps"]) == D("17.7")
    assert sum(D(s["without_cache"]) for s in r["steps"]) == D("96")


def test_write_premium_bills_new_tokens_at_write_price() -> None:
    rates = rates_from_flags("10", "1", "50", price_write="12.5")
    r = estimate(30, 20_000, 2_000, rates)
    # new tokens 0.6M at 12.5 instead of 10: +1.5
    assert D(r["with_cache"]["total"]) == D("19.2")
    assert D(r["without_cache"]["total"]) == D("96")


def test_with_cache_never_exceeds_without() -> None:
    for steps in (0, 1, 2, 7, 50):
        for new, out in ((0, 0), (1, 0), (20_000, 2_000), (123_457, 999)):
            r = estimate(steps, new, out, PUBLISHED)
            assert D(r["with_cache"]["total"]) <= D(r["without_cache"]["total"])


def test_without_cache_grows_quadratically() -> None:
    def total(n: int) -> D:
        return D(estimate(n, 20_000, 2_000, PUBLISHED)["without_cache"]["total"])

    # f(n) = miss·new·n(n+1)/2 + out·n: constant second difference = miss·new = 0.2
    second = {total(n + 1) - 2 * total(n) + total(n - 1) for n in range(1, 40)}
    assert second == {D("0.2")}
    # doubling the steps roughly quadruples the cost
    assert total(60) / total(30) > D("3.5")
    # with ideal caching the read cost grows quadratically but ten times more slowly
    w = [D(estimate(n, 20_000, 2_000, PUBLISHED)["with_cache"]["total"]) for n in (9, 10, 11)]
    assert w[2] - 2 * w[1] + w[0] == D("0.02")


def test_rates_from_flags() -> None:
    assert rates_from_flags(10, 1, 50) == Rates(
        input=D(10), cache_read=D(1), cache_write_5m=D(10), cache_write_1h=D(10), output=D(50)
    )
    # floats go through their decimal repr, never binary
    assert rates_from_flags(0.1, 0.01, 0.4).input == D("0.1")
    with pytest.raises(ConfigError, match="--price-hit"):
        rates_from_flags(10, -1, 50)
    with pytest.raises(ConfigError, match="--price-out"):
        rates_from_flags(10, 1, "lots")


def test_bad_counts() -> None:
    with pytest.raises(ConfigError, match="--steps"):
        estimate(-1, 1, 1, PUBLISHED)


def test_render_abbreviates_long_runs() -> None:
    buf = io.StringIO()
    render_estimate(estimate(30, 20_000, 2_000, PUBLISHED), Console(file=buf, width=120))
    text = buf.getvalue()
    assert "17.7" in text and "96" in text and "78.3" in text
    assert "600,000" in text and "(10 steps)" in text
    assert " 15 " not in text  # a middle row is elided


def test_the_estimate_is_a_record_read_by_attribute() -> None:
    from stayer.estimate import Estimate

    r = estimate(2, 1_000, 100, PUBLISHED)
    assert isinstance(r, Estimate) and r.currency == "USD" and r.inputs.steps == 2
    assert [s.step for s in r.steps] == [1, 2] and D(r.savings) == D(r.without_cache.total) - D(
        r.with_cache.total
    )

"""Evaluation statistics, checked against brute force and published values, and the
summary built from trial records."""

from __future__ import annotations

import itertools
import math
import sys
from decimal import Decimal

import pytest
from hypothesis import given
from hypothesis import strategies as st

from stayer.eval import stats
from stayer.eval.html_report import render
from stayer.eval.runner import AGENT_FAILURE, INFRASTRUCTURE, EvalConfig
from stayer.eval.summary import summarise


@pytest.mark.parametrize(
    ("s", "n", "low", "high"),
    [
        (5, 10, 0.2366, 0.7634),  # Newcombe (1998), Table I
        (0, 10, 0.0, 0.2775),
        (10, 10, 0.7225, 1.0),
    ],
)
def test_wilson_matches_published_values(s, n, low, high):
    lo, hi = stats.wilson_interval(s, n)
    assert lo == pytest.approx(low, abs=1e-4) and hi == pytest.approx(high, abs=1e-4)


@given(st.integers(1, 500), st.data())
def test_wilson_contains_the_estimate_and_stays_in_bounds(n, data):
    s = data.draw(st.integers(0, n))
    lo, hi = stats.wilson_interval(s, n)
    assert 0 <= lo <= s / n <= hi <= 1
    lo4, hi4 = stats.wilson_interval(4 * s, 4 * n)
    assert hi4 - lo4 < hi - lo  # more trials, narrower interval


def _subsets(n: int, c: int, k: int):
    outcomes = [True] * c + [False] * (n - c)
    return list(itertools.combinations(outcomes, k))


@given(st.integers(1, 9), st.data())
def test_pass_at_k_and_pass_hat_k_equal_brute_force_over_all_k_subsets(n, data):
    c = data.draw(st.integers(0, n))
    k = data.draw(st.integers(1, n))
    subsets = _subsets(n, c, k)
    assert stats.pass_at_k(n, c, k) == pytest.approx(sum(any(s) for s in subsets) / len(subsets))
    assert stats.pass_hat_k(n, c, k) == pytest.approx(sum(all(s) for s in subsets) / len(subsets))


def test_pass_at_k_needs_k_trials():
    with pytest.raises(ValueError):
        stats.pass_at_k(2, 1, 3)
    assert (
        stats.mean_over_tasks([(2, 1), (3, 3)], 3, stats.pass_hat_k) == 1.0
    )  # only the task with 3


@given(st.integers(0, 30), st.integers(0, 30))
def test_mcnemar_is_the_two_sided_binomial_test_on_discordant_pairs(b, c):
    n = b + c
    p = stats.mcnemar_exact(b, c)
    if n == 0:
        assert p == 1.0
        return
    # Two-sided: the probability of an outcome at least as far from n/2 as min(b, c).
    expected = (
        sum(math.comb(n, i) for i in range(n + 1) if abs(i - n / 2) >= abs(min(b, c) - n / 2))
        / 2**n
    )
    assert p == pytest.approx(min(1.0, expected))


def test_mcnemar_agrees_with_scipy_when_available():
    scipy_stats = pytest.importorskip("scipy.stats")
    for b, c in [(0, 6), (1, 9), (3, 5), (12, 2)]:
        assert stats.mcnemar_exact(b, c) == pytest.approx(
            scipy_stats.binomtest(b, b + c, 0.5).pvalue
        )


def test_paired_bootstrap_no_difference_and_clear_difference():
    same = stats.paired_bootstrap([[0.0, 0.0]] * 5)
    assert (same.diff, same.ci_low, same.ci_high, same.p_value) == (0.0, 0.0, 0.0, 1.0)
    better = stats.paired_bootstrap([[1.0, 1.0, 1.0]] * 6)
    assert better.diff == 1.0 and better.ci_low == 1.0 and better.p_value == 0.0
    mixed = stats.paired_bootstrap([[1.0], [-1.0], [0.0], [1.0]])
    assert mixed.ci_low < 0 < mixed.ci_high and mixed.p_value > 0.05
    assert stats.paired_bootstrap([[1.0], [-1.0], [0.0], [1.0]]) == mixed  # seeded
    assert stats.paired_bootstrap([]) is None


def test_pareto_front_keeps_only_undominated_points_by_cost():
    points = [
        (Decimal("3"), 0.9),
        (Decimal("1"), 0.5),
        (Decimal("2"), 0.4),
        (Decimal("1"), 0.5),
        (Decimal("4"), 0.9),
    ]
    assert stats.pareto_front(points) == [1, 3, 0]


# --- summary of trial records -------------------------------------------------------------

A, B = EvalConfig("sim:model-a"), EvalConfig("sim:model-b")


def record(
    config: EvalConfig, task: str, epoch: int, ok: bool, cost: str = "0.01", error_class=None
) -> dict:
    error_class = error_class if error_class is not None else (None if ok else AGENT_FAILURE)
    return {
        "task": task,
        "epoch": epoch,
        "config_key": config.key,
        "status": "succeeded" if ok else ("error" if error_class == INFRASTRUCTURE else "failed"),
        "reward": 1.0 if ok else 0.0,
        "error_class": error_class,
        "cost_usd": cost,
        "tokens": 1000,
        "steps": 2,
        "wall_s": 0.5,
    }


def test_one_epoch_uses_exact_mcnemar_and_finds_a_real_difference():
    tasks = [f"t{i}" for i in range(10)]
    records = [record(A, t, 1, False) for t in tasks] + [record(B, t, 1, True) for t in tasks]
    doc = summarise(records, [A, B], epochs=1)
    [cmp] = doc["comparisons"]
    assert cmp["test"] == "mcnemar_exact" and cmp["b_only"] == 10 and cmp["a_only"] == 0
    assert cmp["p_value"] == pytest.approx(2 / 2**10) and cmp["significant"] is True
    assert cmp["success_diff"] == 1.0


def test_several_epochs_use_the_task_bootstrap_and_equal_configs_are_not_significant():
    records = [
        record(c, t, e, t != "hard")
        for c in (A, B)
        for t in ("easy", "mid", "hard")
        for e in (1, 2, 3)
    ]
    doc = summarise(records, [A, B], epochs=3)
    [cmp] = doc["comparisons"]
    assert (
        cmp["test"] == "paired_bootstrap_tasks"
        and cmp["significant"] is False
        and cmp["p_value"] == 1.0
    )
    assert "not significant" in cmp["verdict"]
    a = doc["configs"][0]
    assert (a["trials"], a["successes"]) == (9, 6)
    assert a["pass_at_k"]["3"] == pytest.approx(2 / 3) and a["pass_hat_k"]["3"] == pytest.approx(
        2 / 3
    )
    assert a["mean_cost_usd"] == "0.01" and a["cost_per_success_usd"] == "0.015"


def test_infrastructure_errors_are_excluded_from_scores_and_counted_apart():
    records = [
        record(A, "t1", 1, True),
        record(A, "t2", 1, False),
        record(A, "t3", 1, False, cost="0", error_class=INFRASTRUCTURE),
    ]
    [a] = summarise(records, [A], epochs=1)["configs"]
    assert (a["trials"], a["successes"], a["success_rate"], a["infra_errors"]) == (2, 1, 0.5, 1)
    assert a["error_classes"] == {"agent_failure": 1, "limit_reached": 0, "infrastructure": 1}
    assert a["ci_low"] == pytest.approx(stats.wilson_interval(1, 2)[0])


def test_unknown_cost_stays_unknown_and_leaves_the_pareto_front():
    records = [record(A, "t1", 1, True, cost="unknown"), record(B, "t1", 1, True, cost="0.02")]
    doc = summarise(records, [A, B], epochs=1)
    assert doc["configs"][0]["mean_cost_usd"] == "unknown"
    assert doc["configs"][0]["cost_per_success_usd"] == "unknown"
    assert [p["model"] for p in doc["pareto"]] == ["sim:model-b"]
    assert doc["comparisons"][0]["cost_diff_usd"] == "unknown"


def test_report_is_self_contained_and_needs_no_plotting_library(monkeypatch):
    records = [record(A, "t1", 1, True), record(B, "t1", 1, False, cost="0.002")]
    doc = summarise(records, [A, B], epochs=1)
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # as if not installed
    page = render(doc, records)
    assert page.count("<svg") == 2 and "<script" not in page  # cost vs success, cost per trial
    assert "src=" not in page and "<link" not in page  # nothing fetched when opened offline
    assert "sim:model-a" in page and "None" not in page

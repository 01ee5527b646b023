"""Statistics for evaluations: rates with intervals, pass@k / pass^k, paired tests, Pareto.

All formulas are exact and written out here (``math.comb``), so the numbers can be checked
by hand and no heavy dependency is needed.

Choice of paired test (between two configurations on the same tasks):

* one trial per task (``epochs == 1``): **exact McNemar** on per-task outcomes. Only the
  discordant tasks (solved by one configuration only) carry information; under the null
  hypothesis each is equally likely to go either way, so the two-sided p-value is a binomial
  tail with p = 1/2.
* several trials per task: a **paired bootstrap over tasks**. Trials of one task are not
  independent (an easy task is easy for every epoch), so treating task-epoch pairs as
  independent McNemar pairs would overstate significance. Resampling whole tasks keeps
  that correlation. McNemar on task-epoch pairs is still reported, for reference.
"""

from __future__ import annotations

import math
import random
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from decimal import Decimal

Z95 = 1.959963984540054  # two-sided 95 % normal quantile
ALPHA = 0.05
BOOTSTRAP_RESAMPLES = 10_000


def wilson_interval(successes: int, trials: int, z: float = Z95) -> tuple[float, float]:
    """Wilson score interval; unlike the normal approximation it stays inside [0, 1] and is
    not degenerate at 0 or n successes, which is where small evaluations usually are."""
    if trials <= 0:
        return 0.0, 1.0
    p = successes / trials
    z2 = z * z
    centre = (p + z2 / (2 * trials)) / (1 + z2 / trials)
    half = z / (1 + z2 / trials) * math.sqrt(p * (1 - p) / trials + z2 / (4 * trials * trials))
    # At 0 or n successes a bound is exactly 0 or 1; floating point would miss it slightly.
    low = 0.0 if successes == 0 else max(0.0, centre - half)
    high = 1.0 if successes == trials else min(1.0, centre + half)
    return low, high


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased estimate of P(at least one of k trials succeeds): 1 - C(n-c, k) / C(n, k)."""
    if k > n:
        raise ValueError(f"pass@{k} needs at least {k} trials, got {n}")
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def pass_hat_k(n: int, c: int, k: int) -> float:
    """Unbiased estimate of P(all of k trials succeed): C(c, k) / C(n, k) (tau-bench's pass^k)."""
    if k > n:
        raise ValueError(f"pass^{k} needs at least {k} trials, got {n}")
    return math.comb(c, k) / math.comb(n, k)


def mean_over_tasks(counts: Sequence[tuple[int, int]], k: int, estimator) -> float | None:
    """Mean of ``estimator(n, c, k)`` over tasks with at least k trials; None if none has."""
    values = [estimator(n, c, k) for n, c in counts if n >= k]
    return sum(values) / len(values) if values else None


def mcnemar_exact(only_a: int, only_b: int) -> float:
    """Two-sided exact McNemar p-value from the discordant counts."""
    n = only_a + only_b
    if n == 0:
        return 1.0
    tail = sum(math.comb(n, i) for i in range(min(only_a, only_b) + 1)) / 2**n
    return min(1.0, 2 * tail)


@dataclass(frozen=True)
class BootstrapResult:
    diff: float
    ci_low: float
    ci_high: float
    p_value: float


def paired_bootstrap(
    diffs_by_task: Sequence[Sequence[float]],
    *,
    resamples: int = BOOTSTRAP_RESAMPLES,
    seed: int = 0,
) -> BootstrapResult | None:
    """Bootstrap the mean paired difference, resampling whole tasks.

    ``diffs_by_task[i]`` holds the per-pair differences (B - A) of task i. Each resample draws
    tasks with replacement and averages all their pairs. The p-value is the two-sided
    percentile p: twice the smaller share of resampled means on either side of zero. The seed
    is fixed so that a report is reproducible."""
    tasks = [list(d) for d in diffs_by_task if d]
    if not tasks:
        return None
    sums = [sum(d) for d in tasks]
    sizes = [len(d) for d in tasks]
    observed = sum(sums) / sum(sizes)
    rng = random.Random(seed)
    tasks_drawn = range(len(tasks))
    means = []
    # choices and map, not a loop of randrange: this is most of re-rendering a report.
    for _ in range(resamples):
        picks = rng.choices(tasks_drawn, k=len(tasks))
        means.append(sum(map(sums.__getitem__, picks)) / sum(map(sizes.__getitem__, picks)))
    means.sort()
    low = means[int(0.025 * resamples)]
    high = means[min(resamples - 1, int(0.975 * resamples))]
    below = sum(1 for m in means if m <= 0) / resamples
    above = sum(1 for m in means if m >= 0) / resamples
    return BootstrapResult(observed, low, high, min(1.0, 2 * min(below, above)))


def median(values: Sequence[float]) -> float | None:
    return statistics.median(values) if values else None


def decimal_mean(values: Sequence[Decimal]) -> Decimal | None:
    return sum(values, Decimal(0)) / len(values) if values else None


def decimal_median(values: Sequence[Decimal]) -> Decimal | None:
    return statistics.median(values) if values else None


def pareto_front(points: Sequence[tuple[Decimal, float]]) -> list[int]:
    """Indices of the points no other point beats: cheaper-or-equal and at-least-as-successful,
    strictly better in one. Sorted by cost."""
    front = []
    for i, (cost, rate) in enumerate(points):
        dominated = any(
            c <= cost and r >= rate and (c < cost or r > rate)
            for j, (c, r) in enumerate(points)
            if j != i
        )
        if not dominated:
            front.append(i)
    return sorted(front, key=lambda i: (points[i][0], -points[i][1]))

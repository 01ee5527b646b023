"""From trial records to the ``stayer eval --json`` document.

    {"configs": [{"model", "policy", "trials", "successes", "success_rate", "ci_low",
                  "ci_high", "pass_at_k": {k: …}, "pass_hat_k": {k: …}, "mean_cost_usd",
                  "cost_per_success_usd", "infra_errors", …}],
     "comparisons": [{"a", "b", "test", "p_value", "significant", …}],
     "pareto": [{"model", "policy", "mean_cost_usd", "success_rate"}],
     "tasks": [{"task", "results": {config id: {"successes", "trials", "infra_errors"}}}],
     "infra_trials": [{"task", "config_key", "epoch", "run_id", "reason"}]}

Scores count only judged trials: infrastructure errors are reported in ``infra_errors`` and
left out of every rate. ``total_cost_usd`` is everything the configuration spent: every
trial, infrastructure errors and the earlier attempts of trials that were run again
included. Money is a decimal string; ``"unknown"`` when a trial's model has
no price data (a mean over unknown amounts is unknown, not zero).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from decimal import Decimal
from itertools import combinations
from typing import Any

from stayer.eval import stats
from stayer.eval.records import (
    Bootstrap,
    Cell,
    Comparison,
    ConfigRef,
    ConfigSummary,
    EarlierAttempt,
    EvalSummary,
    InfraTrial,
    ParetoPoint,
    TaskResults,
    TrialRecord,
    as_trials,
)
from stayer.eval.runner import ERROR_CLASSES, INFRASTRUCTURE, EvalConfig, infra_reason
from stayer.eval.verify import passes
from stayer.money import UNKNOWN

_MONEY_PLACES = Decimal("1e-10")


def money(amount: Decimal | None) -> str | None:
    """A decimal string without exponent; means are rounded to 1e-10 USD."""
    if amount is None:
        return None
    return format(amount.quantize(_MONEY_PLACES).normalize(), "f")


def _scored(records: Sequence[TrialRecord]) -> list[TrialRecord]:
    return [r for r in records if r.error_class != INFRASTRUCTURE]


def succeeded(record: TrialRecord) -> bool:
    """Scored by the verifier's reward, never by why the agent stopped."""
    return record.error_class != INFRASTRUCTURE and passes(record.reward)


def _costs(records: Sequence[TrialRecord | EarlierAttempt]) -> list[Decimal] | None:
    """Every record's cost, or None if any is unknown."""
    costs = [r.cost.amount for r in records]
    return None if any(c is None for c in costs) else [c for c in costs if c is not None]


def _total_spent(records: Sequence[TrialRecord]) -> Decimal | None:
    """What the configuration's trials cost, attempts that were run again included; None
    if any amount is unknown."""
    costs = _costs([a for r in records for a in r.attempts()])
    return None if costs is None else sum(costs, Decimal(0))


def _ref(config: EvalConfig) -> ConfigRef:
    return ConfigRef(
        id=config.key, label=config.label, model=config.model, policy=config.policy_name
    )


def config_summary(
    config: EvalConfig, records: Sequence[TrialRecord], epochs: int
) -> ConfigSummary:
    scored = _scored(records)
    n = len(scored)
    successes = sum(1 for r in scored if succeeded(r))
    low, high = stats.wilson_interval(successes, n) if n else (None, None)
    per_task: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for r in scored:
        per_task[r.task][0] += 1
        per_task[r.task][1] += int(succeeded(r))
    counts = [(t, c) for t, c in per_task.values()]
    costs = _costs(scored)
    spent = _total_spent(records)
    tokens = [r.tokens for r in scored]
    classes = {c: sum(1 for r in records if r.error_class == c) for c in ERROR_CLASSES}
    total = sum(costs, Decimal(0)) if costs is not None else None
    return ConfigSummary(
        id=config.key,
        label=config.label,
        model=config.model,
        policy=config.policy_name,
        settings=config.settings(),
        trials=n,
        successes=successes,
        success_rate=successes / n if n else None,
        ci_low=low,
        ci_high=high,
        pass_at_k={
            str(k): stats.mean_over_tasks(counts, k, stats.pass_at_k) for k in range(1, epochs + 1)
        },
        pass_hat_k={
            str(k): stats.mean_over_tasks(counts, k, stats.pass_hat_k) for k in range(1, epochs + 1)
        },
        mean_tokens=sum(tokens) / n if n else None,
        median_tokens=stats.median(tokens),
        mean_cost_usd=UNKNOWN if costs is None else money(stats.decimal_mean(costs)),
        median_cost_usd=UNKNOWN if costs is None else money(stats.decimal_median(costs)),
        total_cost_usd=UNKNOWN if spent is None else money(spent),
        cost_per_success_usd=(
            UNKNOWN if total is None else money(total / successes) if successes else None
        ),
        mean_steps=sum(r.steps for r in scored) / n if n else None,
        mean_wall_s=sum(r.wall_s for r in scored) / n if n else None,
        infra_errors=classes[INFRASTRUCTURE],
        error_classes=classes,
        tasks=len(per_task),
    )


def compare(
    a: EvalConfig,
    b: EvalConfig,
    records_a: Sequence[TrialRecord],
    records_b: Sequence[TrialRecord],
) -> Comparison:
    """Paired comparison of B against A on the (task, epoch) units both judged; see
    ``stats`` for why McNemar decides with one epoch and the task bootstrap with more."""
    by_unit_a = {(r.task, r.epoch): r for r in _scored(records_a)}
    by_unit_b = {(r.task, r.epoch): r for r in _scored(records_b)}
    units = sorted(by_unit_a.keys() & by_unit_b.keys())
    success_diffs: dict[str, list[float]] = defaultdict(list)
    cost_diffs: dict[str, list[float]] = defaultdict(list)
    only_a = only_b = 0
    paired_cost: list[Decimal] | None = []
    for unit in units:
        ra, rb = by_unit_a[unit], by_unit_b[unit]
        sa, sb = succeeded(ra), succeeded(rb)
        only_a += sa and not sb
        only_b += sb and not sa
        success_diffs[unit[0]].append(float(sb) - float(sa))
        ca, cb = ra.cost.amount, rb.cost.amount
        if paired_cost is not None and ca is not None and cb is not None:
            d = cb - ca
            paired_cost.append(d)
            cost_diffs[unit[0]].append(float(d))
        else:
            paired_cost = None
    mcnemar_p = stats.mcnemar_exact(only_a, only_b)
    boot = stats.paired_bootstrap(list(success_diffs.values()))
    several = any(len(d) > 1 for d in success_diffs.values())
    test, p = (
        ("paired_bootstrap_tasks", boot.p_value)
        if several and boot
        else ("mcnemar_exact", mcnemar_p)
    )
    significant = p < stats.ALPHA
    cost_boot = stats.paired_bootstrap(list(cost_diffs.values())) if paired_cost else None
    diff = sum(sum(d) for d in success_diffs.values()) / len(units) if units else None
    return Comparison(
        a=_ref(a),
        b=_ref(b),
        pairs=len(units),
        tasks=len(success_diffs),
        a_only=only_a,
        b_only=only_b,
        success_diff=diff,
        test=test,
        p_value=p,
        significant=significant,
        verdict=(
            f"{'significant' if significant else 'not significant'} at {stats.ALPHA:g} "
            f"({test}, p = {p:.3g})"
        ),
        mcnemar_p=mcnemar_p,
        bootstrap=None
        if boot is None
        else Bootstrap(
            diff=boot.diff, ci_low=boot.ci_low, ci_high=boot.ci_high, p_value=boot.p_value
        ),
        cost_diff_usd=UNKNOWN if paired_cost is None else money(stats.decimal_mean(paired_cost)),
        cost_diff_ci_usd=None
        if cost_boot is None
        else [money(Decimal(repr(cost_boot.ci_low))), money(Decimal(repr(cost_boot.ci_high)))],
    )


def pareto(summaries: Sequence[ConfigSummary]) -> list[ParetoPoint]:
    """Configurations on the cost–success frontier (mean cost per trial vs success rate)."""
    priced = [
        (Decimal(s.mean_cost_usd), s.success_rate, s)
        for s in summaries
        if s.mean_cost_usd not in (UNKNOWN, None) and s.success_rate is not None
    ]
    front = stats.pareto_front([(cost, rate) for cost, rate, _ in priced])
    return [
        ParetoPoint(
            id=s.id,
            label=s.label,
            model=s.model,
            policy=s.policy,
            mean_cost_usd=s.mean_cost_usd,
            success_rate=s.success_rate,
            cost_per_success_usd=s.cost_per_success_usd,
        )
        for s in (priced[i][2] for i in front)
    ]


def summarise(
    records: Sequence[TrialRecord | dict[str, Any]], configs: Sequence[EvalConfig], epochs: int
) -> EvalSummary:
    """The document's scores from the trials' records (or their JSON documents)."""
    trials = as_trials(records)
    by_config = {c.key: [r for r in trials if r.config_key == c.key] for c in configs}
    summaries = [config_summary(c, by_config[c.key], epochs) for c in configs]
    grid: dict[str, dict[str, Cell]] = defaultdict(lambda: {c.key: Cell() for c in configs})
    for r in trials:
        cell = grid[r.task][r.config_key]
        if r.error_class == INFRASTRUCTURE:
            cell.infra_errors += 1
        else:
            cell.trials += 1
            cell.successes += int(succeeded(r))
    return EvalSummary(
        configs=summaries,
        comparisons=[
            compare(a, b, by_config[a.key], by_config[b.key]) for a, b in combinations(configs, 2)
        ],
        pareto=pareto(summaries),
        tasks=[TaskResults(task=t, results=grid[t]) for t in sorted(grid)],
        infra_trials=[
            InfraTrial(
                task=r.task,
                config_key=r.config_key,
                epoch=r.epoch,
                run_id=r.run_id,
                reason=infra_reason(r),
            )
            for r in trials
            if r.error_class == INFRASTRUCTURE
        ],
    )

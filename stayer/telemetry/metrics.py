"""Prometheus metrics of the runtime (``prometheus-client``), named by its conventions:
base units (USD, seconds, tokens), ``_total`` for counters, no run ids on counters.

Two sources, so that every figure has one owner:

* ``ServiceCollector`` (``stayer serve``'s ``/metrics``) reads the runtime's tables at
  scrape time: cost and tokens by tenant, model and task (what the runs' ledgers add up
  to, exactly, whichever worker ran them and however often processes restarted), runs by
  status, tenants' budgets, runs waiting for a person. Every API process of one database
  reports the same totals: scrape one, or aggregate with ``max``, not ``sum``.
* ``WorkerMetrics`` (``stayer worker --metrics-port``, and the embedded worker of
  ``serve``) observes steps as they happen: step latency and cost histograms, cache breaks
  by reason (from the forensics), compactions' savings, leases lost.

Details and rationale: docs/notes.md, ``stayer/telemetry/metrics.py``.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterator
from decimal import Decimal
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from stayer.ledger import LedgerEntry, TokenTotals
from stayer.money import MTOK
from stayer.records import from_json

TOKEN_KINDS = ("input_uncached", "cache_read", "cache_write", "output", "reasoning")
#: Cache breaks nobody chose: a prompt that changed under its cache (an edited prefix,
#: re-ordered tools), a pause past the cache's lifetime, a provider that read less.
#: Compactions and model switches are planned; a prompt below the minimum cannot be cached.
AVOIDABLE = frozenset({"prefix_edit", "tools_changed", "ttl_expired", "unknown"})
# Buckets of one step's cost in USD: a cent's fractions up to a few dollars.
COST_BUCKETS = (
    0.0001,
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
)


def token_counts(usage: TokenTotals | dict[str, Any]) -> dict[str, int]:
    """A run's tokens (or a ledger usage document) as the exported token kinds."""
    u = usage if isinstance(usage, TokenTotals) else from_json(usage, TokenTotals)
    read, write = u.cache_read_tokens, u.cache_write_tokens
    return {
        "input_uncached": max(u.input_tokens - read - write, 0),
        "cache_read": read,
        "cache_write": write,
        "output": u.output_tokens,
        "reasoning": u.reasoning_tokens,
    }


def hit_ratios(tokens_by: dict[tuple[str, str, str, str], int]) -> GaugeMetricFamily:
    """Cache reads over all prompt tokens, by tenant and model, over the runs so far (the
    alerts compute the same ratio over windows from ``stayer_tokens_total``)."""
    ratio = GaugeMetricFamily(
        "stayer_cache_hit_ratio",
        "Share of prompt tokens read from the cache (0-1)",
        labels=["tenant", "model"],
    )
    read: dict[tuple[str, str], int] = defaultdict(int)
    prompt: dict[tuple[str, str], int] = defaultdict(int)
    for (tenant, model, _task, kind), n in tokens_by.items():
        if kind in ("cache_read", "cache_write", "input_uncached"):
            prompt[(tenant, model)] += n
        if kind == "cache_read":
            read[(tenant, model)] += n
    for key, total in sorted(prompt.items()):
        if total:
            ratio.add_metric(list(key), read[key] / total)
    return ratio


class ServiceCollector:
    """Computed from the runtime's tables at each scrape (see the module docstring)."""

    def __init__(self, db: Callable[[], Any], budgets: Callable[[], Any]) -> None:
        self.db = db  # () -> ServiceDB of the calling thread
        self.budgets = budgets  # () -> TenantBudgets

    def describe(self) -> list[Metric]:
        return []  # collected on demand; nothing to check at registration

    def collect(self) -> Iterator[Metric]:
        db = self.db()
        cost = CounterMetricFamily(
            "stayer_cost_usd",
            "Spend of the runtime's runs, as their ledgers add up",
            labels=["tenant", "model", "task"],
        )
        tokens = CounterMetricFamily(
            "stayer_tokens",
            "Tokens of the runtime's runs by kind",
            labels=["tenant", "model", "task", "kind"],
        )
        unpriced = CounterMetricFamily(
            "stayer_unpriced_runs",
            "Runs with a step whose price is unknown (not in stayer_cost_usd_total)",
            labels=["tenant", "model"],
        )
        runs = GaugeMetricFamily("stayer_runs", "Runs by status", labels=["tenant", "status"])
        cost_by: dict[tuple[str, str, str], Decimal] = defaultdict(Decimal)
        tokens_by: dict[tuple[str, str, str, str], int] = defaultdict(int)
        unpriced_by: dict[tuple[str, str], int] = defaultdict(int)
        status_by: dict[tuple[str, str], int] = defaultdict(int)
        for r in db.all_runs():
            key = (r.tenant, r.model, r.task)
            if r.cost_usd == "unknown":
                unpriced_by[(r.tenant, r.model)] += 1
            else:
                cost_by[key] += Decimal(r.cost_usd)
            for kind, n in token_counts(r.usage).items():
                tokens_by[(*key, kind)] += n
            status_by[(r.tenant, r.status)] += 1
        for k, v in sorted(cost_by.items()):
            cost.add_metric(list(k), float(v))
        for k2, n in sorted(tokens_by.items()):
            tokens.add_metric(list(k2), n)
        for k3, n in sorted(unpriced_by.items()):
            unpriced.add_metric(list(k3), n)
        for k4, n in sorted(status_by.items()):
            runs.add_metric(list(k4), n)
        yield from (cost, tokens, unpriced, runs)
        yield hit_ratios(tokens_by)

        cap = GaugeMetricFamily(
            "stayer_tenant_budget_usd", "A tenant's budget (absent: unlimited)", labels=["tenant"]
        )
        spent = GaugeMetricFamily(
            "stayer_tenant_spent_usd", "What a tenant's finished runs spent", labels=["tenant"]
        )
        held = GaugeMetricFamily(
            "stayer_tenant_held_usd",
            "Held for a tenant's admitted runs (their caps)",
            labels=["tenant"],
        )
        left = GaugeMetricFamily(
            "stayer_tenant_budget_remaining_usd",
            "A tenant's budget not spent or held",
            labels=["tenant"],
        )
        budgets = self.budgets()
        for name, _created in db.tenants():
            a = budgets.account(name)
            spent.add_metric([name], float(a.spent))
            held.add_metric([name], float(a.reserved))
            if a.cap is not None:
                cap.add_metric([name], float(a.cap))
                left.add_metric([name], float(a.available))
        yield from (cap, spent, held, left)

        run_left = GaugeMetricFamily(
            "stayer_run_budget_remaining_usd",
            "Cap minus spend of runs not finished",
            labels=["tenant", "run_id"],
        )
        waiting = GaugeMetricFamily(
            "stayer_requires_action_oldest_seconds",
            "How long the oldest run waiting for a person has waited",
            labels=["tenant"],
        )
        oldest: dict[str, float] = {}
        for r in db.active_runs():
            if r.run_cap is not None and r.cost_usd != "unknown":
                run_left.add_metric(
                    [r.tenant, r.id], float(Decimal(r.run_cap) - Decimal(r.cost_usd))
                )
            if r.status == "requires_action":
                oldest[r.tenant] = max(oldest.get(r.tenant, 0.0), db.seconds_since(r.updated_at))
        for tenant, seconds in sorted(oldest.items()):
            waiting.add_metric([tenant], seconds)
        yield from (run_left, waiting)


class WorkerMetrics:
    """What a worker observes as steps happen, in its own registry (no global state)."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.step_latency = Histogram(
            "stayer_step_latency_seconds", "Model call latency per step", ["model"], registry=r
        )
        self.step_cost = Histogram(
            "stayer_step_cost_usd", "Cost of one step", ["model"], buckets=COST_BUCKETS, registry=r
        )
        self.cache_breaks = Counter(
            "stayer_cache_breaks",
            "Steps whose prompt missed the cache, by the forensics' reason",
            ["reason"],
            registry=r,
        )
        self.avoidable = Counter(
            "stayer_avoidable_cost_usd",
            "What cache misses nobody chose cost above reading the reusable prefix, by reason",
            ["reason"],
            registry=r,
        )
        self.compaction_saved = Counter(
            "stayer_compaction_tokens_saved", "Context tokens removed by compactions", registry=r
        )
        self.leases_lost = Counter(
            "stayer_worker_leases_lost",
            "Runs this worker lost to another (it stalled past its lease)",
            registry=r,
        )
        self.active = Gauge(
            "stayer_worker_runs_active", "Runs this worker is executing", registry=r
        )

    def on_step(
        self, entry: LedgerEntry, previous: LedgerEntry | None = None, prices: Any = None
    ) -> None:
        """A ledger entry (``agent.LedgerEntry``) of a step just made; ``previous`` is the
        same run's step before it (what the cache could have served)."""
        model = entry.model
        extra = avoidable_cost(entry, previous, prices) if prices is not None else None
        if extra and entry.cache_break:
            self.avoidable.labels(entry.cache_break.reason).inc(float(extra))
        if entry.latency_s is not None:
            self.step_latency.labels(model).observe(entry.latency_s)
        if entry.cost.total is not None:
            self.step_cost.labels(model).observe(float(entry.cost.total))
        if entry.cache_break:
            self.cache_breaks.labels(entry.cache_break.reason).inc()
        if entry.compaction:
            saved = entry.compaction.tokens_before - entry.compaction.tokens_after
            self.compaction_saved.inc(max(saved, 0))


def avoidable_cost(entry: LedgerEntry, previous: LedgerEntry | None, prices: Any) -> Decimal | None:
    """What a step's unchosen cache miss cost above reading what the cache could have
    served (the previous prompt, less what was read), from the forensics' verdict and the
    same prices as the ledger. None when the miss was chosen or cannot be priced."""
    from stayer.models.caching import cache_rules, miss_premium

    br = entry.cache_break
    if not br or br.reason not in AVOIDABLE or previous is None or not previous.context_tokens:
        return None
    missed = max(0, previous.context_tokens - entry.usage.cache_read_tokens)
    c = entry.cost
    rates = prices.rates(c.model_ref, c.provider, c.tier, entry.context_tokens)
    if rates is None:
        return None
    try:
        rules = cache_rules(c.provider or "", c.model_ref)
    except ValueError:
        return None
    return Decimal(missed) * miss_premium(rules, rates) / MTOK

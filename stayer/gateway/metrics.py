"""The gateway's Prometheus metrics (``/metrics``), in its own registry: calls and their
cost by tenant and model, cache breaks and what they cost over a hit
(``stayer_cache_miss_cost_usd_total``) by reason, refusals (``key``, ``session``,
``budget``, ``breaker``) and breaker trips by reason."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

from prometheus_client import CollectorRegistry, Counter

from stayer.context.forensics import CacheBreak
from stayer.money import Usd

_COUNTERS = (  # name, help, labels: in the order GatewayMetrics unpacks them
    ("stayer_gateway_calls", "Calls metered by the gateway", ("tenant", "model")),
    ("stayer_gateway_cost_usd", "What the gateway's calls were charged", ("tenant", "model")),
    ("stayer_cache_breaks", "Calls that missed the cache, by reason", ("reason",)),
    (
        "stayer_cache_miss_cost_usd",
        "What cache misses cost over a hit, by the forensics' reason",
        ("reason",),
    ),
    ("stayer_gateway_refused", "Calls refused before the upstream, by reason", ("reason",)),
    ("stayer_gateway_breaker_trips", "Sessions stopped by a breaker", ("reason",)),
)


class GatewayMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = r = registry or CollectorRegistry()
        (self.calls, self.cost, self.breaks, self.miss_cost, self.refused, self.trips) = (
            Counter(name, doc, labels, registry=r) for name, doc, labels in _COUNTERS
        )

    def observe(
        self,
        tenant: str,
        model: str,
        charged: Decimal | None,
        verdict: CacheBreak | None,
        trips: list[Any],
    ) -> None:
        self.calls.labels(tenant, model).inc()
        if charged is not None:
            self.cost.labels(tenant, model).inc(float(charged))
        if verdict is not None:
            reason = verdict.reason
            self.breaks.labels(reason).inc()
            if isinstance(verdict.cost, Usd) and verdict.cost.amount:
                self.miss_cost.labels(reason).inc(float(verdict.cost.amount))
        for t in trips:
            self.trips.labels(t.reason).inc()

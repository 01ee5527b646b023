"""The gateway's Prometheus metrics (``/metrics``), in its own registry: calls and their
cost by tenant and model, cache breaks and what they cost over a hit
(``stayer_cache_miss_cost_usd_total``) by reason, refusals and breaker trips by reason."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

from prometheus_client import CollectorRegistry, Counter

from stayer.context.forensics import CacheBreak
from stayer.money import Usd


class GatewayMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = r = registry or CollectorRegistry()
        self.calls = Counter(
            "stayer_gateway_calls", "Calls metered by the gateway", ["tenant", "model"], registry=r
        )
        self.cost = Counter(
            "stayer_gateway_cost_usd",
            "What the gateway's calls were charged",
            ["tenant", "model"],
            registry=r,
        )
        self.breaks = Counter(
            "stayer_cache_breaks", "Calls that missed the cache, by reason", ["reason"], registry=r
        )
        self.miss_cost = Counter(
            "stayer_cache_miss_cost_usd",
            "What cache misses cost over a hit, by the forensics' reason",
            ["reason"],
            registry=r,
        )
        self.refused = Counter(
            "stayer_gateway_refused", "Calls refused before the upstream, by reason", ["reason"],
            registry=r,
        )  # fmt: skip
        self.trips = Counter(
            "stayer_gateway_breaker_trips", "Sessions stopped by a breaker", ["reason"], registry=r
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

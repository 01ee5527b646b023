"""A run's ``--config`` file, validated up front and turned into a router at run time.

Everything is checked before the run starts (so bad input writes nothing): the file's
keys, every model it names (buildable, and priced when there is a cost cap — a cap cannot
be enforced on a model whose prices are unknown), and that simulated and real models are
not mixed (a ``sim:`` run must never reach a real provider).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path

from stayer.errors import ConfigError
from stayer.guard.breakers import GuardConfig
from stayer.models.base import Model
from stayer.pricing import PriceBook
from stayer.routing.config import StayerConfig, SubagentsSection, load_config
from stayer.routing.router import Router, price_unknown


@dataclass
class RoutingSetup:
    path: str
    config: StayerConfig
    models: dict[str, Model] = field(default_factory=dict)  # every named model but the main one

    def router(self, main: Model, wrap: Callable[[Model], Model], prices: PriceBook, service_tier: str | None) -> Router:
        """The run's router; ``wrap`` is applied to every model (the journal's wrapper)."""
        return Router.from_config(self.config, main, lambda spec: wrap(self.models[spec]), prices, service_tier)

    @property
    def guard(self) -> GuardConfig:
        return self.config.guard.to_guard()

    @property
    def subagents(self) -> SubagentsSection | None:
        return self.config.subagents


def prepare_routing(
    path: str | None,
    main_spec: str,
    build: Callable[[str], Model],
    prices: PriceBook,
    max_cost: Decimal | None,
) -> RoutingSetup | None:
    if path is None:
        return None
    config = load_config(path)
    if config.models.main and config.models.main != main_spec:
        raise ConfigError(f"{path}: models.main = {config.models.main!r} but --model is {main_spec!r}; drop one of them")
    models: dict[str, Model] = {}
    for spec in config.model_specs():
        if spec == main_spec:
            continue
        if spec.startswith("sim:") != main_spec.startswith("sim:"):
            raise ConfigError(
                f"{path}: model {spec!r} mixes simulated and real models (--model is {main_spec!r}); "
                "name sim: models throughout, or none"
            )
        try:
            models[spec] = build(spec)
        except ConfigError as e:
            raise ConfigError(f"{path}: model {spec!r}: {e}") from None
    unknown = price_unknown(list(models.values()), prices)
    if max_cost is not None and unknown:
        raise ConfigError(
            f"{path}: no price data for {', '.join(unknown)}, so --max-cost cannot be enforced; "
            "add its prices to stayer-prices.toml or drop --max-cost"
        )
    return RoutingSetup(str(Path(path)), config, models)

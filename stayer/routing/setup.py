"""A run's ``--config`` file, validated up front and turned into a router at run time.

Everything is checked before the run starts (so bad input writes nothing): the file's
keys, every model it names (buildable, and — ``require_prices`` — priced at every tier the
run may use when there is a cost cap: a cap cannot be enforced on a call whose price is
unknown), and that simulated and real models are not mixed (a ``sim:`` run must never
reach a real provider).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from stayer.errors import ConfigError
from stayer.guard.breakers import GuardConfig
from stayer.models.base import Model
from stayer.pricing import PriceBook
from stayer.routing.router import Router
from stayer.settings import StayerConfig, SubagentsSection, load_config


@dataclass
class RoutingSetup:
    path: str
    config: StayerConfig
    models: dict[str, Model] = field(default_factory=dict)  # every named model but the main one

    def router(
        self,
        main: Model,
        wrap: Callable[[Model], Model],
        prices: PriceBook,
        service_tier: str | None,
    ) -> Router:
        """The run's router; ``wrap`` is applied to every model (the journal's wrapper)."""
        return Router.from_config(
            self.config, main, lambda spec: wrap(self.models[spec]), prices, service_tier
        )

    @property
    def guard(self) -> GuardConfig:
        return self.config.guard

    @property
    def subagents(self) -> SubagentsSection | None:
        return self.config.subagents


def prepare_routing(
    path: str | None,
    main_spec: str,
    build: Callable[[str], Model],
) -> RoutingSetup | None:
    if path is None:
        return None
    config = load_config(path)
    if config.models.main and config.models.main != main_spec:
        raise ConfigError(
            f"{path}: models.main = {config.models.main!r} but --model is {main_spec!r}; drop one of them"
        )
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
    return RoutingSetup(str(Path(path)), config, models)


def require_prices(
    prices: PriceBook, main: Model, service_tier: str | None, routing: RoutingSetup | None
) -> None:
    """Under a cost cap, every call the run could make must be priced: a call whose price
    is unknown cannot be held against the cap, so it would switch the cap off.

    The run calls the main model and every model ``--config`` names (roles, cascade,
    failover targets, the summariser, sub-agents) at ``service_tier`` (``--service-tier``;
    sub-agents and the wrap-up inherit it), and at the standard tier (the summariser's
    calls, and where a tier policy finds no priced tier; a tier policy only ever picks
    priced tiers). ConfigError (one line) names each unpriced model, where it is named
    and the tier, before anything is written or called."""
    named: list[tuple[Model, str | None]] = [(main, None)]
    if routing is not None:
        roles = routing.config.model_roles()
        named += [(m, ", ".join(roles.get(spec, ()))) for spec, m in routing.models.items()]
    missing: list[str] = []
    tier_tables: list[str] = []  # the override tables that would price the missing tiers
    from_file = False  # some model named in --config is among them: the error names the file
    for model, role in named:
        name = model.spec if role is None else f"{model.spec} ({role})"
        if not prices.knows(model.model_id, model.provider):
            missing.append(name)
        elif service_tier is not None and not prices.knows(
            model.model_id, model.provider, service_tier
        ):
            missing.append(f"{name} at service tier {service_tier!r}")
            tier_tables.append(f"tiers.{model.provider}.{service_tier}")
        else:
            continue
        from_file = from_file or role is not None
    if not missing:
        return
    fixes = ["add its prices to stayer-prices.toml"] if len(tier_tables) < len(missing) else []
    if tier_tables:
        fixes.append(
            f"add a {' / '.join(dict.fromkeys(tier_tables))} multiplier to stayer-prices.toml"
        )
    drop = "--service-tier or --max-cost" if tier_tables else "--max-cost"
    fix = f"{' and '.join(fixes)}, or drop {drop}" if tier_tables else f"{fixes[0]} or drop {drop}"
    where, what = (
        (routing.path, "--max-cost") if from_file and routing else ("--max-cost", "a cost cap")
    )
    raise ConfigError(
        f"{where}: no price data for {', '.join(missing)}, so {what} cannot be enforced; {fix}"
    )

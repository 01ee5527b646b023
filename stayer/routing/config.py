"""``stayer.toml``: which model plays which role, the cascade, tiers, failover, breakers.

Example::

    [models]
    planning = "sim:claude-sonnet-4-5"   # the first ``planning_steps`` steps
    planning_steps = 3
    execution = "sim:claude-haiku-4-5"   # every step after (default: --model)
    summariser = "sim:claude-haiku-4-5"  # compaction summaries
    subagent = "sim:claude-haiku-4-5"    # what the `subagent` tool runs

    [cascade]                            # start cheap, escalate on failure signals
    models = ["sim:claude-haiku-4-5", "sim:claude-sonnet-4-5"]
    escalate_after_errors = 2            # consecutive failed steps
    escalate_on_loop = true              # a loop / no-progress breaker trip
    escalate_after_failing_tests = 2     # consecutive failing test runs
    relax_after = 5                      # good steps before stepping down (a priced switch)

    [routing]
    cache_aware = true                   # price every optional switch against the cache

    [tiers]
    latency_target_s = 20                # cheapest service tier whose modelled latency fits
    batch = false                        # or: the batch/flex tier, latency be what it may

    [failover]                           # after the adapter's retries fail
    "anthropic:claude-sonnet-4-5" = ["openai:gpt-5"]

    [subagents]                          # offer the `subagent` tool
    max_steps = 20
    budget_fraction = 0.25               # default slice when the model names no budget
    max_depth = 1

    [guard]                              # breakers (stayer.guard.breakers.GuardConfig)
    max_tokens = 2000000
    max_wall_s = 3600
    soft_fraction = 0.8
    wrapup_steps = 2

Any key not listed here is an error naming the file and the key (a typo must not be a
silently ignored setting).
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from stayer.errors import ConfigError
from stayer.guard.breakers import GuardConfig


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ModelsSection(_Section):
    main: str | None = None
    planning: str | None = None
    planning_steps: int = Field(3, ge=0)
    execution: str | None = None
    summariser: str | None = None
    subagent: str | None = None


class CascadeSection(_Section):
    models: list[str] = Field(min_length=1)
    escalate_after_errors: int = Field(2, ge=0)
    escalate_on_loop: bool = True
    escalate_after_failing_tests: int = Field(2, ge=0)
    relax_after: int = Field(5, ge=0)


class RoutingSection(_Section):
    cache_aware: bool = True


class TiersSection(_Section):
    latency_target_s: float | None = Field(None, gt=0)
    batch: bool = False


class SubagentsSection(_Section):
    max_steps: int = Field(20, ge=1)
    budget_fraction: float = Field(0.25, gt=0, le=1)
    max_depth: int = Field(1, ge=1)


class GuardSection(_Section):
    max_tokens: int | None = Field(None, ge=1)
    max_wall_s: float | None = Field(None, gt=0)
    max_tool_errors: int = Field(5, ge=0)
    loop_repeats: int = Field(4, ge=0)
    no_change_steps: int = Field(20, ge=0)
    anomaly_factor: float = Field(10.0, ge=0)
    anomaly_window: int = Field(5, ge=1)
    soft_fraction: float = Field(0.8, gt=0, le=1)
    wrapup_steps: int = Field(2, ge=1)
    wrapup_output_tokens: int = Field(1024, ge=256)

    def to_guard(self) -> GuardConfig:
        return GuardConfig(**self.model_dump())


class StayerConfig(_Section):
    models: ModelsSection = ModelsSection()
    cascade: CascadeSection | None = None
    routing: RoutingSection = RoutingSection()
    tiers: TiersSection = TiersSection()
    failover: dict[str, list[str]] = Field(default_factory=dict)
    subagents: SubagentsSection | None = None
    guard: GuardSection = GuardSection()

    def model_specs(self) -> list[str]:
        """Every model the file names (each must be buildable and, under a cap, priced)."""
        return list(self.model_roles())

    def model_roles(self) -> dict[str, list[str]]:
        """Every model the file names → where it names it (``models.subagent``,
        ``cascade.models``, ``failover."<primary>"``), in the file's order; for errors."""
        roles: dict[str, list[str]] = {}

        def add(spec: str | None, where: str) -> None:
            if spec:
                roles.setdefault(spec, []).append(where)

        for role in ("main", "planning", "execution", "summariser", "subagent"):
            add(getattr(self.models, role), f"models.{role}")
        for spec in self.cascade.models if self.cascade else []:
            add(spec, "cascade.models")
        for primary, fallbacks in self.failover.items():
            add(primary, "failover")
            for spec in fallbacks:
                add(spec, f'failover."{primary}"')
        return {spec: list(dict.fromkeys(where)) for spec, where in roles.items()}


def load_config(path: str | Path) -> StayerConfig:
    """Parse and validate ``path``; ConfigError (one line, naming the file and key) if bad."""
    p = Path(path)
    try:
        data = tomllib.loads(p.read_text())
    except OSError as e:
        raise ConfigError(f"--config {p}: cannot read it ({e.strerror or e})") from None
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{p}: not valid TOML ({e})") from None
    return parse_config(data, str(p))


def parse_config(data: dict[str, Any], source: str) -> StayerConfig:
    try:
        return StayerConfig.model_validate(data)
    except ValidationError as e:
        err = e.errors()[0]
        key = ".".join(str(part) for part in err["loc"])
        if err["type"] == "extra_forbidden":
            raise ConfigError(f"{source}: unknown key {key!r}; {_allowed(err['loc'])}") from None
        raise ConfigError(f"{source}: {key}: {err['msg']}") from None


def _allowed(loc: tuple[Any, ...]) -> str:
    """The keys allowed where an unknown one was found, to make the fix obvious."""
    model: type[BaseModel] = StayerConfig
    for part in loc[:-1]:
        field = model.model_fields.get(str(part))
        annotation = getattr(field, "annotation", None)
        candidates = [a for a in getattr(annotation, "__args__", (annotation,)) if isinstance(a, type) and issubclass(a, BaseModel)]
        if not candidates:
            return "check the spelling"
        model = candidates[0]
    where = "at the top level" if len(loc) == 1 else f"in section {'.'.join(map(str, loc[:-1]))!r}"
    return f"allowed {where}: {', '.join(model.model_fields)}"

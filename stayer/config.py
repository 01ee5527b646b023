"""``stayer.toml``'s schema: which model plays which role, the cascade, tiers, failover,
sub-agents, breakers. Each section is one pydantic model with its bounds (the types come
from ``stayer.settings``; ``[guard]`` is the guard's own ``GuardConfig``).

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
    "sim:claude-sonnet-4-5" = ["sim:gpt-5"]  # real ones alike: "anthropic:…" = ["openai:…"]

    [subagents]                          # offer the `subagent` tool
    max_steps = 20
    budget_fraction = 0.25               # default slice when the model names no budget
    max_depth = 1

    [mcp.servers.time]                   # MCP servers' tools (stayer.mcp.config)
    command = ["uvx", "mcp-server-time"] # stdio, in the run's sandbox unless trust = "host"

    [guard]                              # breakers (stayer.guard.breakers.GuardConfig)
    max_tokens = 2000000
    max_wall_s = 3600
    soft_fraction = 0.8
    wrapup_steps = 2                     # 0: no wrap-up

Any key not listed here is an error naming the file and the key (a typo must not be a
silently ignored setting).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from stayer.errors import ConfigError
from stayer.guard.breakers import GuardConfig
from stayer.mcp.config import McpSection
from stayer.settings import (
    Fraction,
    Seconds,
    StepCount,
    Steps,
    describe,
    read_toml,
)


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


class ModelsSection(_Section):
    main: str | None = None
    planning: str | None = None
    planning_steps: StepCount = 3
    execution: str | None = None
    summariser: str | None = None
    subagent: str | None = None


class CascadeSection(_Section):
    models: list[str] = Field(min_length=1)
    escalate_after_errors: StepCount = 2
    escalate_on_loop: bool = True
    escalate_after_failing_tests: StepCount = 2
    relax_after: StepCount = 5


class RoutingSection(_Section):
    cache_aware: bool = True


class TiersSection(_Section):
    latency_target_s: Seconds | None = None
    batch: bool = False


class SubagentsSection(_Section):
    max_steps: Steps = 20
    budget_fraction: Fraction = 0.25
    max_depth: int = Field(1, ge=1, le=8)


class StayerConfig(_Section):
    models: ModelsSection = ModelsSection()
    cascade: CascadeSection | None = None
    routing: RoutingSection = RoutingSection()
    tiers: TiersSection = TiersSection()
    failover: dict[str, list[str]] = Field(default_factory=dict)
    subagents: SubagentsSection | None = None
    guard: GuardConfig = GuardConfig()
    mcp: McpSection = McpSection()

    @field_validator("guard", mode="before")
    @classmethod
    def _no_runtime_keys(cls, value: Any) -> Any:
        if isinstance(value, dict) and "pause_at_cap" in value:
            raise ValueError("pause_at_cap is the runtime's to set, not a file's")
        return value

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
    return parse_config(read_toml(p, "--config "), str(p))


def parse_config(data: dict[str, Any], source: str) -> StayerConfig:
    try:
        return StayerConfig.model_validate(data)
    except ValidationError as e:
        err = e.errors()[0]
        key = ".".join(str(part) for part in err["loc"])
        if err["type"] == "extra_forbidden":
            raise ConfigError(f"{source}: unknown key {key!r}; {_allowed(err['loc'])}") from None
        raise ConfigError(describe(e, source)) from None


def _allowed(loc: tuple[Any, ...]) -> str:
    """The keys allowed where an unknown one was found, to make the fix obvious."""
    model: type[BaseModel] = StayerConfig
    for part in loc[:-1]:
        field = model.model_fields.get(str(part))
        annotation = getattr(field, "annotation", None)
        candidates = [
            a
            for a in getattr(annotation, "__args__", (annotation,))
            if isinstance(a, type) and issubclass(a, BaseModel)
        ]
        if not candidates:
            return "check the spelling"
        model = candidates[0]
    where = "at the top level" if len(loc) == 1 else f"in section {'.'.join(map(str, loc[:-1]))!r}"
    allowed = [name for name in model.model_fields if name != "pause_at_cap"]
    return f"allowed {where}: {', '.join(allowed)}"

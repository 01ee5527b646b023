"""Every setting a user hands stayer, its bounds and its default, in one module.

* Bounded types (``Seconds``, ``Steps``, ``Usd``, …): the same value has the same limits
  wherever it is written, a flag, ``task.toml`` or ``stayer.toml`` (docs/settings.md).
* ``RunSettings``: what one run was asked to do, every run default written once; the CLI,
  task files, ``stayer.toml``, the API and eval build it. ``RunFlags`` checks its numbers.
* The pydantic groups of other commands, ``task.toml`` (``TaskToml``) and ``stayer.toml``
  (``StayerConfig``, ``GuardConfig``): a value out of bounds or an unknown key is a
  ``ConfigError`` of one line naming the flag, or the file and the key (exit 2).

NaN, infinities, and booleans or strings where a number belongs are refused everywhere.
"""

from __future__ import annotations

import os
import re
import stat
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from typing import Annotated, Any, Literal, TypedDict, TypeVar, cast

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    StrictBool,
    ValidationError,
    field_validator,
    model_validator,
)

from stayer.choices import (
    DEFAULT_COMMAND_TIMEOUT_S,
    DEFAULT_MAX_STEPS,
    DEFAULT_MCP_TOOLS,
    DEFAULT_POLICY,
)
from stayer.errors import ConfigError

MAX_SECONDS = 7 * 24 * 3600.0
MAX_SIM_LATENCY_S = 3600.0
MIN_MEMORY_MB = 16
MAX_MEMORY_MB = 1 << 20
MAX_STORAGE_MB = 1 << 24
MAX_PROCESSES = 1 << 16
MAX_STEPS = 100_000
MAX_TOKENS = 100_000_000
MAX_USD = Decimal(1_000_000)
MAX_PRICE_PER_MTOK = Decimal(1_000_000)
MAX_EPOCHS = 10_000
MAX_CONCURRENCY = 1_024
MAX_RUN_ID = 128


def _number_only(value: Any) -> Any:
    # Lax pydantic would read ``true`` as 1 and "5" as 5; in a config file both are typos.
    if isinstance(value, bool | str):
        raise ValueError(f"expected a number, got {type(value).__name__}")
    return value


_Num = BeforeValidator(_number_only)
Seconds = Annotated[float, _Num, Field(gt=0, le=MAX_SECONDS, allow_inf_nan=False)]
Latency = Annotated[float, _Num, Field(ge=0, le=MAX_SIM_LATENCY_S, allow_inf_nan=False)]
MemoryMb = Annotated[int, _Num, Field(ge=MIN_MEMORY_MB, le=MAX_MEMORY_MB)]
StorageMb = Annotated[int, _Num, Field(ge=1, le=MAX_STORAGE_MB)]
Processes = Annotated[int, _Num, Field(ge=1, le=MAX_PROCESSES)]
Steps = Annotated[int, _Num, Field(ge=1, le=MAX_STEPS)]
StepCount = Annotated[int, _Num, Field(ge=0, le=MAX_STEPS)]  # zero allowed: "never"
Tokens = Annotated[int, _Num, Field(ge=1, le=MAX_TOKENS)]
TokenCount = Annotated[int, _Num, Field(ge=0, le=MAX_TOKENS)]
Usd = Annotated[Decimal, _Num, Field(gt=0, le=MAX_USD, allow_inf_nan=False, decimal_places=12)]
Price = Annotated[
    Decimal, _Num, Field(ge=0, le=MAX_PRICE_PER_MTOK, allow_inf_nan=False, decimal_places=12)
]
Fraction = Annotated[float, _Num, Field(gt=0, le=1, allow_inf_nan=False)]
Factor = Annotated[float, _Num, Field(ge=0, le=1e6, allow_inf_nan=False)]
Epochs = Annotated[int, _Num, Field(ge=1, le=MAX_EPOCHS)]
Concurrency = Annotated[int, _Num, Field(ge=1, le=MAX_CONCURRENCY)]
Reruns = Annotated[int, _Num, Field(ge=0, le=100)]
WrapupSteps = Annotated[int, _Num, Field(ge=0, le=100)]  # zero: no wrap-up
WrapupTokens = Annotated[int, _Num, Field(ge=256, le=1_000_000)]
MCP_SERVER_NAME = re.compile(r"^[A-Za-z0-9](?:[A-Za-z0-9-]|_(?!_))*$")
_HEADER_NAME = re.compile(r"^[!#$%&'*+.^_`|~0-9A-Za-z-]+$")  # RFC 9110's token
_HEADER_VALUE = re.compile(r"^[\t\x20-\x7e\x80-\xff]*$")  # no CR, LF, NUL or control
_RUN_ID = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9._-]*")


def _run_id(value: str) -> str:
    # The id names a directory under $STAYER_HOME/runs: no separators, no "..", and short
    # enough for any file system's name limit.
    if not _RUN_ID.fullmatch(value) or len(value) > MAX_RUN_ID:
        raise ValueError(
            f"use up to {MAX_RUN_ID} letters, digits, '-', '_' and '.', not starting with '.'"
        )
    return value


RunId = Annotated[str, AfterValidator(_run_id)]


class Settings(BaseModel):
    """A group of settings: unknown names are errors, floats are finite."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


class SandboxLimits(TypedDict, total=False):
    """The limits a sandbox is made with (``make_sandbox``'s keywords): a limit left out
    keeps the backend's default; ``None`` is no limit."""

    allow_net: bool
    memory_mb: int | None
    storage_mb: int | None
    max_processes: int | None
    max_file_mb: int | None


def given_limits(limits: SandboxLimits) -> SandboxLimits:
    """``limits`` less those that are ``None`` (a flag not given): the rest keep their
    defaults."""
    return cast(SandboxLimits, {k: v for k, v in limits.items() if v is not None})


@dataclass(frozen=True)
class RunSettings:
    """What one run was asked to do (``stayer run``, the API, an eval trial), as the journal
    keeps it: every run default, written here once."""

    task_dir: str
    model: str
    max_steps: int = DEFAULT_MAX_STEPS
    max_cost: Decimal | None = None
    run_id: str | None = None
    base_url: str | None = None
    sim_policy: str | None = None
    sim_latency: float = 0.0
    sandbox: str | None = None  # None: task.toml's, else its image's (Dockerfile), else bwrap
    output_token_budget: int = 4096
    command_timeout: float = DEFAULT_COMMAND_TIMEOUT_S
    service_tier: str | None = None
    policy: str = DEFAULT_POLICY
    max_context: int | None = None
    config_file: str | None = None  # stayer.toml: routing, sub-agents, breakers
    team_file: str | None = None  # team.toml: a team of agents instead of one (stayer.teams)
    team: dict[str, Any] | None = None  # or the same inline (the runtime's ``team`` field)
    mcp_servers: dict[str, Any] | None = None  # [mcp.servers] inline (the runtime's field)
    mcp_tools: str = DEFAULT_MCP_TOOLS  # eager | lazy | auto (stayer.mcp.lazy)
    # The run's own mcp_servers may reach non-public addresses (the runtime's
    # --allow-private-webhooks); servers from task.toml and stayer.toml always may.
    allow_private_mcp: bool = False
    # Per-run sandbox limits; None keeps the task's (task.toml [environment]).
    memory_mb: int | None = None
    storage_mb: int | None = None
    max_processes: int | None = None

    def sandbox_overrides(self) -> SandboxLimits:
        """This run's own sandbox limits (``None``: the task's)."""
        return SandboxLimits(
            memory_mb=self.memory_mb, storage_mb=self.storage_mb, max_processes=self.max_processes
        )


class RunFlags(Settings):
    """The bounded numbers of ``RunSettings``, checked as user input (flags, API fields);
    defaults are ``RunSettings``'s."""

    max_steps: Steps = RunSettings.max_steps
    max_cost: Usd | None = RunSettings.max_cost
    sim_latency: Latency = RunSettings.sim_latency
    command_timeout: Seconds = RunSettings.command_timeout
    max_context: Tokens | None = RunSettings.max_context
    memory_mb: MemoryMb | None = RunSettings.memory_mb
    storage_mb: StorageMb | None = RunSettings.storage_mb
    max_processes: Processes | None = RunSettings.max_processes
    run_id: RunId | None = RunSettings.run_id


class SandboxSettings(Settings):
    """``stayer sandbox exec``'s limits (flags named as the sandbox's own)."""

    timeout: Seconds
    memory: MemoryMb | None = None
    max_processes: Processes | None = None
    max_file_mb: StorageMb | None = None
    storage_mb: StorageMb | None = None


class EstimateSettings(Settings):
    """``stayer estimate``: a workload and, without ``--model``, its prices per MTok."""

    steps: Steps
    new_tokens: TokenCount
    output_tokens: TokenCount
    price_miss: Price | None = None
    price_hit: Price | None = None
    price_out: Price | None = None
    price_write: Price | None = None


class EvalSettings(Settings):
    """``stayer eval``: how many trials, how many at once."""

    epochs: Epochs = 1
    concurrency: Concurrency = 4


class CheckSettings(Settings):
    """``stayer tasks check``."""

    reruns: Reruns = 3
    concurrency: Concurrency = 4


class ListSettings(Settings):
    """``stayer runs`` and ``stayer audit``."""

    limit: Annotated[int, _Num, Field(ge=1, le=1_000_000)] = 50
    jobs: Concurrency | None = None


# --- task.toml: Harbor's format, so keys stayer does not use are left alone ----------------


class _TaskSection(BaseModel):
    model_config = ConfigDict(extra="allow", frozen=True, allow_inf_nan=False)


class AgentSection(_TaskSection):
    timeout_sec: Seconds = 600.0


class VerifierSection(_TaskSection):
    timeout_sec: Seconds = 600.0


class EnvironmentSection(_TaskSection):
    allow_internet: StrictBool = False
    # Where the task runs when the run does not say (--sandbox): see stayer.sandbox.KINDS.
    sandbox: Literal["bwrap", "docker", "bwrap-image", "local"] | None = None
    memory_mb: MemoryMb | None = None
    storage_mb: StorageMb | None = None


class TaskToml(_TaskSection):
    agent: AgentSection = AgentSection()
    verifier: VerifierSection = VerifierSection()
    environment: EnvironmentSection = EnvironmentSection()
    metadata: dict[str, Any] = Field(default_factory=dict)


class TerminalBenchTimeouts(_TaskSection):
    """The limits of a Terminal-Bench ``task.yaml`` (its defaults when left out)."""

    max_agent_timeout_sec: Seconds = 360.0
    max_test_timeout_sec: Seconds = 60.0


# --- stayer.toml: the guard's breakers, the router's sections ----


class GuardConfig(Settings):
    """Breaker settings, with their bounds: the ``[guard]`` section of stayer.toml is this
    model. 0 or None turns a breaker off."""

    max_tokens: Tokens | None = None  # input + output tokens over the run
    max_wall_s: Seconds | None = None
    max_tool_errors: StepCount = 5
    loop_repeats: StepCount = 4
    no_change_steps: StepCount = 20
    anomaly_factor: Factor = 10.0
    anomaly_window: Steps = 5
    soft_fraction: Fraction = 0.8
    wrapup_steps: WrapupSteps = 2  # 0: no wrap-up; a limit stops the run where it is
    wrapup_output_tokens: WrapupTokens = 1024
    # A call the cap cannot afford pauses the run (``BudgetReached``) instead of wrapping
    # it up: the runtime's runs wait for a raised cap and resume from the journal. Set by
    # the runtime, never by a file.
    pause_at_cap: StrictBool = False

    @classmethod
    def off(cls) -> GuardConfig:
        """Only the hard limits: for replaying recorded actions (what-if), which no breaker
        or wrap-up instruction could change."""
        return cls(
            max_tool_errors=0,
            loop_repeats=0,
            no_change_steps=0,
            anomaly_factor=0,
            soft_fraction=1.0,
            wrapup_steps=0,
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


class McpServer(BaseModel):
    """One ``[mcp.servers.NAME]`` (``stayer.mcp.config``): stdio or streamable HTTP."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    command: list[str] | None = Field(None, min_length=1)
    env: dict[str, str] = Field(default_factory=dict)
    url: str | None = None
    headers: dict[str, str] = Field(default_factory=dict)
    trust: Literal["sandbox", "host"] = "sandbox"
    startup_timeout_s: float = Field(30.0, gt=0, le=600)
    call_timeout_s: float | None = Field(None, gt=0, le=86_400)

    @field_validator("headers")
    @classmethod
    def _plain_headers(cls, headers: dict[str, str]) -> dict[str, str]:
        for name, value in headers.items():
            if not _HEADER_NAME.match(name):
                raise ValueError(f"header name {name!r} is not an HTTP token")
            if not _HEADER_VALUE.match(value):
                raise ValueError(f"header {name!r}: a value must not hold CR, LF or controls")
        return headers

    @model_validator(mode="after")
    def _one_transport(self) -> McpServer:
        if (self.command is None) == (self.url is None):
            raise ValueError("give either command (stdio) or url (streamable HTTP)")
        if self.url is not None and (self.env or self.trust != "sandbox"):
            raise ValueError("env and trust are for stdio servers (command), not url")
        if self.command is not None and self.headers:
            raise ValueError("headers are for HTTP servers (url), not command")
        if self.url is not None and not self.url.startswith(("http://", "https://")):
            raise ValueError("url must be http:// or https://")
        return self

    @property
    def transport(self) -> str:
        return "stdio" if self.command is not None else "http"

    @property
    def where(self) -> str:
        """Where it runs: ``sandbox``, ``host`` or ``remote`` (HTTP)."""
        return "remote" if self.url is not None else self.trust


class McpSection(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    servers: dict[str, McpServer] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _names(self) -> McpSection:
        for name in self.servers:
            if not MCP_SERVER_NAME.match(name) or name.endswith("_"):
                raise ValueError(
                    f"server name {name!r}: use letters, digits, '-' and single '_' "
                    "(its tools are named NAME__tool)"
                )
        return self


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


# --- checking -------------------------------------------------------------------------------

S = TypeVar("S", bound=BaseModel)


def check_flags(model: type[S], values: Mapping[str, Any]) -> S:
    """``values`` (flag name with ``_`` for ``-`` → value) as ``model``; ConfigError naming
    the first bad flag otherwise."""
    return _validate(model, values, None)


def check_file(model: type[S], data: Mapping[str, Any], source: str) -> S:
    """A parsed file's ``data`` as ``model``; ConfigError naming ``source`` and the key."""
    return _validate(model, data, source)


def _validate(model: type[S], data: Mapping[str, Any], source: str | None) -> S:
    try:
        return model.model_validate(data)
    except ValidationError as e:
        raise ConfigError(describe(e, source)) from None


def describe(e: ValidationError, source: str | None) -> str:
    """The first error of ``e`` as one line: ``--flag VALUE: why`` or ``FILE: key: why``."""
    err = e.errors(include_url=False)[0]
    loc = [str(part) for part in err["loc"]]
    why = err["msg"].removeprefix("Value error, ")
    why = _DECIMAL_REPR.sub(r"\1", why[:1].lower() + why[1:])
    shown = _shown(err.get("input"))
    if source is None:
        flag = "--" + loc[0].replace("_", "-") if loc else "input"
        return f"{flag} {shown}: {why}"
    return f"{source}: {'.'.join(loc)}: {why} (got {shown})"


_DECIMAL_REPR = re.compile(r"Decimal\('([^']*)'\)")


def _shown(value: Any) -> str:
    text = (
        str(value)
        if isinstance(value, int | float | Decimal) and not isinstance(value, bool)
        else repr(value)
    )
    return text if len(text) <= 40 else text[:37] + "..."


def read_text(path: Path, what: str) -> str:
    """A small text file stayer reads as configuration: UTF-8 or a ConfigError naming it.
    Only a regular file is read: a device may never end, a FIFO waits for a writer (opened
    non-blocking, so that neither is waited on)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as e:
        raise ConfigError(f"{what}{path}: cannot read it ({e.strerror or e})") from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise ConfigError(f"{what}{path}: not a regular file")
        with open(fd, "rb", closefd=False) as f:
            data = f.read()
    except OSError as e:
        raise ConfigError(f"{what}{path}: cannot read it ({e.strerror or e})") from None
    finally:
        os.close(fd)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ConfigError(
            f"{what}{path}: not UTF-8 text (byte {e.start}); save it as UTF-8"
        ) from None


def read_toml(path: Path, what: str = "") -> dict[str, Any]:
    """Parse the TOML file ``path``; ConfigError (one line, naming it) if unreadable or bad.
    ``what`` prefixes the name, e.g. ``"--config "``."""
    text = read_text(path, what)
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{what}{path}: malformed TOML ({e})") from None

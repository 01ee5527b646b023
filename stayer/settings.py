"""Every number and name a user hands stayer, with its bounds: one pydantic model per concern.

The same value means the same thing, and has the same limits, wherever it is written: a
``stayer`` flag, a task's ``task.toml`` or a ``stayer.toml``. A value outside its bounds is
bad input (exit 2) with a one-line error naming the flag, or the file and the key, before
anything is written. The bounds are wide enough for any real run and narrow enough that a
typo cannot become a week-long loop, a zero-byte memory cap or a number too large for
Decimal arithmetic:

=====================  ==========================================  =========================
value                  where                                       bounds
=====================  ==========================================  =========================
seconds                ``--timeout``, ``--command-timeout``,       > 0, ≤ 7 days
                       ``[agent]``/``[verifier] timeout_sec``,
                       ``[guard] max_wall_s``, ``latency_target_s``
simulated latency      ``--sim-latency``                           ≥ 0, ≤ 1 hour
memory, MiB            ``--memory``, ``--memory-mb``,              whole, 16 … 1 TiB
                       ``[environment] memory_mb``                 (below 16 no shell starts)
storage / file, MiB    ``--storage-mb``, ``--max-file-mb``,        whole, 1 … 16 TiB
                       ``[environment] storage_mb``
processes              ``--max-processes``                         whole, 1 … 65,536
steps                  ``--max-steps``, ``estimate --steps``       whole, 1 … 100,000
wrap-up steps          ``[guard] wrapup_steps``                    whole, 0 (none) … 100
tokens                 ``--max-context``, ``--new-tokens``, …      whole, ≤ 100 M
money, USD             ``--max-cost``                              > 0, ≤ 1,000,000
price, USD per MTok    ``estimate --price-*``                      ≥ 0, ≤ 1,000,000
epochs, concurrency    ``eval``, ``tasks check``, ``audit --jobs`` whole, ≤ 10,000 / 1,024
run id                 ``--run-id``                                letters, digits, ``-_.``,
                                                                   ≤ 128, not starting ``.``
=====================  ==========================================  =========================

NaN and infinities are refused everywhere, and so are booleans and strings where a number
belongs (TOML's ``true`` is not 1).
"""

from __future__ import annotations

import re
import tomllib
from collections.abc import Mapping
from decimal import Decimal
from pathlib import Path
from typing import Annotated, Any, Literal, TypeVar

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    StrictBool,
    ValidationError,
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


class RunSettings(Settings):
    """``stayer run`` and each trial of ``stayer eval``: the numbers of one run."""

    max_steps: Steps = 50
    max_cost: Usd | None = None
    sim_latency: Latency = 0.0
    command_timeout: Seconds = 120.0
    max_context: Tokens | None = None
    memory_mb: MemoryMb | None = None
    storage_mb: StorageMb | None = None
    max_processes: Processes | None = None
    run_id: RunId | None = None


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
    """A small text file stayer reads as configuration: UTF-8 or a ConfigError naming it."""
    try:
        data = path.read_bytes()
    except OSError as e:
        raise ConfigError(f"{what}{path}: cannot read it ({e.strerror or e})") from None
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

"""The provider-neutral shapes every model adapter speaks, and the Model protocol."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, runtime_checkable

from stayer.errors import ConfigError  # noqa: F401  (re-exported)

# The vocabulary moved to stayer.messages; re-exported for code that imports it from here.
from stayer.messages import Message, Role, ToolCall, ToolSpec  # noqa: F401
from stayer.usage import Usage


@dataclass(slots=True)
class ModelRequest:
    system: str
    tools: list[ToolSpec]
    messages: list[Message]
    max_tokens: int = 4096
    # Indices into ``messages`` after which an Anthropic cache breakpoint goes. The context
    # layer decides; adapters for providers with automatic caching ignore them.
    cache_breakpoints: list[int] = field(default_factory=list)
    cache_key: str | None = None  # OpenAI prompt_cache_key (the run id)
    cache_ttl: Literal["5m", "1h"] = "5m"  # Anthropic cache_control ttl
    service_tier: str | None = None
    # Timestamp of the request on the caller's clock (seconds). The simulator uses it for
    # cache TTLs so that tests and replays are deterministic.
    now: float | None = None


#: ``stop_reason`` values that mean the reply was cut off at ``max_tokens``, as each API
#: spells it: Anthropic ``stop_reason``, OpenAI Responses ``incomplete_details.reason``,
#: Chat Completions ``finish_reason``, Gemini ``finishReason``.
CUT_OFF_STOP_REASONS = frozenset({"max_tokens", "max_output_tokens", "length", "MAX_TOKENS"})


@dataclass(slots=True)
class ModelResponse:
    message: Message  # role == "assistant"
    usage: Usage
    raw_usage: dict[str, Any]  # the provider's own usage object, field names untouched
    model: str  # model id as reported by the provider
    latency_s: float
    stop_reason: str = ""
    service_tier: str | None = None
    # Usage the provider billed for earlier attempts at this same call whose replies were
    # lost (a crash mid-call, then a resume): charged to the budget, reported apart.
    lost_usage: Usage | None = None

    @property
    def cut_off(self) -> bool:
        """Generation stopped at ``max_tokens``: the reply's last part (text or a tool
        call's arguments) is incomplete."""
        return self.stop_reason in CUT_OFF_STOP_REASONS


class Model(Protocol):
    """A chat model with tools. ``spec`` is the name the user gave (``anthropic:claude-…``)."""

    spec: str
    provider: str  # genai-prices provider id: anthropic, openai, deepseek, google, ...
    model_id: str

    async def complete(self, request: ModelRequest) -> ModelResponse: ...


@runtime_checkable
class RecoveringModel(Protocol):
    """A model that may owe attempts at its next call: attempts in flight at a crash, which
    the provider billed although their replies were lost (the journal's model, on resume).
    The loop holds budget for them before the call; the call's response reports their
    usage as ``lost_usage``."""

    def pending_lost_attempts(self) -> int: ...


def lost_attempts(model: Model) -> int:
    """Attempts at ``model``'s next call lost in a crash (0 for a model that keeps none)."""
    return model.pending_lost_attempts() if isinstance(model, RecoveringModel) else 0


class ModelError(Exception):
    """A model call that failed after retries (or could not be attempted)."""

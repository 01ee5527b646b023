"""The vocabulary every layer speaks: a history message, a tool call, a tool's schema.

The floor of the package (nothing here imports the rest of stayer): tokens, tools, context
and the journal need these words without the Model protocol around them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

Role = Literal["user", "assistant", "tool"]


@dataclass(frozen=True, slots=True)
class ToolCall:
    id: str
    name: str
    arguments: str  # raw JSON text as the model produced it; may be malformed


@dataclass(frozen=True, slots=True)
class Message:
    """One history entry. The system prompt and tool schemas live in the request prefix."""

    role: Role
    content: str = ""
    tool_calls: tuple[ToolCall, ...] = ()
    tool_call_id: str | None = None  # set on role == "tool"
    is_error: bool = False  # a tool result that reports a failure
    kind: str = ""  # retention hint for context policies: task, observation, note, ...


@dataclass(frozen=True, slots=True)
class ToolSpec:
    name: str
    description: str
    parameters: dict[str, Any]  # JSON schema of the arguments object

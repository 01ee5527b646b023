"""The vocabulary every layer speaks: a history message, a tool call, a tool's schema.

The floor of the package (nothing here imports the rest of stayer): tokens, tools, context
and the journal need these words without the Model protocol around them.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Literal

Role = Literal["user", "assistant", "tool"]

#: What a tool's calls do to the world outside the run's workspace (``stayer.tools.effects``):
#: nothing (``read_only``); only the workspace, which resume restores (``restorable``); run
#: commands in the sandbox, restorable unless it has the network (``sandboxed``); or change
#: the world, safely repeatable with one idempotency key (``idempotent``) or not
#: (``additive``, ``destructive``).
Effects = Literal["read_only", "restorable", "sandboxed", "idempotent", "additive", "destructive"]


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
    effects: Effects = "restorable"  # not part of the schema the model sees


def tool_outcomes(results: Sequence[Message], history: Sequence[Message]) -> Iterator[str]:
    """One line per tool result: the call that produced it (found in ``history``), whether
    it failed, and its last non-empty line. The state an agent needs to go on, in brief."""
    calls = {c.id: c for m in history if m.role == "assistant" for c in m.tool_calls}
    for m in results:
        call = calls.get(m.tool_call_id or "")
        what = f"{call.name} {call.arguments[:120]}" if call else "tool"
        last = next((ln for ln in reversed(m.content.strip().splitlines()) if ln.strip()), "")
        failed = "exit code: 0" not in m.content and "[exit code:" in m.content
        yield f"- {'FAILED ' if failed else ''}{what} → {last[:160]}"

"""Tools for agents of a team: ``send_message``, ``wait_for_message`` and ``handoff``.

The tools sit below the team (``stayer.teams``); they talk to it through ``Messaging``,
which the agent's thread provides. A request the team refuses (an agent this one may not
talk to) comes back as a tool error the model reads and can correct.
"""

from __future__ import annotations

from typing import Any, Protocol

from stayer.models.base import ToolSpec
from stayer.tools.base import ToolContext, ToolResult

#: The longest a ``wait_for_message`` may wait, in seconds.
MAX_WAIT_S = 3600.0
HISTORY_CHOICES = ("none", "summary", "full")


class MessagingRefused(Exception):
    """The team will not do it; the message is shown to the model."""


class Messaging(Protocol):
    """What a thread of a team lets its agent do."""

    async def send(self, to: str, content: str) -> str: ...

    async def wait(self, sender: str | None, timeout: float) -> str: ...

    async def handoff(self, to: str, brief: str, history: str | None) -> str: ...


def _peers(peers: list[str]) -> dict[str, Any]:
    return {"type": "string", "enum": sorted(peers), "description": "An agent of your team."}


class SendMessageTool:
    def __init__(self, thread: Messaging, peers: list[str]) -> None:
        self.thread = thread
        self.spec = ToolSpec(
            name="send_message",
            description=(
                "Send a message to another agent of your team. It does not wait: the receiver "
                "reads it at its next step. Use wait_for_message to wait for an answer."
            ),
            parameters={
                "type": "object",
                "properties": {"to": _peers(peers), "content": {"type": "string"}},
                "required": ["to", "content"],
                "additionalProperties": False,
            },
        )

    async def __call__(self, args: dict[str, Any], ctx: ToolContext) -> ToolResult:
        try:
            return ToolResult(
                await self.thread.send(str(args["to"]), str(args["content"])), kind="result"
            )
        except MessagingRefused as e:
            return ToolResult(f"send_message: {e}", is_error=True)


class WaitForMessageTool:
    def __init__(self, thread: Messaging, peers: list[str]) -> None:
        self.thread = thread
        self.spec = ToolSpec(
            name="wait_for_message",
            description=(
                "Wait until a message arrives (from one agent, if `from` is given) or the timeout "
                "passes; returns the messages. Returns at once when that agent has finished."
            ),
            parameters={
                "type": "object",
                "properties": {
                    "from": _peers(peers),
                    "timeout": {
                        "type": "number",
                        "minimum": 0,
                        "description": f"Seconds, at most {MAX_WAIT_S:g}.",
                    },
                },
                "additionalProperties": False,
            },
        )

    async def __call__(self, args: dict[str, Any], ctx: ToolContext) -> ToolResult:
        timeout = min(float(args.get("timeout", 600)), MAX_WAIT_S)
        try:
            return ToolResult(await self.thread.wait(args.get("from"), timeout), kind="result")
        except MessagingRefused as e:
            return ToolResult(f"wait_for_message: {e}", is_error=True)


class HandoffTool:
    def __init__(self, thread: Messaging, peers: list[str]) -> None:
        self.thread = thread
        self.spec = ToolSpec(
            name="handoff",
            description=(
                "Hand work to another agent of your team: it starts (or continues) with your brief "
                "and reports back to you when it finishes. `history` passes your conversation so "
                "far: none, a summary, or in full; leave it out to let the cheapest be chosen."
            ),
            parameters={
                "type": "object",
                "properties": {
                    "to": _peers(peers),
                    "brief": {"type": "string", "description": "What to do, completely."},
                    "history": {"type": "string", "enum": list(HISTORY_CHOICES)},
                },
                "required": ["to", "brief"],
                "additionalProperties": False,
            },
        )

    async def __call__(self, args: dict[str, Any], ctx: ToolContext) -> ToolResult:
        history = args.get("history")
        if history is not None and history not in HISTORY_CHOICES:
            return ToolResult(
                f"handoff: history must be one of {', '.join(HISTORY_CHOICES)}", is_error=True
            )
        try:
            return ToolResult(
                await self.thread.handoff(str(args["to"]), str(args["brief"]), history),
                kind="result",
            )
        except MessagingRefused as e:
            return ToolResult(f"handoff: {e}", is_error=True)

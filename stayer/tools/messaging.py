"""Tools for agents of a team: ``send_message``, ``wait_for_message`` and ``handoff``.

The tools sit below the team (``stayer.teams``); they talk to it through ``Messaging``,
which the agent's thread provides. A request the team refuses (an agent this one may not
talk to) comes back as a tool error the model reads and can correct.
"""

from __future__ import annotations

from typing import Any, Protocol

import msgspec

from stayer.models.base import ToolSpec
from stayer.tools.base import A, ToolContext, ToolResult, TypedTool

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


class SendArgs(msgspec.Struct, kw_only=True):
    to: str
    content: str


class WaitArgs(msgspec.Struct, kw_only=True):
    sender: str | None = msgspec.field(default=None, name="from")
    timeout: float = 600.0


class HandoffArgs(msgspec.Struct, kw_only=True):
    to: str
    brief: str
    history: str | None = None


class _TeamTool(TypedTool[A]):
    """A tool that asks the team through ``thread``: its spec from the class's name,
    description and parameters (its ``peer`` one of ``peers``), and a refusal as a tool
    error naming the tool."""

    name = ""
    description = ""
    peer = "to"  # the parameter naming the other agent
    properties: dict[str, Any] = {}
    required: tuple[str, ...] = ()

    def __init__(self, thread: Messaging, peers: list[str]) -> None:
        self.thread = thread
        parameters: dict[str, Any] = {
            "type": "object",
            "properties": {self.peer: _peers(peers)} | self.properties,
        }
        if self.required:
            parameters["required"] = list(self.required)
        parameters["additionalProperties"] = False
        self.spec = ToolSpec(name=self.name, description=self.description, parameters=parameters)

    async def run(self, args: A, ctx: ToolContext) -> ToolResult:
        try:
            return ToolResult(await self.ask(args), kind="result")
        except MessagingRefused as e:
            return ToolResult(f"{self.name}: {e}", is_error=True)

    async def ask(self, args: A) -> str:
        raise NotImplementedError


class SendMessageTool(_TeamTool[SendArgs]):
    name = "send_message"
    description = (
        "Send a message to another agent of your team. It does not wait: the receiver "
        "reads it at its next step. Use wait_for_message to wait for an answer."
    )
    properties = {"content": {"type": "string"}}
    required = ("to", "content")

    async def ask(self, args: SendArgs) -> str:
        return await self.thread.send(args.to, args.content)


class WaitForMessageTool(_TeamTool[WaitArgs]):
    name = "wait_for_message"
    description = (
        "Wait until a message arrives (from one agent, if `from` is given) or the timeout "
        "passes; returns the messages. Returns at once when that agent has finished."
    )

    peer = "from"  # the one it waits for
    properties = {
        "timeout": {
            "type": "number",
            "minimum": 0,
            "description": f"Seconds, at most {MAX_WAIT_S:g}.",
        }
    }

    async def ask(self, args: WaitArgs) -> str:
        return await self.thread.wait(args.sender, min(args.timeout, MAX_WAIT_S))


class HandoffTool(_TeamTool[HandoffArgs]):
    name = "handoff"
    description = (
        "Hand work to another agent of your team: it starts (or continues) with your brief "
        "and reports back to you when it finishes. `history` passes your conversation so "
        "far: none, a summary, or in full; leave it out to let the cheapest be chosen."
    )
    properties = {
        "brief": {"type": "string", "description": "What to do, completely."},
        "history": {"type": "string", "enum": list(HISTORY_CHOICES)},
    }
    required = ("to", "brief")

    async def ask(self, args: HandoffArgs) -> str:
        if args.history is not None and args.history not in HISTORY_CHOICES:
            raise MessagingRefused(f"history must be one of {', '.join(HISTORY_CHOICES)}")
        return await self.thread.handoff(args.to, args.brief, args.history)

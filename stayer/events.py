"""What a run tells its observers besides its steps and messages: one tagged union of Structs.

The loop, the compactor, sub-agents and teams emit an ``Event``; observers (the journal,
telemetry, the runtime's feed) read its attributes. ``event_record`` is the one boundary
to JSON: ``(kind, payload)`` exactly as the journal stores it and the runtime's event feed
and webhooks send it (the tag is the kind; the payload is every field, by its JSON name).
"""

from __future__ import annotations

from typing import Any

import msgspec

from stayer.records import to_json


class Event(msgspec.Struct, frozen=True, kw_only=True, tag_field="event"):
    """An event; its tag (``type(e).__struct_config__.tag``) is the journal's kind."""


class ChangedMessage(msgspec.Struct, frozen=True, kw_only=True):
    """A message a compaction rewrote, as it became."""

    role: str
    content: str
    tool_call_id: str | None
    kind: str


class CompactionEvent(Event, frozen=True, kw_only=True, tag="compaction", omit_defaults=True):
    """The context was rewritten (enough to rewrite it again on resume); ``agent`` only
    in a team (a single agent's compactions are its own)."""

    step: int
    reason: str
    first_index: int
    tokens_before: int
    tokens_after: int
    changes: dict[str, ChangedMessage]  # by the index of the message in the context
    head_insert: str | None
    summary_input_tokens: int
    summary_output_tokens: int
    cost_usd: str
    agent: str | None = None


class SummaryFailed(Event, frozen=True, kw_only=True, tag="summary_failed"):
    agent: str
    model: str
    error: str


class Said(Event, frozen=True, kw_only=True, tag="message"):
    """A person's message, delivered to the agent at a step."""

    agent: str
    role: str
    content: str


class Failover(Event, frozen=True, kw_only=True, tag="failover"):
    agent: str
    from_model: str = msgspec.field(name="from")
    to: str
    error: str


class Breaker(Event, frozen=True, kw_only=True, tag="breaker"):
    agent: str
    reason: str
    detail: str
    step: int
    action: str
    soft: bool


class SubagentStarted(Event, frozen=True, kw_only=True, tag="subagent_started"):
    agent: str
    parent: str
    task: str
    budget_usd: str | None
    max_steps: int


class SubagentFinished(Event, frozen=True, kw_only=True, tag="subagent_finished"):
    agent: str
    status: str
    steps: int
    cost_usd: str | None


class _TeamMessage(Event, frozen=True, kw_only=True):
    agent: str
    id: str
    sender: str
    to: str
    content: str
    kind: str
    tokens: int


class MessageSent(_TeamMessage, frozen=True, kw_only=True, tag="message.sent"):
    """A team agent's message to another (``stayer.teams``)."""


class MessageReceived(_TeamMessage, frozen=True, kw_only=True, tag="message.received"):
    read_cost_usd: str


class HandoffPriced(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """A handoff as priced (``stayer.teams.handoff``). On the ledger, the route's note of it
    (``RouteRecord.handoff``: ``agent`` left out); the ``Handoff`` event is it with the
    agent who made it."""

    agent: str = ""
    kind: str
    chosen: str
    receiver_model: str
    expected_steps: int
    tokens: dict[str, int]
    expected_cost_usd: dict[str, str | None]
    to: str
    asked: str | None
    passed: str


class Handoff(Event, HandoffPriced, frozen=True, kw_only=True, tag="handoff", omit_defaults=True):
    """A team agent handed its work to another, priced."""

    def priced(self) -> HandoffPriced:
        """The route's note of it: every field but ``agent``."""
        fields = HandoffPriced.__struct_fields__
        return HandoffPriced(**{f: getattr(self, f) for f in fields if f != "agent"})


class McpOffered(Event, frozen=True, kw_only=True, tag="mcp_tools"):
    """How the run's MCP tools are offered (``eager`` or ``lazy``), and how many."""

    mode: str
    tools: int


class ToolsChanged(Event, frozen=True, kw_only=True, tag="tools_changed"):
    """An MCP server changed its tools; the new list was taken ``when`` (at a compaction,
    or at a ``call`` of a changed tool)."""

    agent: str
    when: str
    added: list[str]
    removed: list[str]
    changed: list[str] = msgspec.field(default_factory=list)


AnyEvent = (
    CompactionEvent
    | SummaryFailed
    | Said
    | Failover
    | Breaker
    | SubagentStarted
    | SubagentFinished
    | MessageSent
    | MessageReceived
    | Handoff
    | McpOffered
    | ToolsChanged
)


def event_record(event: Event) -> tuple[str, dict[str, Any]]:
    """``(kind, payload)``: the event as the journal stores it and the feed sends it."""
    payload = to_json(event)
    return str(payload.pop("event")), payload

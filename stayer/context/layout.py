"""Prompt layout: a stable prefix followed by an append-only history.

The prefix (system prompt, tool schemas sorted by name and serialised canonically, the
task instruction) is byte-identical on every step, and history is only ever appended, so
each request's prompt starts with the whole previous prompt: with prefix caching, a step
pays cache-read prices for everything it has already sent. Anthropic needs explicit
breakpoints: one at the end of the prefix (it survives any later history compaction) and
one rolling at the last message (each step reads the previous step's write).

Every message is counted once, when appended; the context's size is a running sum.
"""

from __future__ import annotations

from collections.abc import Iterable

from stayer.messages import Message, ToolSpec
from stayer.models.base import ModelRequest
from stayer.tokens import MessageCounter, canonical_tools


class Context:
    def __init__(
        self,
        system: str,
        tools: Iterable[ToolSpec],
        instruction: str,
        counter: MessageCounter,
    ) -> None:
        self.system = system
        self.tools = sorted(tools, key=lambda t: t.name)
        self.counter = counter
        self.tools_text = canonical_tools(self.tools)
        self.prefix_tokens = counter.text(system) + counter.text(self.tools_text)
        self.messages: list[Message] = []
        self.sizes: list[int] = []  # tokens of each message, counted once
        self.tokens = self.prefix_tokens
        self.append(Message(role="user", content=instruction, kind="task"))
        self.prefix_messages = 1  # the task instruction belongs to the stable prefix

    def append(self, m: Message) -> None:
        n = self.counter.message(m)
        self.messages.append(m)
        self.sizes.append(n)
        self.tokens += n

    def rewrite(self, changes: dict[int, Message]) -> int:
        """Replace some messages in place (a compaction). Returns the index of the first
        changed message: everything from there on is a cache miss on the next request."""
        if not changes:
            return len(self.messages)
        first = min(changes)
        if first < self.prefix_messages:
            raise ValueError("the pinned prefix is never rewritten")
        for i, m in changes.items():
            n = self.counter.message(m)
            self.tokens += n - self.sizes[i]
            self.messages[i], self.sizes[i] = m, n
        return first

    def replace_tools(self, tools: Iterable[ToolSpec]) -> None:
        """New tool schemas (an MCP server's list changed): the whole prompt is a cache
        miss on the next request, so the agent does this only at a compaction or when a
        call needs it (``Agent``'s ``tool_updates``)."""
        old = self.prefix_tokens
        self.tools = sorted(tools, key=lambda t: t.name)
        self.tools_text = canonical_tools(self.tools)
        self.prefix_tokens = self.counter.text(self.system) + self.counter.text(self.tools_text)
        self.tokens += self.prefix_tokens - old

    def insert(self, index: int, m: Message) -> None:
        if index < self.prefix_messages:
            raise ValueError("the pinned prefix is never rewritten")
        n = self.counter.message(m)
        self.messages.insert(index, m)
        self.sizes.insert(index, n)
        self.tokens += n

    def tokens_before(self, index: int) -> int:
        """Prompt tokens that precede message ``index`` (the cacheable prefix up to it)."""
        return self.prefix_tokens + sum(self.sizes[:index])

    def request(
        self,
        *,
        max_tokens: int,
        cache_key: str | None = None,
        service_tier: str | None = None,
        now: float | None = None,
    ) -> ModelRequest:
        last = len(self.messages) - 1
        breakpoints = [self.prefix_messages - 1] + ([last] if last >= self.prefix_messages else [])
        return ModelRequest(
            system=self.system,
            tools=self.tools,
            messages=list(self.messages),
            max_tokens=max_tokens,
            cache_breakpoints=breakpoints,
            cache_key=cache_key,
            service_tier=service_tier,
            now=now,
        )

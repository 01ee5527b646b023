"""Cache breakpoints added to an Anthropic Messages request that carries none, and what
they saved.

``add_cache_breakpoints`` marks such a body as stayer's own context layer marks its
requests (``stayer.context.layout``, ``stayer.models.anthropic``): one breakpoint after
the stable prefix (the last system block, else the last tool definition) and one rolling
on the last block of the last message, so that each call reads what the previous one
wrote; two of Anthropic's four. Nothing else in the body changes. ``without_cache`` is
the usage the same call would have had unmarked: Anthropic caches nothing without a
breakpoint, so every token it read or wrote would have been plain input. Priced with
the same price book, the difference is what the breakpoints saved (negative on a call
that only wrote).
"""

from __future__ import annotations

from typing import Any

from stayer.usage import Usage

_EPHEMERAL = {"type": "ephemeral"}
_UNMARKABLE = ("thinking", "redacted_thinking")  # blocks Anthropic refuses a breakpoint on


def has_cache_control(body: dict[str, Any]) -> bool:
    """Whether the body marks anything for caching already (the request-level field, a
    tool, a system block, a message block or a tool result's inner block)."""
    if "cache_control" in body:
        return True
    blocks: list[Any] = []
    for name in ("tools", "system"):
        if isinstance(body.get(name), list):
            blocks += body[name]
    for message in body.get("messages") or []:
        if isinstance(message, dict) and isinstance(message.get("content"), list):
            blocks += message["content"]
    for block in blocks:
        if not isinstance(block, dict):
            continue
        if "cache_control" in block:
            return True
        inner = block.get("content")
        if isinstance(inner, list) and any(
            isinstance(b, dict) and "cache_control" in b for b in inner
        ):
            return True
    return False


def add_cache_breakpoints(body: dict[str, Any]) -> tuple[dict[str, Any], int]:
    """A copy of ``body`` with a breakpoint after its stable prefix and one at the end of
    its history, and how many were added (0, 1 or 2). The caller checks first that the
    body has none (:func:`has_cache_control`); parts it cannot mark are left alone."""
    out = dict(body)
    added = 0
    system, tools = body.get("system"), body.get("tools")
    if isinstance(system, str) and system:
        out["system"] = [{"type": "text", "text": system, "cache_control": dict(_EPHEMERAL)}]
        added += 1
    elif isinstance(system, list) and system and isinstance(system[-1], dict):
        out["system"] = [*system[:-1], _marked(system[-1])]
        added += 1
    elif not system and isinstance(tools, list) and tools and isinstance(tools[-1], dict):
        out["tools"] = [*tools[:-1], _marked(tools[-1])]
        added += 1
    messages = body.get("messages")
    if isinstance(messages, list) and messages and isinstance(messages[-1], dict):
        last = messages[-1]
        content = last.get("content")
        blocks = [{"type": "text", "text": content}] if isinstance(content, str) else content
        if isinstance(blocks, list):
            for i in range(len(blocks) - 1, -1, -1):
                block = blocks[i]
                if _markable(block):
                    blocks = [*blocks[:i], _marked(block), *blocks[i + 1 :]]
                    out["messages"] = [*messages[:-1], dict(last, content=blocks)]
                    added += 1
                    break
    return out, added


def without_cache(usage: Usage) -> Usage:
    """The usage of the same call with no breakpoint: its whole prompt as plain input."""
    return Usage(
        input_tokens=usage.input_tokens,
        output_tokens=usage.output_tokens,
        reasoning_tokens=usage.reasoning_tokens,
    )


def _markable(block: Any) -> bool:
    if not isinstance(block, dict) or block.get("type") in _UNMARKABLE:
        return False
    return block.get("type") != "text" or bool(block.get("text"))  # not on an empty text


def _marked(block: dict[str, Any]) -> dict[str, Any]:
    return dict(block, cache_control=dict(_EPHEMERAL))

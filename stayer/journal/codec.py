"""How messages and arbitrary event payloads become journal bytes, and back.

One record format for a message everywhere it is written down: the journal's blobs and
``trajectory.jsonl`` (which ``--sim-policy replay:PATH`` reads back).
"""

from __future__ import annotations

import dataclasses
import json
from decimal import Decimal
from typing import Any, Self

import msgspec
from msgspec import UNSET, UnsetType

from stayer.messages import Message, Role, ToolCall
from stayer.records import Record, to_json


class MessageCall(Record):
    """A tool call of a message, as written down."""

    id: str
    name: str
    arguments: str  # raw JSON text as the model produced it


class MessageRecord(Record):
    """A message as written down; a field at its default (no calls, no tool call id, not an
    error, no kind) is left out, ``role`` and ``content`` always kept."""

    role: Role
    content: str = ""
    tool_calls: list[MessageCall] | UnsetType = UNSET
    tool_call_id: str | UnsetType = UNSET
    is_error: bool | UnsetType = UNSET
    kind: str | UnsetType = UNSET

    @classmethod
    def of(cls, m: Message) -> Self:
        return cls(
            m.role,
            m.content,
            [MessageCall(c.id, c.name, c.arguments) for c in m.tool_calls]
            if m.tool_calls
            else UNSET,
            m.tool_call_id or UNSET,
            True if m.is_error else UNSET,
            m.kind or UNSET,
        )

    def message(self) -> Message:
        calls = self.tool_calls if isinstance(self.tool_calls, list) else ()
        return Message(
            role=self.role,
            content=self.content,
            tool_calls=tuple(ToolCall(c.id, c.name, c.arguments) for c in calls),
            tool_call_id=self.tool_call_id or None,
            is_error=self.is_error is True,
            kind=self.kind or "",
        )


def _default(o: Any) -> Any:
    if isinstance(o, Message):
        return to_json(MessageRecord.of(o))
    if isinstance(o, Decimal):
        return str(o)
    if dataclasses.is_dataclass(o) and not isinstance(o, type):
        return {f.name: getattr(o, f.name) for f in dataclasses.fields(o)}
    if isinstance(o, set | frozenset | tuple):
        return sorted(o) if isinstance(o, set | frozenset) else list(o)
    to_dict = getattr(o, "to_dict", None)
    if callable(to_dict):
        return to_dict()
    if isinstance(o, msgspec.Struct):
        return to_json(o)
    raise TypeError(f"cannot journal a {type(o).__name__}")


def canonical(value: Any) -> bytes:
    """Deterministic JSON bytes (sorted keys, no whitespace): equal values, equal bytes, so
    equal blob addresses. A value holding a lone surrogate (a model's ``"\\ud800"``), which
    UTF-8 cannot carry, is written with every non-ASCII character escaped instead."""
    text = json.dumps(
        value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=_default
    )
    try:
        return text.encode()
    except UnicodeEncodeError:
        return json.dumps(value, sort_keys=True, separators=(",", ":"), default=_default).encode()

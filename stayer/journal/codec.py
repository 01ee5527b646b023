"""How messages and arbitrary event payloads become journal bytes, and back.

One record format for a message everywhere it is written down: the journal's blobs and
``trajectory.jsonl`` (which ``--sim-policy replay:PATH`` reads back).
"""

from __future__ import annotations

import dataclasses
import json
from decimal import Decimal
from typing import Any

from stayer.messages import Message, ToolCall


def message_record(m: Message) -> dict[str, Any]:
    rec: dict[str, Any] = {"role": m.role, "content": m.content}
    if m.tool_calls:
        rec["tool_calls"] = [
            {"id": c.id, "name": c.name, "arguments": c.arguments} for c in m.tool_calls
        ]
    if m.tool_call_id:
        rec["tool_call_id"] = m.tool_call_id
    if m.is_error:
        rec["is_error"] = True
    if m.kind:
        rec["kind"] = m.kind
    return rec


def message_from_record(rec: dict[str, Any]) -> Message:
    calls = tuple(ToolCall(c["id"], c["name"], c["arguments"]) for c in rec.get("tool_calls", ()))
    return Message(
        role=rec["role"],
        content=rec.get("content", ""),
        tool_calls=calls,
        tool_call_id=rec.get("tool_call_id"),
        is_error=bool(rec.get("is_error", False)),
        kind=rec.get("kind", ""),
    )


def _default(o: Any) -> Any:
    if isinstance(o, Message):
        return message_record(o)
    if isinstance(o, Decimal):
        return str(o)
    if dataclasses.is_dataclass(o) and not isinstance(o, type):
        return {f.name: getattr(o, f.name) for f in dataclasses.fields(o)}
    if isinstance(o, set | frozenset | tuple):
        return sorted(o) if isinstance(o, set | frozenset) else list(o)
    to_dict = getattr(o, "to_dict", None)
    if callable(to_dict):
        return to_dict()
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

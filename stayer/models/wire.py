"""Request bodies from JSON kept per message: the unchanged prefix is not encoded again.

An agent's request is the previous one plus a few messages. Handing the whole history to
the SDK every step makes it walk and encode every block again: ~10 ms at 100K tokens and
~80 ms at 1M, per step. The adapters instead keep each message's wire JSON, keyed by the
message object (the context keeps a message's object for as long as the message is in
it, until a compaction replaces it), join the pieces, and post the body as bytes.

Each adapter's ``build_*_params`` stays the readable, inspectable form of its request; its
tests check that the body built here says exactly the same.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any, Generic, TypeVar

import msgspec

from stayer.messages import Message

T = TypeVar("T")


def dumps(value: Any) -> str:
    """Compact JSON, UTF-8 text as is (the body is sent as UTF-8)."""
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


class MessageJson(Generic[T]):
    """``convert(message)`` for each message of a request, computed once per message.

    Entries live while their message is in the latest request, so memory follows the
    context; the message object is held with its entry, so its ``id`` cannot be reused
    for another message while the entry exists."""

    def __init__(self, convert: Callable[[Message], T]) -> None:
        self._convert = convert
        self._by_id: dict[int, tuple[Message, T]] = {}

    def __call__(self, messages: Sequence[Message]) -> list[T]:
        kept: dict[int, tuple[Message, T]] = {}
        out: list[T] = []
        known = self._by_id.get
        for m in messages:
            hit = known(id(m))
            if hit is None or hit[0] is not m:
                hit = (m, self._convert(m))
            kept[id(m)] = hit
            out.append(hit[1])
        self._by_id = kept
        return out


def object_with_array(fields: msgspec.Struct, key: str, items: Sequence[bytes]) -> bytes:
    """``{**fields, key: [items…]}`` as UTF-8 JSON, ``items`` already encoded; joined in
    one go, because at 1M tokens every extra copy of the body costs milliseconds. The
    fields are written by ``dumps`` (a tool's schema keeps its floats' spelling)."""
    head = dumps(msgspec.to_builtins(fields))[:-1]
    pieces = [f"{head}{',' if head != '{' else ''}{dumps(key)}:[".encode()]
    for item in items:
        pieces += (item, b",")
    if items:
        pieces.pop()
    pieces.append(b"]}")
    return b"".join(pieces)


async def post_json(
    client: Any,
    path: str,
    body: bytes,
    cast_to: type,
    headers: dict[str, str],
    timeout: float | None = None,
) -> Any:
    """POST an encoded JSON body through a Stainless SDK client (Anthropic's, OpenAI's):
    its auth, headers, error classes and response models, without its re-encoding.
    ``timeout`` None: the client's own."""
    options: dict[str, Any] = {"headers": {"Content-Type": "application/json", **headers}}
    if timeout is not None:
        options["timeout"] = timeout
    return await client.post(path, cast_to=cast_to, content=body, options=options)

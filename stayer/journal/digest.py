"""Request digests: what a model request says, hashed, so that replay can tell that the
request a resumed loop builds is the one the journal answered.

Requests grow by appending, so the hash of the previous request's leading part is kept and
continued: a step costs its new messages, not the whole history.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from stayer.journal.codec import MessageRecord, canonical
from stayer.messages import Message
from stayer.models.base import ModelRequest
from stayer.tokens import ToolsText


class RequestDigest:
    """``digest(request)``: the request's content hashed; ``now`` (a timestamp, not
    content) is left out. One per journal: it remembers the last request's prefix."""

    def __init__(self) -> None:
        self._message_hashes: dict[Message, bytes] = {}
        self._prefix: tuple[tuple[str, str], list[Message], Any] = (("", ""), [], None)
        self._tools_text = ToolsText()

    def __call__(self, request: ModelRequest) -> str:
        head = (request.system, self._tools_text(request.tools))
        prev_head, prev_messages, prev_state = self._prefix
        messages = request.messages
        keep = 0
        if head == prev_head and len(prev_messages) <= len(messages):
            while keep < len(prev_messages) and prev_messages[keep] is messages[keep]:
                keep += 1
        if keep == len(prev_messages) and prev_state is not None:
            h = prev_state.copy()
        else:
            keep = 0
            h = hashlib.sha256()
            h.update(hashlib.sha256(head[0].encode()).digest())
            h.update(hashlib.sha256(head[1].encode()).digest())
        for m in messages[keep:]:
            mh = self._message_hashes.get(m)
            if mh is None:
                mh = self._message_hashes[m] = hashlib.sha256(
                    canonical(MessageRecord.of(m))
                ).digest()
            h.update(mh)
        self._prefix = (head, list(messages), h.copy())
        tail = [
            request.max_tokens,
            request.cache_breakpoints,
            request.cache_key,
            request.cache_ttl,
            request.service_tier,
        ]
        h.update(json.dumps(tail).encode())
        return str(h.hexdigest())

"""The OpenAI Chat Completions API's tool calls as msgspec Structs: what the adapter sends
back in an assistant message (``stayer.models.openai``) and the simulator replies
(``stayer.simserver.wire``). Free of the SDK, so the simulator does not load it.
"""

from __future__ import annotations

import msgspec
from msgspec import Struct

from stayer.messages import Message


class CalledFunction(Struct):
    name: str
    arguments: str


class ChatToolCall(Struct, kw_only=True):
    id: str
    kind: str = msgspec.field(default="function", name="type")
    function: CalledFunction


def chat_tool_calls(message: Message) -> list[ChatToolCall]:
    """The tool calls of ``message`` as the API writes them."""
    return [
        ChatToolCall(id=c.id, function=CalledFunction(c.name, c.arguments))
        for c in message.tool_calls
    ]

"""The Anthropic Messages API's content blocks and tool definitions as msgspec Structs, in
the API's key order (``cache_control``, a breakpoint, always last): what the adapter sends
(``stayer.models.anthropic``) and the simulator replies (``stayer.simserver.wire``). Free of
the SDK, so the simulator does not load it.
"""

from __future__ import annotations

import json
from typing import Any

from msgspec import UNSET, Struct, UnsetType


class CacheControl(Struct, tag="ephemeral", tag_field="type"):
    """``{"type": "ephemeral"}``: a cache breakpoint, always a block's last field."""


EPHEMERAL = CacheControl()


class TextBlock(Struct, tag="text", tag_field="type"):
    text: str
    cache_control: CacheControl | UnsetType = UNSET


class ToolUseBlock(Struct, tag="tool_use", tag_field="type"):
    id: str
    name: str
    input: dict[str, Any]  # the call's arguments as the model wrote them (its JSON)
    cache_control: CacheControl | UnsetType = UNSET


class ToolResultBlock(Struct, tag="tool_result", tag_field="type", kw_only=True):
    tool_use_id: str
    content: str | UnsetType = UNSET
    is_error: bool
    cache_control: CacheControl | UnsetType = UNSET


Block = TextBlock | ToolUseBlock | ToolResultBlock


class ToolDef(Struct):
    name: str
    description: str
    input_schema: dict[str, Any]  # the tool's JSON schema, as its author wrote it
    cache_control: CacheControl | UnsetType = UNSET


def tool_input(arguments: str) -> dict[str, Any]:
    """Tool-call arguments as the object the API wants. They came from the model, so they
    normally parse; if not, send ``{}`` rather than fail the whole call."""
    try:
        value = json.loads(arguments) if arguments else {}
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}

"""The providers' request bodies read as a :class:`ModelRequest`: Anthropic Messages,
OpenAI Chat Completions and OpenAI Responses, and each API's error shape.

``parse_*`` raise :class:`WireError` naming the field of a body the API would refuse. What
is read is what the cost equation needs: the system prompt, the tools, the messages, the
cache breakpoints and TTL, ``max_tokens``, the cache key and service tier. Used by the
simulator server, the gateway and the library alike.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any, Literal

import msgspec

from stayer.messages import Message, ToolCall, ToolSpec
from stayer.models.base import ModelRequest

Api = Literal["anthropic", "chat", "responses"]
#: max_tokens of an OpenAI request that names none (the simulator's stand-in for "the
#: model's own limit").
DEFAULT_MAX_TOKENS = 16_384
MAX_TOKENS_LIMIT = 10_000_000


class WireError(ValueError):
    """A request body the API would refuse: 400 with this message."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


@dataclass(slots=True)
class Parsed:
    model: str
    request: ModelRequest
    stream: bool
    include_usage: bool = False  # Chat Completions: stream_options.include_usage


def _field(
    body: dict[str, Any], name: str, kind: type | tuple[type, ...], required: bool = False
) -> Any:
    value = body.get(name)
    if value is None:
        if required:
            raise WireError(f"{name}: Field required", name)
        return None
    if (
        isinstance(value, bool)
        and kind is not bool
        and bool not in (kind if isinstance(kind, tuple) else (kind,))
    ):
        raise WireError(f"{name}: invalid type", name)
    if not isinstance(value, kind):
        raise WireError(f"{name}: invalid type", name)
    return value


def _max_tokens(body: dict[str, Any], *names: str, required: bool) -> int:
    for name in names:
        value = _field(body, name, int)
        if value is not None:
            if not 1 <= value <= MAX_TOKENS_LIMIT:
                raise WireError(f"{name}: must be between 1 and {MAX_TOKENS_LIMIT}", name)
            return int(value)
    if required:
        raise WireError(f"{names[0]}: Field required", names[0])
    return DEFAULT_MAX_TOKENS


def _model(body: dict[str, Any]) -> str:
    model = _field(body, "model", str, required=True)
    if not model.strip() or len(model) > 256:
        raise WireError("model: must be a model id", "model")
    return str(model)


def _text_of(content: Any, where: str) -> str:
    """A content value that is a string or a list of text parts, as one text."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = []
        for n, part in enumerate(content):
            if not isinstance(part, dict):
                raise WireError(f"{where}.{n}: invalid content part", where)
            text = part.get("text")
            texts.append(text if isinstance(text, str) else f"[{part.get('type', 'part')}]")
        return "\n".join(texts)
    if content is None:
        return ""
    raise WireError(f"{where}: invalid content", where)


def _tool_spec(name: Any, description: Any, schema: Any, where: str) -> ToolSpec:
    if not isinstance(name, str) or not name:
        raise WireError(f"{where}.name: Field required", where)
    return ToolSpec(
        name,
        description if isinstance(description, str) else "",
        schema if isinstance(schema, dict) else {},
    )


def _list(body: dict[str, Any], name: str, required: bool = False) -> list[Any]:
    value = _field(body, name, list, required=required)
    return value or []


def parse_anthropic(body: dict[str, Any], *, count_only: bool = False) -> Parsed:
    model = _model(body)
    max_tokens = 1 if count_only else _max_tokens(body, "max_tokens", required=True)
    breakpoints: list[int] = []
    ttl: Literal["5m", "1h"] = "5m"

    def mark(block: dict[str, Any], after: int) -> None:
        nonlocal ttl
        control = block.get("cache_control")
        if isinstance(control, dict):
            breakpoints.append(after)
            if control.get("ttl") == "1h":
                ttl = "1h"

    tools = []
    for n, tool in enumerate(_list(body, "tools")):
        if not isinstance(tool, dict):
            raise WireError(f"tools.{n}: invalid tool", "tools")
        tools.append(
            _tool_spec(
                tool.get("name"), tool.get("description"), tool.get("input_schema"), f"tools.{n}"
            )
        )
        mark(tool, -2)
    system_value = body.get("system")
    if isinstance(system_value, list):
        for block in system_value:
            if isinstance(block, dict):
                mark(block, -1)
    system = _text_of(system_value, "system")
    messages: list[Message] = []
    for n, entry in enumerate(_list(body, "messages", required=True)):
        where = f"messages.{n}"
        if not isinstance(entry, dict) or entry.get("role") not in ("user", "assistant"):
            raise WireError(f"{where}.role: must be user or assistant", "messages")
        content = entry.get("content")
        blocks = [{"type": "text", "text": content}] if isinstance(content, str) else content
        if not isinstance(blocks, list):
            raise WireError(f"{where}.content: invalid content", "messages")
        if entry["role"] == "assistant":
            text, calls = [], []
            for k, block in enumerate(blocks):
                if not isinstance(block, dict):
                    raise WireError(f"{where}.content.{k}: invalid block", "messages")
                if block.get("type") == "text":
                    text.append(str(block.get("text", "")))
                elif block.get("type") == "tool_use":
                    calls.append(
                        ToolCall(
                            str(block.get("id", "")),
                            str(block.get("name", "")),
                            json.dumps(block.get("input", {}), ensure_ascii=False),
                        )
                    )
            messages.append(Message("assistant", "".join(text), tuple(calls)))
            if any(isinstance(b, dict) and "cache_control" in b for b in blocks):
                breakpoints.append(len(messages) - 1)
            continue
        for k, block in enumerate(blocks):
            if not isinstance(block, dict):
                raise WireError(f"{where}.content.{k}: invalid block", "messages")
            if block.get("type") == "tool_result":
                messages.append(
                    Message(
                        "tool",
                        _text_of(block.get("content"), f"{where}.content.{k}.content"),
                        tool_call_id=str(block.get("tool_use_id", "")),
                        is_error=bool(block.get("is_error", False)),
                    )
                )
            else:
                said = block.get("text")
                messages.append(
                    Message("user", said if isinstance(said, str) else f"[{block.get('type')}]")
                )
            mark(block, len(messages) - 1)
    return Parsed(
        model,
        ModelRequest(
            system, tools, messages, max_tokens, cache_breakpoints=breakpoints, cache_ttl=ttl
        ),
        bool(body.get("stream")),
    )


class AnthropicErrorDetail(msgspec.Struct):
    kind: str = msgspec.field(name="type")
    message: str


class AnthropicError(msgspec.Struct, tag="error", tag_field="type"):
    """Anthropic's error body: ``{"type": "error", "error": {"type", "message"}}``."""

    error: AnthropicErrorDetail


def anthropic_error(status: int, message: str) -> AnthropicError:
    kind = {
        400: "invalid_request_error",
        401: "authentication_error",
        404: "not_found_error",
        413: "request_too_large",
        429: "rate_limit_error",
    }.get(status, "api_error")
    return AnthropicError(AnthropicErrorDetail(kind, message))


def parse_chat(body: dict[str, Any]) -> Parsed:
    model = _model(body)
    max_tokens = _max_tokens(body, "max_completion_tokens", "max_tokens", required=False)
    system: list[str] = []
    messages: list[Message] = []
    for n, entry in enumerate(_list(body, "messages", required=True)):
        where = f"messages[{n}]"
        if not isinstance(entry, dict):
            raise WireError(f"{where}: invalid message", "messages")
        role = entry.get("role")
        if role in ("system", "developer"):
            system.append(_text_of(entry.get("content"), f"{where}.content"))
        elif role == "user":
            messages.append(Message("user", _text_of(entry.get("content"), f"{where}.content")))
        elif role == "assistant":
            calls = []
            for k, call in enumerate(entry.get("tool_calls") or []):
                fn = call.get("function") if isinstance(call, dict) else None
                if not isinstance(fn, dict):
                    raise WireError(f"{where}.tool_calls[{k}]: invalid tool call", "messages")
                calls.append(
                    ToolCall(
                        str(call.get("id", "")),
                        str(fn.get("name", "")),
                        str(fn.get("arguments", "")),
                    )
                )
            text = _text_of(entry.get("content"), f"{where}.content")
            messages.append(Message("assistant", text, tuple(calls)))
        elif role == "tool":
            messages.append(
                Message(
                    "tool",
                    _text_of(entry.get("content"), f"{where}.content"),
                    tool_call_id=str(entry.get("tool_call_id", "")),
                )
            )
        else:
            raise WireError(f"{where}.role: invalid role {role!r}", "messages")
    tools = []
    for n, tool in enumerate(_list(body, "tools")):
        fn = tool.get("function") if isinstance(tool, dict) else None
        if not isinstance(fn, dict):
            raise WireError(f"tools[{n}]: expected a function tool", "tools")
        tools.append(
            _tool_spec(fn.get("name"), fn.get("description"), fn.get("parameters"), f"tools[{n}]")
        )
    options = body.get("stream_options")
    include_usage = isinstance(options, dict) and bool(options.get("include_usage"))
    return _openai_parsed(body, model, system, tools, messages, max_tokens, include_usage)


def _openai_parsed(
    body: dict[str, Any],
    model: str,
    system: list[str],
    tools: list[ToolSpec],
    messages: list[Message],
    max_tokens: int,
    include_usage: bool = False,
) -> Parsed:
    """An OpenAI request's caching and tier fields, which both of its APIs spell alike."""
    key, tier = body.get("prompt_cache_key"), body.get("service_tier")
    request = ModelRequest(
        "\n".join(system),
        tools,
        messages,
        max_tokens,
        cache_key=key if isinstance(key, str) else None,
        service_tier=tier if isinstance(tier, str) else None,
    )
    return Parsed(model, request, bool(body.get("stream")), include_usage)


class OpenAIErrorDetail(msgspec.Struct):
    message: str
    kind: str = msgspec.field(name="type")
    param: str | None
    code: None = None


class OpenAIError(msgspec.Struct):
    """OpenAI's error body: ``{"error": {"message", "type", "param", "code"}}``."""

    error: OpenAIErrorDetail


def openai_error(status: int, message: str, param: str | None = None) -> OpenAIError:
    kind = {401: "authentication_error", 404: "not_found_error", 429: "rate_limit_error"}
    return OpenAIError(
        OpenAIErrorDetail(
            message,
            kind.get(status, "invalid_request_error" if status < 500 else "server_error"),
            param,
        )
    )


ErrorBody = AnthropicError | OpenAIError


def parse_responses(body: dict[str, Any]) -> Parsed:
    model = _model(body)
    max_tokens = _max_tokens(body, "max_output_tokens", required=False)
    if body.get("previous_response_id") is not None:
        raise WireError(
            "previous_response_id: the simulator keeps no responses; send the whole input",
            "previous_response_id",
        )
    instructions = _field(body, "instructions", str) or ""
    system: list[str] = [instructions] if instructions else []
    raw = body.get("input")
    items = [{"role": "user", "content": raw}] if isinstance(raw, str) else raw
    if not isinstance(items, list):
        raise WireError("input: Field required", "input")
    messages: list[Message] = []
    for n, item in enumerate(items):
        where = f"input[{n}]"
        if not isinstance(item, dict):
            raise WireError(f"{where}: invalid item", "input")
        kind = item.get("type", "message")
        if kind == "message":
            role = item.get("role")
            text = _text_of(item.get("content"), f"{where}.content")
            if role in ("system", "developer"):
                system.append(text)
            elif role in ("user", "assistant"):
                messages.append(Message(role, text))
            else:
                raise WireError(f"{where}.role: invalid role {role!r}", "input")
        elif kind == "function_call":
            call = ToolCall(
                str(item.get("call_id", "")),
                str(item.get("name", "")),
                str(item.get("arguments", "")),
            )
            last = messages[-1] if messages else None
            if last is not None and last.role == "assistant":  # the same turn's text or calls
                messages[-1] = Message("assistant", last.content, (*last.tool_calls, call))
            else:
                messages.append(Message("assistant", "", (call,)))
        elif kind == "function_call_output":
            output = item.get("output")
            messages.append(
                Message(
                    "tool",
                    output if isinstance(output, str) else json.dumps(output),
                    tool_call_id=str(item.get("call_id", "")),
                )
            )
        # reasoning items and others carry nothing the simulator counts
    tools = []
    for n, tool in enumerate(_list(body, "tools")):
        if not isinstance(tool, dict):
            raise WireError(f"tools[{n}]: invalid tool", "tools")
        if tool.get("type") == "function":
            tools.append(
                _tool_spec(
                    tool.get("name"), tool.get("description"), tool.get("parameters"), f"tools[{n}]"
                )
            )
    return _openai_parsed(body, model, system, tools, messages, max_tokens)


def with_max_tokens(api: Api, body: dict[str, Any], allowed: int) -> dict[str, Any]:
    """``body`` asking for at most ``allowed`` output tokens, in the field its API reads:
    ``max_tokens`` (Messages), ``max_output_tokens`` (Responses), and for Chat Completions
    the one the client used (``max_completion_tokens`` when it named neither)."""
    name = {"anthropic": "max_tokens", "responses": "max_output_tokens"}.get(api)
    if name is None:
        name = (
            "max_tokens"
            if "max_tokens" in body and "max_completion_tokens" not in body
            else "max_completion_tokens"
        )
    return dict(body, **{name: allowed})


class BodyTooLarge(ValueError):
    """A request body over the limit a server reads (413)."""


async def read_limited(chunks: AsyncIterator[bytes], declared: str | None, limit: int) -> bytes:
    """A request body of at most ``limit`` bytes, refused by its declared length before it
    is read and counted as it streams (a client may declare none, or lie)."""
    if declared is not None and (not declared.isdigit() or int(declared) > limit):
        raise BodyTooLarge(f"request body over {limit} bytes")
    data = bytearray()
    async for chunk in chunks:
        data += chunk
        if len(data) > limit:
            raise BodyTooLarge(f"request body over {limit} bytes")
    return bytes(data)

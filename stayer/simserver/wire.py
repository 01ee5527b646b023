"""The provider wire APIs in and out of the simulator: Anthropic Messages, OpenAI Chat
Completions and OpenAI Responses, as JSON bodies and as server-sent events.

``parse_*`` turn a request body into a :class:`ModelRequest` or raise :class:`WireError`
naming the field; ``*_body`` and ``*_events`` turn a :class:`ModelResponse` into that API's
response object or its stream of events. Usage is written from the normalised
:class:`Usage` in each API's own field names, so a client reads what the provider would
report. No HTTP here (see ``stayer.simserver.app``).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Literal

from stayer.messages import Message, ToolCall, ToolSpec
from stayer.models.base import ModelRequest, ModelResponse
from stayer.usage import Usage

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


# --- Anthropic Messages ---------------------------------------------------------------


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


def _arguments(call: ToolCall) -> dict[str, Any]:
    try:
        value = json.loads(call.arguments)
    except ValueError:  # cut off at max_tokens mid-arguments
        return {}
    return value if isinstance(value, dict) else {}


def anthropic_usage(u: Usage) -> dict[str, Any]:
    return {
        "input_tokens": u.uncached_input_tokens,
        "cache_creation_input_tokens": u.cache_write_tokens,
        "cache_read_input_tokens": u.cache_read_tokens,
        "cache_creation": {
            "ephemeral_5m_input_tokens": u.cache_write_5m_tokens,
            "ephemeral_1h_input_tokens": u.cache_write_1h_tokens,
        },
        "output_tokens": u.output_tokens,
        "service_tier": "standard",
    }


def _anthropic_stop(r: ModelResponse) -> str:
    return "max_tokens" if r.cut_off else "tool_use" if r.message.tool_calls else "end_turn"


def anthropic_body(r: ModelResponse, rid: str) -> dict[str, Any]:
    content: list[dict[str, Any]] = []
    if r.message.content or not r.message.tool_calls:
        content.append({"type": "text", "text": r.message.content})
    content += [
        {"type": "tool_use", "id": c.id, "name": c.name, "input": _arguments(c)}
        for c in r.message.tool_calls
    ]
    return {
        "id": rid,
        "type": "message",
        "role": "assistant",
        "model": r.model,
        "content": content,
        "stop_reason": _anthropic_stop(r),
        "stop_sequence": None,
        "usage": anthropic_usage(r.usage),
    }


def _chunks(text: str, size: int = 48) -> Iterator[str]:
    for i in range(0, len(text), size):
        yield text[i : i + size]


def sse(event: str | None, data: dict[str, Any] | str) -> bytes:
    payload = data if isinstance(data, str) else json.dumps(data, ensure_ascii=False)
    head = f"event: {event}\n" if event else ""
    return f"{head}data: {payload}\n\n".encode()


def anthropic_events(r: ModelResponse, rid: str) -> Iterator[bytes]:
    usage = anthropic_usage(r.usage)
    start = dict(anthropic_body(r, rid), content=[], stop_reason=None)
    start["usage"] = dict(usage, output_tokens=1)
    yield sse("message_start", {"type": "message_start", "message": start})
    yield sse("ping", {"type": "ping"})
    index = 0
    if r.message.content or not r.message.tool_calls:
        yield sse(
            "content_block_start",
            {
                "type": "content_block_start",
                "index": 0,
                "content_block": {"type": "text", "text": ""},
            },
        )
        for piece in _chunks(r.message.content):
            yield sse(
                "content_block_delta",
                {
                    "type": "content_block_delta",
                    "index": 0,
                    "delta": {"type": "text_delta", "text": piece},
                },
            )
        yield sse("content_block_stop", {"type": "content_block_stop", "index": 0})
        index = 1
    for call in r.message.tool_calls:
        block = {"type": "tool_use", "id": call.id, "name": call.name, "input": {}}
        yield sse(
            "content_block_start",
            {"type": "content_block_start", "index": index, "content_block": block},
        )
        for piece in _chunks(call.arguments):
            delta = {"type": "input_json_delta", "partial_json": piece}
            yield sse(
                "content_block_delta",
                {"type": "content_block_delta", "index": index, "delta": delta},
            )
        yield sse("content_block_stop", {"type": "content_block_stop", "index": index})
        index += 1
    end = {"stop_reason": _anthropic_stop(r), "stop_sequence": None}
    yield sse("message_delta", {"type": "message_delta", "delta": end, "usage": usage})
    yield sse("message_stop", {"type": "message_stop"})


def anthropic_error(status: int, message: str) -> dict[str, Any]:
    kind = {
        400: "invalid_request_error",
        401: "authentication_error",
        404: "not_found_error",
        413: "request_too_large",
        429: "rate_limit_error",
    }.get(status, "api_error")
    return {"type": "error", "error": {"type": kind, "message": message}}


# --- OpenAI Chat Completions ----------------------------------------------------------


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


def chat_usage(u: Usage) -> dict[str, Any]:
    return {
        "prompt_tokens": u.input_tokens,
        "completion_tokens": u.output_tokens,
        "total_tokens": u.input_tokens + u.output_tokens,
        "prompt_tokens_details": {"cached_tokens": u.cache_read_tokens, "audio_tokens": 0},
        "completion_tokens_details": {
            "reasoning_tokens": u.reasoning_tokens,
            "audio_tokens": 0,
            "accepted_prediction_tokens": 0,
            "rejected_prediction_tokens": 0,
        },
    }


def _chat_finish(r: ModelResponse) -> str:
    return "length" if r.cut_off else "tool_calls" if r.message.tool_calls else "stop"


def _chat_calls(message: Message) -> list[dict[str, Any]]:
    return [
        {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
        for c in message.tool_calls
    ]


def chat_body(r: ModelResponse, rid: str) -> dict[str, Any]:
    message: dict[str, Any] = {
        "role": "assistant",
        "content": r.message.content or (None if r.message.tool_calls else ""),
        "refusal": None,
    }
    if r.message.tool_calls:
        message["tool_calls"] = _chat_calls(r.message)
    return {
        "id": rid,
        "object": "chat.completion",
        "created": int(time.time()),
        "model": r.model,
        "choices": [
            {"index": 0, "message": message, "finish_reason": _chat_finish(r), "logprobs": None}
        ],
        "usage": chat_usage(r.usage),
        "service_tier": r.service_tier,
        "system_fingerprint": None,
    }


def chat_events(r: ModelResponse, rid: str, include_usage: bool) -> Iterator[bytes]:
    created = int(time.time())

    def chunk(delta: dict[str, Any], finish: str | None = None) -> bytes:
        data: dict[str, Any] = {
            "id": rid,
            "object": "chat.completion.chunk",
            "created": created,
            "model": r.model,
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}],
        }
        if include_usage:
            data["usage"] = None
        return sse(None, data)

    yield chunk({"role": "assistant", "content": ""})
    for piece in _chunks(r.message.content):
        yield chunk({"content": piece})
    for k, call in enumerate(r.message.tool_calls):
        head = {"index": k, "id": call.id, "type": "function"}
        yield chunk({"tool_calls": [dict(head, function={"name": call.name, "arguments": ""})]})
        for piece in _chunks(call.arguments):
            yield chunk({"tool_calls": [{"index": k, "function": {"arguments": piece}}]})
    yield chunk({}, _chat_finish(r))
    if include_usage:
        yield sse(
            None,
            {
                "id": rid,
                "object": "chat.completion.chunk",
                "created": created,
                "model": r.model,
                "choices": [],
                "usage": chat_usage(r.usage),
            },
        )
    yield sse(None, "[DONE]")


def openai_error(status: int, message: str, param: str | None = None) -> dict[str, Any]:
    kind = {401: "authentication_error", 404: "not_found_error", 429: "rate_limit_error"}
    return {
        "error": {
            "message": message,
            "type": kind.get(status, "invalid_request_error" if status < 500 else "server_error"),
            "param": param,
            "code": None,
        }
    }


# --- OpenAI Responses -----------------------------------------------------------------


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


def responses_usage(u: Usage) -> dict[str, Any]:
    return {
        "input_tokens": u.input_tokens,
        "input_tokens_details": {"cached_tokens": u.cache_read_tokens},
        "output_tokens": u.output_tokens,
        "output_tokens_details": {"reasoning_tokens": u.reasoning_tokens},
        "total_tokens": u.input_tokens + u.output_tokens,
    }


def _responses_items(r: ModelResponse, rid: str) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = []
    if r.message.content or not r.message.tool_calls:
        items.append(
            {
                "type": "message",
                "id": f"msg_{rid}",
                "status": "completed",
                "role": "assistant",
                "content": [{"type": "output_text", "text": r.message.content, "annotations": []}],
            }
        )
    items += [
        {
            "type": "function_call",
            "id": f"fc_{rid}_{k}",
            "call_id": c.id,
            "name": c.name,
            "arguments": c.arguments,
            "status": "completed",
        }
        for k, c in enumerate(r.message.tool_calls)
    ]
    return items


def responses_body(
    r: ModelResponse, rid: str, request: ModelRequest | None = None, *, done: bool = True
) -> dict[str, Any]:
    return {
        "id": rid,
        "object": "response",
        "created_at": int(time.time()),
        "status": ("incomplete" if r.cut_off else "completed") if done else "in_progress",
        "incomplete_details": {"reason": "max_output_tokens"} if done and r.cut_off else None,
        "error": None,
        "model": r.model,
        "output": _responses_items(r, rid) if done else [],
        "usage": responses_usage(r.usage) if done else None,
        "instructions": request.system if request else None,
        "max_output_tokens": request.max_tokens if request else None,
        "parallel_tool_calls": True,
        "tool_choice": "auto",
        "tools": [],
        "temperature": 1.0,
        "top_p": 1.0,
        "metadata": {},
        "text": {"format": {"type": "text"}},
        "truncation": "disabled",
        "service_tier": r.service_tier,
        "store": False,
    }


def responses_events(r: ModelResponse, rid: str, request: ModelRequest) -> Iterator[bytes]:
    seq = 0

    def event(kind: str, **data: Any) -> bytes:
        nonlocal seq
        seq += 1
        return sse(kind, {"type": kind, "sequence_number": seq - 1, **data})

    pending = responses_body(r, rid, request, done=False)
    yield event("response.created", response=pending)
    yield event("response.in_progress", response=pending)
    for index, item in enumerate(_responses_items(r, rid)):
        if item["type"] == "message":
            text = item["content"][0]["text"]
            yield event(
                "response.output_item.added",
                output_index=index,
                item=dict(item, status="in_progress", content=[]),
            )
            part = {"type": "output_text", "text": "", "annotations": []}
            yield event(
                "response.content_part.added",
                item_id=item["id"], output_index=index, content_index=0, part=part,
            )  # fmt: skip
            for piece in _chunks(text):
                yield event(
                    "response.output_text.delta",
                    item_id=item["id"], output_index=index, content_index=0, delta=piece,
                    logprobs=[],
                )  # fmt: skip
            yield event(
                "response.output_text.done",
                item_id=item["id"], output_index=index, content_index=0, text=text, logprobs=[],
            )  # fmt: skip
            yield event(
                "response.content_part.done",
                item_id=item["id"], output_index=index, content_index=0,
                part=dict(part, text=text),
            )  # fmt: skip
        else:
            yield event(
                "response.output_item.added",
                output_index=index,
                item=dict(item, status="in_progress", arguments=""),
            )
            for piece in _chunks(item["arguments"]):
                yield event(
                    "response.function_call_arguments.delta",
                    item_id=item["id"], output_index=index, delta=piece,
                )  # fmt: skip
            yield event(
                "response.function_call_arguments.done",
                item_id=item["id"], output_index=index, name=item["name"],
                arguments=item["arguments"],
            )  # fmt: skip
        yield event("response.output_item.done", output_index=index, item=item)
    final = responses_body(r, rid, request)
    yield event("response.incomplete" if r.cut_off else "response.completed", response=final)

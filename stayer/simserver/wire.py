"""The simulator's replies on the providers' wire APIs: Anthropic Messages, OpenAI Chat
Completions and OpenAI Responses, as JSON bodies and as server-sent events.

``*_body`` and ``*_events`` turn a :class:`ModelResponse` into that API's response object
or its stream of events. Usage is written from the normalised :class:`Usage` in each API's
own field names, so a client reads what the provider would report. Requests are read by
``stayer.metering.requests``.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

from stayer.messages import Message, ToolCall
from stayer.models.base import ModelRequest, ModelResponse
from stayer.usage import Usage

# --- Anthropic Messages ---------------------------------------------------------------


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


# --- OpenAI Chat Completions ----------------------------------------------------------


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


# --- OpenAI Responses -----------------------------------------------------------------


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

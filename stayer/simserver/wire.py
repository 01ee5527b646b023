"""The simulator's replies on the providers' wire APIs: Anthropic Messages, OpenAI Chat
Completions and OpenAI Responses, as JSON bodies and as server-sent events.

``*_body`` and ``*_events`` turn a :class:`ModelResponse` into that API's response object
or its stream of events: msgspec Structs whose fields are the API's keys in its order
(``UNSET`` where a key is absent), made into JSON only by :func:`json_body` and :func:`sse`.
Usage is written from the normalised :class:`Usage` in each API's own field names, so a
client reads what the provider would report. Requests are read by
``stayer.metering.requests``.
"""

from __future__ import annotations

import itertools
import json
import time
from collections.abc import Iterator
from typing import Any

import msgspec
from msgspec import UNSET, Struct, UnsetType, field

from stayer.models import sim
from stayer.models.anthropic_wire import TextBlock, ToolUseBlock, tool_input
from stayer.models.base import ModelRequest, ModelResponse
from stayer.models.openai_wire import ChatToolCall, chat_tool_calls
from stayer.models.sim import AnthropicUsage, ResponsesUsage
from stayer.usage import Usage


def json_body(document: Struct) -> Any:
    """A reply document as the builtins a JSON response encodes (``json.dumps``, whose
    float spelling the bytes keep)."""
    return msgspec.to_builtins(document)


def sse(event: str | None, data: Struct | str) -> bytes:
    payload = data if isinstance(data, str) else json.dumps(json_body(data), ensure_ascii=False)
    head = f"event: {event}\n" if event else ""
    return f"{head}data: {payload}\n\n".encode()


def _chunks(text: str, size: int = 48) -> Iterator[str]:
    for i in range(0, len(text), size):
        yield text[i : i + size]


# --- Anthropic Messages ---------------------------------------------------------------


class AnthropicMessage(Struct, kw_only=True):
    id: str
    kind: str = field(default="message", name="type")
    role: str = "assistant"
    model: str
    content: list[TextBlock | ToolUseBlock]
    stop_reason: str | None
    stop_sequence: None = None
    usage: AnthropicUsage


class MessageStart(Struct, tag="message_start", tag_field="type"):
    message: AnthropicMessage


class Ping(Struct, tag="ping", tag_field="type"):
    pass


class BlockStart(Struct, tag="content_block_start", tag_field="type"):
    index: int
    content_block: TextBlock | ToolUseBlock


class TextDelta(Struct, tag="text_delta", tag_field="type"):
    text: str


class InputJsonDelta(Struct, tag="input_json_delta", tag_field="type"):
    partial_json: str


class BlockDelta(Struct, tag="content_block_delta", tag_field="type"):
    index: int
    delta: TextDelta | InputJsonDelta


class BlockStop(Struct, tag="content_block_stop", tag_field="type"):
    index: int


class StopDelta(Struct):
    stop_reason: str
    stop_sequence: None = None


class MessageDelta(Struct, tag="message_delta", tag_field="type"):
    delta: StopDelta
    usage: AnthropicUsage


class MessageStop(Struct, tag="message_stop", tag_field="type"):
    pass


def anthropic_usage(u: Usage) -> AnthropicUsage:
    usage = sim.anthropic_usage(
        u.uncached_input_tokens,
        u.cache_write_5m_tokens,
        u.cache_write_1h_tokens,
        u.cache_read_tokens,
        u.output_tokens,
    )
    usage.service_tier = "standard"
    return usage


def _anthropic_stop(r: ModelResponse) -> str:
    return "max_tokens" if r.cut_off else "tool_use" if r.message.tool_calls else "end_turn"


def anthropic_body(r: ModelResponse, rid: str) -> AnthropicMessage:
    content: list[TextBlock | ToolUseBlock] = []
    if r.message.content or not r.message.tool_calls:
        content.append(TextBlock(r.message.content))
    content += [ToolUseBlock(c.id, c.name, tool_input(c.arguments)) for c in r.message.tool_calls]
    return AnthropicMessage(
        id=rid,
        model=r.model,
        content=content,
        stop_reason=_anthropic_stop(r),
        usage=anthropic_usage(r.usage),
    )


def anthropic_events(r: ModelResponse, rid: str) -> Iterator[bytes]:
    usage = anthropic_usage(r.usage)
    start = msgspec.structs.replace(
        anthropic_body(r, rid),
        content=[],
        stop_reason=None,
        usage=msgspec.structs.replace(usage, output_tokens=1),
    )
    yield sse("message_start", MessageStart(start))
    yield sse("ping", Ping())
    index = 0
    if r.message.content or not r.message.tool_calls:
        yield sse("content_block_start", BlockStart(0, TextBlock("")))
        for piece in _chunks(r.message.content):
            yield sse("content_block_delta", BlockDelta(0, TextDelta(piece)))
        yield sse("content_block_stop", BlockStop(0))
        index = 1
    for call in r.message.tool_calls:
        yield sse("content_block_start", BlockStart(index, ToolUseBlock(call.id, call.name, {})))
        for piece in _chunks(call.arguments):
            yield sse("content_block_delta", BlockDelta(index, InputJsonDelta(piece)))
        yield sse("content_block_stop", BlockStop(index))
        index += 1
    yield sse("message_delta", MessageDelta(StopDelta(_anthropic_stop(r)), usage))
    yield sse("message_stop", MessageStop())


# --- OpenAI Chat Completions ----------------------------------------------------------


class PromptTokensDetails(Struct):
    cached_tokens: int
    audio_tokens: int = 0


class CompletionTokensDetails(Struct):
    reasoning_tokens: int
    audio_tokens: int = 0
    accepted_prediction_tokens: int = 0
    rejected_prediction_tokens: int = 0


class ChatUsage(Struct):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails
    completion_tokens_details: CompletionTokensDetails


class ChatMessage(Struct, kw_only=True):
    role: str = "assistant"
    content: str | None
    refusal: None = None
    tool_calls: list[ChatToolCall] | UnsetType = UNSET


class ChatChoice(Struct, kw_only=True):
    index: int = 0
    message: ChatMessage
    finish_reason: str
    logprobs: None = None


class ChatCompletion(Struct, kw_only=True):
    id: str
    object: str = "chat.completion"
    created: int
    model: str
    choices: list[ChatChoice]
    usage: ChatUsage
    service_tier: str | None
    system_fingerprint: None = None


class FunctionDelta(Struct, kw_only=True):
    name: str | UnsetType = UNSET
    arguments: str


class ToolCallDelta(Struct, kw_only=True):
    index: int
    id: str | UnsetType = UNSET
    kind: str | UnsetType = field(default=UNSET, name="type")
    function: FunctionDelta


class ChatDelta(Struct, kw_only=True):
    role: str | UnsetType = UNSET
    content: str | UnsetType = UNSET
    tool_calls: list[ToolCallDelta] | UnsetType = UNSET


class ChunkChoice(Struct, kw_only=True):
    index: int = 0
    delta: ChatDelta
    finish_reason: str | None
    logprobs: None = None


class ChatChunk(Struct, kw_only=True):
    id: str
    object: str = "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChunkChoice]
    usage: ChatUsage | None | UnsetType = UNSET


def chat_usage(u: Usage) -> ChatUsage:
    return ChatUsage(
        prompt_tokens=u.input_tokens,
        completion_tokens=u.output_tokens,
        total_tokens=u.input_tokens + u.output_tokens,
        prompt_tokens_details=PromptTokensDetails(cached_tokens=u.cache_read_tokens),
        completion_tokens_details=CompletionTokensDetails(reasoning_tokens=u.reasoning_tokens),
    )


def _chat_finish(r: ModelResponse) -> str:
    return "length" if r.cut_off else "tool_calls" if r.message.tool_calls else "stop"


def chat_body(r: ModelResponse, rid: str) -> ChatCompletion:
    message = ChatMessage(content=r.message.content or (None if r.message.tool_calls else ""))
    if r.message.tool_calls:
        message.tool_calls = chat_tool_calls(r.message)
    return ChatCompletion(
        id=rid,
        created=int(time.time()),
        model=r.model,
        choices=[ChatChoice(message=message, finish_reason=_chat_finish(r))],
        usage=chat_usage(r.usage),
        service_tier=r.service_tier,
    )


def chat_events(r: ModelResponse, rid: str, include_usage: bool) -> Iterator[bytes]:
    created = int(time.time())

    def chunk(delta: ChatDelta, finish: str | None = None) -> bytes:
        choice = ChunkChoice(delta=delta, finish_reason=finish)
        data = ChatChunk(id=rid, created=created, model=r.model, choices=[choice])
        if include_usage:
            data.usage = None
        return sse(None, data)

    yield chunk(ChatDelta(role="assistant", content=""))
    for piece in _chunks(r.message.content):
        yield chunk(ChatDelta(content=piece))
    for k, call in enumerate(r.message.tool_calls):
        head = FunctionDelta(name=call.name, arguments="")
        yield chunk(
            ChatDelta(
                tool_calls=[ToolCallDelta(index=k, id=call.id, kind="function", function=head)]
            )
        )
        for piece in _chunks(call.arguments):
            delta = ToolCallDelta(index=k, function=FunctionDelta(arguments=piece))
            yield chunk(ChatDelta(tool_calls=[delta]))
    yield chunk(ChatDelta(), _chat_finish(r))
    if include_usage:
        yield sse(
            None,
            ChatChunk(
                id=rid, created=created, model=r.model, choices=[], usage=chat_usage(r.usage)
            ),
        )
    yield sse(None, "[DONE]")


# --- OpenAI Responses -----------------------------------------------------------------


class OutputText(Struct, tag="output_text", tag_field="type"):
    text: str
    annotations: list[str] = []  # always empty: the simulator cites nothing


class OutputMessage(Struct, tag="message", tag_field="type", kw_only=True):
    id: str
    status: str = "completed"
    role: str = "assistant"
    content: list[OutputText]


class FunctionCallItem(Struct, tag="function_call", tag_field="type", kw_only=True):
    id: str
    call_id: str
    name: str
    arguments: str
    status: str = "completed"


OutputItem = OutputMessage | FunctionCallItem


class IncompleteDetails(Struct):
    reason: str


class TextFormat(Struct, tag="text", tag_field="type"):
    pass


class TextConfig(Struct):
    format: TextFormat


class ResponseObject(Struct, kw_only=True):
    id: str
    object: str = "response"
    created_at: int
    status: str
    incomplete_details: IncompleteDetails | None
    error: None = None
    model: str
    output: list[OutputItem]
    usage: ResponsesUsage | None
    instructions: str | None
    max_output_tokens: int | None
    parallel_tool_calls: bool = True
    tool_choice: str = "auto"
    tools: list[str] = []  # always empty: the simulator's replies name no tools
    temperature: float = 1.0
    top_p: float = 1.0
    metadata: dict[str, str] = {}
    text: TextConfig = field(default_factory=lambda: TextConfig(TextFormat()))
    truncation: str = "disabled"
    service_tier: str | None
    store: bool = False


# The stream's events: ``type`` names the event, ``sequence_number`` counts from 0.
class ResponseState(Struct):
    kind: str = field(name="type")
    sequence_number: int
    response: ResponseObject


class ItemEvent(Struct):
    kind: str = field(name="type")
    sequence_number: int
    output_index: int
    item: OutputItem


class _OnItem(Struct):
    kind: str = field(name="type")
    sequence_number: int
    item_id: str
    output_index: int


class _OnContent(_OnItem):
    content_index: int


class PartEvent(_OnContent):
    part: OutputText


class TextDeltaEvent(_OnContent):
    delta: str
    logprobs: list[str] = []


class TextDoneEvent(_OnContent):
    text: str
    logprobs: list[str] = []


class ArgumentsDeltaEvent(_OnItem):
    delta: str


class ArgumentsDoneEvent(_OnItem):
    name: str
    arguments: str


def responses_usage(u: Usage) -> ResponsesUsage:
    return sim.responses_usage(
        u.input_tokens, u.cache_read_tokens, u.output_tokens, u.reasoning_tokens
    )


def _responses_items(r: ModelResponse, rid: str) -> list[OutputItem]:
    items: list[OutputItem] = []
    if r.message.content or not r.message.tool_calls:
        items.append(OutputMessage(id=f"msg_{rid}", content=[OutputText(r.message.content)]))
    items += [
        FunctionCallItem(id=f"fc_{rid}_{k}", call_id=c.id, name=c.name, arguments=c.arguments)
        for k, c in enumerate(r.message.tool_calls)
    ]
    return items


def responses_body(
    r: ModelResponse, rid: str, request: ModelRequest | None = None, *, done: bool = True
) -> ResponseObject:
    return ResponseObject(
        id=rid,
        created_at=int(time.time()),
        status=("incomplete" if r.cut_off else "completed") if done else "in_progress",
        incomplete_details=IncompleteDetails("max_output_tokens") if done and r.cut_off else None,
        model=r.model,
        output=_responses_items(r, rid) if done else [],
        usage=responses_usage(r.usage) if done else None,
        instructions=request.system if request else None,
        max_output_tokens=request.max_tokens if request else None,
        service_tier=r.service_tier,
    )


def responses_events(r: ModelResponse, rid: str, request: ModelRequest) -> Iterator[bytes]:
    seq = itertools.count()
    replace = msgspec.structs.replace
    pending = responses_body(r, rid, request, done=False)
    for kind in ("response.created", "response.in_progress"):
        yield sse(kind, ResponseState(kind, next(seq), pending))
    for index, item in enumerate(_responses_items(r, rid)):
        kind = "response.output_item.added"
        if isinstance(item, OutputMessage):
            text = item.content[0].text
            opened: OutputItem = replace(item, status="in_progress", content=[])
            yield sse(kind, ItemEvent(kind, next(seq), index, opened))
            kind = "response.content_part.added"
            yield sse(kind, PartEvent(kind, next(seq), item.id, index, 0, OutputText("")))
            kind = "response.output_text.delta"
            for piece in _chunks(text):
                yield sse(kind, TextDeltaEvent(kind, next(seq), item.id, index, 0, piece))
            kind = "response.output_text.done"
            yield sse(kind, TextDoneEvent(kind, next(seq), item.id, index, 0, text))
            kind = "response.content_part.done"
            yield sse(kind, PartEvent(kind, next(seq), item.id, index, 0, OutputText(text)))
        else:
            opened = replace(item, status="in_progress", arguments="")
            yield sse(kind, ItemEvent(kind, next(seq), index, opened))
            kind = "response.function_call_arguments.delta"
            for piece in _chunks(item.arguments):
                yield sse(kind, ArgumentsDeltaEvent(kind, next(seq), item.id, index, piece))
            kind = "response.function_call_arguments.done"
            yield sse(
                kind,
                ArgumentsDoneEvent(kind, next(seq), item.id, index, item.name, item.arguments),
            )
        kind = "response.output_item.done"
        yield sse(kind, ItemEvent(kind, next(seq), index, item))
    final = responses_body(r, rid, request)
    kind = "response.incomplete" if r.cut_off else "response.completed"
    yield sse(kind, ResponseState(kind, next(seq), final))

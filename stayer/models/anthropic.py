"""Anthropic Messages API adapter.

Anthropic caches only up to explicit ``cache_control`` breakpoints (at most 4 per
request), so this adapter is where the context layer's cache plan becomes bytes on the
wire. ``ModelRequest.cache_breakpoints`` holds indices into ``request.messages``: a
breakpoint after message *i* goes on the last content block that message produced;
``-1`` means "end of the prefix" and goes on the system block (Anthropic's cache order is
tools → system → messages, so that also covers every tool definition), or on the last
tool definition when there is no system prompt.

Fast mode: ``ModelRequest.service_tier == "fast"`` is sent as the Messages API ``speed:
"fast"`` parameter together with the ``fast-mode-2026-02-01`` beta header that some
models require. ``"auto"`` / ``"standard_only"`` are passed as ``service_tier``; other
values (``"standard"``, ``"default"``) are Anthropic's default and send nothing.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Sequence
from typing import Any

import anthropic
import msgspec
from anthropic.types import Message as AnthropicMessage
from msgspec import UNSET, Struct, UnsetType

from stayer.errors import ConfigError
from stayer.messages import Message, ToolCall
from stayer.models.anthropic_wire import (
    EPHEMERAL,
    Block,
    TextBlock,
    ToolDef,
    ToolResultBlock,
    ToolUseBlock,
    tool_input,
)
from stayer.models.base import ModelError, ModelRequest, ModelResponse
from stayer.models.retry import DEFAULT_RETRY, RetryPolicy, SdkErrors, call_with_retries
from stayer.models.wire import MessageJson, dumps, post_json
from stayer.usage import Usage

MAX_BREAKPOINTS = 4  # Anthropic rejects requests with more cache_control blocks
FAST_MODE_BETA = "fast-mode-2026-02-01"
_ERRORS = SdkErrors(
    status=anthropic.APIStatusError,
    connection=anthropic.APIConnectionError,
    base=anthropic.AnthropicError,
)


class Turn(Struct):
    role: str
    content: list[Block]


class AfterMessages(Struct, kw_only=True):
    """A request's fields after its messages, in the body's key order."""

    system: list[TextBlock] | UnsetType = UNSET
    tools: list[ToolDef] | UnsetType = UNSET
    speed: str | UnsetType = UNSET  # "fast": fast mode
    service_tier: str | UnsetType = UNSET


#: A block's JSON. Text and tool results hold only strings, which msgspec writes as
#: ``json.dumps`` does; a tool call's input is the model's JSON, whose floats only
#: ``json.dumps`` spells as the bytes always had them (1e+16, not 1e16).
_encode = msgspec.json.Encoder().encode


def _block_json(block: Block) -> bytes:
    if isinstance(block, ToolUseBlock):
        return dumps(msgspec.to_builtins(block)).encode()
    return _encode(block)


class AnthropicModel:
    """A Claude model over the official async SDK, with our retries (the SDK's are off)."""

    provider = "anthropic"

    def __init__(
        self,
        model_id: str,
        *,
        api_key: str | None = None,
        base_url: str | None = None,
        client: anthropic.AsyncAnthropic | None = None,
        retry: RetryPolicy = DEFAULT_RETRY,
        timeout_s: float = 600.0,
        spec: str | None = None,
    ) -> None:
        self.model_id = model_id
        self.spec = spec or f"anthropic:{model_id}"
        self.retry = retry
        # An explicit per-call timeout also stops the SDK refusing non-streaming calls with a
        # large max_tokens ("streaming is required ..."): we set the limit ourselves.
        self.timeout_s = timeout_s
        if client is None:
            key = api_key or os.environ.get("ANTHROPIC_API_KEY")
            if not key:
                raise ConfigError(
                    f"no API key for anthropic:{model_id}: set ANTHROPIC_API_KEY (or pass api_key)"
                )
            client = anthropic.AsyncAnthropic(api_key=key, base_url=base_url, max_retries=0)
            self._owns_client = True
        else:
            client = client.with_options(max_retries=0)
            self._owns_client = False
        self.client = client
        self._wire = MessageJson(wire_blocks)

    async def complete(self, request: ModelRequest) -> ModelResponse:
        body, headers = build_body(self.model_id, request, self._wire)

        async def attempt() -> tuple[Any, float]:
            t0 = time.perf_counter()
            resp = await post_json(
                self.client, "/v1/messages", body, AnthropicMessage, headers, self.timeout_s
            )
            return resp, time.perf_counter() - t0

        resp, latency = await call_with_retries(
            attempt, what=f"anthropic {self.model_id}", errors=_ERRORS, policy=self.retry
        )
        return parse_response(resp, latency)

    async def count_tokens(self, request: ModelRequest) -> int | None:
        """Anthropic's own count of the request's prompt (the free ``count_tokens``
        endpoint; its tokenizer is not published). None when it cannot be had: the budget
        then keeps its estimate and bound."""
        params = build_params(self.model_id, request)
        body = {k: params[k] for k in ("model", "messages", "system", "tools") if k in params}
        try:
            resp = await self.client.messages.count_tokens(**body, timeout=60.0)
        except anthropic.AnthropicError:
            return None
        return resp.input_tokens

    async def aclose(self) -> None:
        """Close the HTTP pool if we created it (a caller-supplied client is theirs)."""
        if self._owns_client:
            await self.client.close()


# --- request ---------------------------------------------------------------------------


# Where a cache breakpoint goes: "prefix" (the system block, else the last tool), or
# (message index, block index) into the blocks each message produces.
Position = str | tuple[int, int]
_PREFIX = "prefix"


def build_params(model_id: str, request: ModelRequest) -> dict[str, Any]:
    """The keyword arguments for ``messages.create``; pure, so tests can inspect it.
    ``build_body`` sends the same request, encoded from per-message pieces."""
    tools, system = _tools(request), _system(request)
    per_message = [_blocks(m) for m in request.messages]
    marked = _breakpoints(
        request.cache_breakpoints, [len(b) for b in per_message], bool(system or tools)
    )
    if _PREFIX in marked:
        (system or tools)[-1].cache_control = EPHEMERAL
    messages: list[Turn] = []
    for i, blocks in enumerate(per_message):
        for j, (role, block) in enumerate(blocks):
            if (i, j) in marked:
                block = msgspec.structs.replace(block, cache_control=EPHEMERAL)
            if messages and messages[-1].role == role:
                messages[-1].content.append(block)
            else:
                messages.append(Turn(role, [block]))
    params = {
        "model": model_id,
        "max_tokens": request.max_tokens,
        "messages": msgspec.to_builtins(messages),
        **msgspec.to_builtins(_after_messages(request, system, tools)),
    }
    if request.service_tier == "fast":
        params["extra_headers"] = _fast_headers()
    return params


def build_body(
    model_id: str, request: ModelRequest, wire: MessageJson[WireBlocks]
) -> tuple[bytes, dict[str, str]]:
    """The request ``build_params`` describes, as the JSON body and the extra headers;
    each message's blocks are encoded once, by ``wire``, for as long as it is in the context.
    The body is joined from its pieces in one go: at 1M tokens every extra copy of it costs
    milliseconds."""
    tools, system = _tools(request), _system(request)
    per_message = wire(request.messages)
    marked = _breakpoints(
        request.cache_breakpoints, [len(b) for b in per_message], bool(system or tools)
    )
    if _PREFIX in marked:
        (system or tools)[-1].cache_control = EPHEMERAL
    headers = _fast_headers() if request.service_tier == "fast" else {}
    head = {"model": model_id, "max_tokens": request.max_tokens}
    pieces = [dumps(head)[:-1].encode(), b',"messages":[']
    role_now = ""
    for i, blocks in enumerate(per_message):
        for j, (role, block) in enumerate(blocks):
            if (i, j) in marked:
                block = block[:-1] + _CACHE_CONTROL_FIELD  # its last field, as in build_params
            if role == role_now:
                pieces += (b",", block)
            else:
                pieces += (
                    b']},{"role":' if role_now else b'{"role":',
                    _ROLES[role],
                    b',"content":[',
                    block,
                )
                role_now = role
    pieces.append(b"]}]" if role_now else b"]")
    rest = dumps(msgspec.to_builtins(_after_messages(request, system, tools)))[1:-1]
    pieces += (b"," + rest.encode() if rest else b"", b"}")
    return b"".join(pieces), headers


WireBlocks = tuple[tuple[str, bytes], ...]  # (role, block JSON) per block of one message
_CACHE_CONTROL_FIELD = b',"cache_control":' + _encode(EPHEMERAL) + b"}"
_ROLES = {role: dumps(role).encode() for role in ("user", "assistant")}


def wire_blocks(m: Message) -> WireBlocks:
    return tuple((role, _block_json(block)) for role, block in _blocks(m))


def _tools(request: ModelRequest) -> list[ToolDef]:
    return [ToolDef(t.name, t.description, t.parameters) for t in request.tools]


def _system(request: ModelRequest) -> list[TextBlock]:
    return [TextBlock(request.system)] if request.system else []


def _after_messages(
    request: ModelRequest, system: list[TextBlock], tools: list[ToolDef]
) -> AfterMessages:
    after = AfterMessages()
    if system:
        after.system = system
    if tools:
        after.tools = tools
    if request.service_tier == "fast":
        after.speed = "fast"
    elif request.service_tier in ("auto", "standard_only"):
        after.service_tier = request.service_tier
    return after


def _fast_headers() -> dict[str, str]:
    return {"anthropic-beta": FAST_MODE_BETA}


def _breakpoints(
    indices: Sequence[int], blocks_per_message: list[int], has_prefix: bool
) -> set[Position]:
    """Where the cache breakpoints go. A breakpoint after message *i* marks the last block
    emitted up to and including it (a message that produced none shares its predecessor's
    end, or the prefix's); ``-1`` marks the prefix."""
    last_after: list[Position | None] = []
    last: Position | None = None
    for i, n in enumerate(blocks_per_message):
        if n:
            last = (i, n - 1)
        last_after.append(last)
    prefix: Position | None = _PREFIX if has_prefix else None
    targets: list[Position] = []
    for index in sorted(set(indices)):
        if index == -1:
            position = prefix
        elif 0 <= index < len(last_after):
            position = last_after[index] or prefix
        else:
            continue  # out of range: nothing sensible to mark
        if position is not None and position not in targets:
            targets.append(position)
    if len(targets) > MAX_BREAKPOINTS:
        # Keep the first (the stable prefix, reused all run) and the most recent ones
        # (where the next call's read starts).
        targets = targets[:1] + targets[-(MAX_BREAKPOINTS - 1) :]
    return set(targets)


def _blocks(m: Message) -> list[tuple[str, Block]]:
    """One history message → its Messages API blocks, each with the role of the turn it
    belongs to. Consecutive same-role blocks are merged into one turn (so a run of tool
    results becomes ONE user message, as the API requires)."""
    if m.role == "assistant":
        blocks: list[tuple[str, Block]] = []
        if m.content.strip():  # the API rejects empty / whitespace-only text blocks
            blocks.append(("assistant", TextBlock(m.content)))
        for call in m.tool_calls:
            blocks.append(
                ("assistant", ToolUseBlock(call.id, call.name, tool_input(call.arguments)))
            )
        return blocks
    if m.role == "tool" and m.tool_call_id:
        result = ToolResultBlock(tool_use_id=m.tool_call_id, is_error=m.is_error)
        if m.content:
            result.content = m.content
        return [("user", result)]
    if m.content.strip():  # user text (or a tool result with no id: keep its text)
        return [("user", TextBlock(m.content))]
    return []


# --- response --------------------------------------------------------------------------


def parse_response(resp: Any, latency_s: float) -> ModelResponse:
    """SDK ``Message`` → provider-neutral response. Thinking blocks are not kept: the
    neutral Message has no slot for them."""
    texts: list[str] = []
    calls: list[ToolCall] = []
    for block in resp.content or []:
        if block.type == "text":
            texts.append(block.text)
        elif block.type == "tool_use":
            args = json.dumps(block.input if block.input is not None else {}, ensure_ascii=False)
            calls.append(ToolCall(id=block.id, name=block.name, arguments=args))
    if resp.usage is None:
        raise ModelError(f"anthropic {resp.model}: response without usage")
    raw_usage = resp.usage.model_dump(mode="json", exclude_unset=True)
    tier = "fast" if raw_usage.get("speed") == "fast" else raw_usage.get("service_tier")
    return ModelResponse(
        message=Message(role="assistant", content="".join(texts), tool_calls=tuple(calls)),
        usage=Usage.from_anthropic(raw_usage),
        raw_usage=raw_usage,
        model=resp.model,
        latency_s=latency_s,
        stop_reason=resp.stop_reason or "",
        service_tier=tier,
    )

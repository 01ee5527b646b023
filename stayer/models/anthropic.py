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
from typing import Any

import anthropic

from stayer.errors import ConfigError
from stayer.models.base import Message, ModelError, ModelRequest, ModelResponse, ToolCall
from stayer.models.retry import DEFAULT_RETRY, RetryPolicy, SdkErrors, call_with_retries
from stayer.usage import Usage

MAX_BREAKPOINTS = 4  # Anthropic rejects requests with more cache_control blocks
FAST_MODE_BETA = "fast-mode-2026-02-01"
_EPHEMERAL = {"type": "ephemeral"}
_ERRORS = SdkErrors(
    status=anthropic.APIStatusError,
    connection=anthropic.APIConnectionError,
    base=anthropic.AnthropicError,
)

Block = dict[str, Any]


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

    async def complete(self, request: ModelRequest) -> ModelResponse:
        params = build_params(self.model_id, request)

        async def attempt() -> tuple[Any, float]:
            t0 = time.perf_counter()
            resp = await self.client.messages.create(**params, timeout=self.timeout_s)
            return resp, time.perf_counter() - t0

        resp, latency = await call_with_retries(
            attempt, what=f"anthropic {self.model_id}", errors=_ERRORS, policy=self.retry
        )
        return parse_response(resp, latency)

    async def aclose(self) -> None:
        """Close the HTTP pool if we created it (a caller-supplied client is theirs)."""
        if self._owns_client:
            await self.client.close()


# --- request ---------------------------------------------------------------------------


def build_params(model_id: str, request: ModelRequest) -> dict[str, Any]:
    """The keyword arguments for ``messages.create``; pure, so tests can inspect it."""
    tools: list[Block] = [
        {"name": t.name, "description": t.description, "input_schema": t.parameters}
        for t in request.tools
    ]
    system: list[Block] = [{"type": "text", "text": request.system}] if request.system else []
    messages, last_block_after = _to_messages(request.messages)

    prefix_end: Block | None = system[-1] if system else (tools[-1] if tools else None)
    targets: list[Block] = []
    for index in sorted(set(request.cache_breakpoints)):
        if index == -1:
            block = prefix_end
        elif 0 <= index < len(last_block_after):
            # A message that produced no block (empty text) shares its predecessor's end.
            block = last_block_after[index] or prefix_end
        else:
            continue  # out of range: nothing sensible to mark
        if block is not None and all(block is not t for t in targets):
            targets.append(block)
    if len(targets) > MAX_BREAKPOINTS:
        # Keep the first (the stable prefix, reused all run) and the most recent ones
        # (where the next call's read starts).
        targets = targets[:1] + targets[-(MAX_BREAKPOINTS - 1) :]
    for block in targets:
        block["cache_control"] = dict(_EPHEMERAL)

    params: dict[str, Any] = {
        "model": model_id,
        "max_tokens": request.max_tokens,
        "messages": messages,
    }
    if system:
        params["system"] = system
    if tools:
        params["tools"] = tools
    tier = request.service_tier
    if tier == "fast":
        params["speed"] = "fast"
        params["extra_headers"] = {"anthropic-beta": FAST_MODE_BETA}
    elif tier in ("auto", "standard_only"):
        params["service_tier"] = tier
    return params


def _to_messages(history: list[Message]) -> tuple[list[dict[str, Any]], list[Block | None]]:
    """History → Messages API turns. Consecutive same-role turns are merged (so a run of
    tool results becomes ONE user message, as the API requires). Also returns, per history
    index, the last block emitted up to and including that message."""
    out: list[dict[str, Any]] = []
    last_after: list[Block | None] = []
    last: Block | None = None

    def emit(role: str, block: Block) -> None:
        nonlocal last
        if out and out[-1]["role"] == role:
            out[-1]["content"].append(block)
        else:
            out.append({"role": role, "content": [block]})
        last = block

    for m in history:
        if m.role == "assistant":
            if m.content.strip():  # the API rejects empty / whitespace-only text blocks
                emit("assistant", {"type": "text", "text": m.content})
            for call in m.tool_calls:
                emit(
                    "assistant",
                    {
                        "type": "tool_use",
                        "id": call.id,
                        "name": call.name,
                        "input": _parse_args(call.arguments),
                    },
                )
        elif m.role == "tool" and m.tool_call_id:
            block: Block = {"type": "tool_result", "tool_use_id": m.tool_call_id}
            if m.content:
                block["content"] = m.content
            block["is_error"] = m.is_error
            emit("user", block)
        elif m.content.strip():  # user text (or a tool result with no id: keep its text)
            emit("user", {"type": "text", "text": m.content})
        last_after.append(last)
    return out, last_after


def _parse_args(arguments: str) -> dict[str, Any]:
    """Tool-call arguments as the object the API wants. They came from the model, so they
    normally parse; if not, send ``{}`` rather than fail the whole call."""
    try:
        value = json.loads(arguments) if arguments else {}
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


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

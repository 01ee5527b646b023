"""The offline provider simulator: a provider in everything but intelligence.

``sim:<model-id>`` counts the tokens of the real request, applies that provider's
documented caching rules (:mod:`stayer.models.caching`), reports usage in the provider's
own field names and waits a modelled latency; what the model *does* comes from a policy
(:mod:`stayer.models.sim_policies`). It never generates more than ``max_tokens``: a
longer reply is cut, billed as exactly ``max_tokens`` and stopped with the provider's own
"cut off" reason. Caching is modelled at segment boundaries (tool schemas, system, each
message) with chained fingerprints; a prefix diverging inside a segment diverges at its
start (never over-reporting a hit).

More: ``docs/internals.md#models-sim``.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any, Protocol, runtime_checkable

import msgspec
from msgspec import UNSET, Struct, UnsetType

from stayer.messages import Message, ToolCall
from stayer.models.base import ModelRequest, ModelResponse
from stayer.models.caching import CacheRules, cache_rules, provider_of
from stayer.tokens import MessageCounter, ToolsText, message_ids
from stayer.usage import Usage


@dataclass(slots=True)
class CacheOutcome:
    total: int
    read: int
    write_5m: int = 0
    write_1h: int = 0


class ProviderCache:
    """The provider's cache state for one model: boundary fingerprint → expiry time."""

    def __init__(self, rules: CacheRules) -> None:
        self.rules = rules
        self.entries: dict[int, float] = {}
        # Fingerprints of the previous request, reused when its messages reappear
        # unchanged (by identity), so a step costs O(new messages), not O(history).
        self._prev_segments: list[object] = []
        self._prev_fps: list[int] = []

    def fingerprints(self, segments: list[object]) -> list[int]:
        prev, fps = self._prev_segments, self._prev_fps
        n = 0
        limit = min(len(prev), len(segments))
        while n < limit and prev[n] is segments[n]:
            n += 1
        out = fps[:n]
        h = out[-1] if out else 0
        for seg in segments[n:]:
            h = hash((h, seg))
            out.append(h)
        self._prev_segments, self._prev_fps = segments, out
        return out

    def _alive(self, fp: int, now: float) -> bool:
        exp = self.entries.get(fp)
        return exp is not None and exp > now

    def apply(
        self,
        segments: list[object],
        cum: list[int],
        breakpoints: list[int],
        now: float,
        ttl: str = "5m",
    ) -> CacheOutcome:
        """Account one request: what it reads, what it writes; update the cache."""
        fps = self.fingerprints(segments)
        total = cum[-1]
        r = self.rules
        if r.mode == "explicit":
            ttl_s = 3600.0 if ttl == "1h" else r.ttl_s
            read_at = -1
            for bp in breakpoints:
                for j in range(bp, max(bp - r.lookback_blocks, 0) - 1, -1):
                    if self._alive(fps[j], now):
                        read_at = max(read_at, j)
                        break
            read = cum[read_at] if read_at >= 0 else 0
            if read_at >= 0:
                self.entries[fps[read_at]] = now + ttl_s
            eligible = [bp for bp in breakpoints if cum[bp] >= r.min_tokens and bp > read_at]
            written = 0
            if eligible:
                written = cum[max(eligible)] - read
                for bp in eligible:
                    self.entries[fps[bp]] = now + ttl_s
            if ttl == "1h":
                return CacheOutcome(total, read, write_1h=written)
            return CacheOutcome(total, read, write_5m=written)

        # Automatic prefix caching: the longest live prefix, rounded down to the provider's
        # increments; then every boundary of this prompt is cached (if it is long enough).
        matched = 0
        for j in range(len(fps) - 1, -1, -1):
            if self._alive(fps[j], now):
                matched = cum[j]
                break
        read = 0
        if matched >= r.min_tokens:
            read = r.min_tokens + (matched - r.min_tokens) // r.increment * r.increment
        if total >= r.min_tokens:
            exp = now + r.ttl_s
            for fp in fps:
                self.entries[fp] = exp
        return CacheOutcome(total, read)


class AnthropicCacheCreation(Struct):
    ephemeral_5m_input_tokens: int
    ephemeral_1h_input_tokens: int


class AnthropicUsage(Struct, kw_only=True):
    """Anthropic Messages ``usage``: ``input_tokens`` is the uncached remainder."""

    input_tokens: int
    cache_creation_input_tokens: int
    cache_read_input_tokens: int
    cache_creation: AnthropicCacheCreation
    output_tokens: int
    service_tier: str | UnsetType = UNSET


class InputTokensDetails(Struct):
    cached_tokens: int


class OutputTokensDetails(Struct):
    reasoning_tokens: int


class ResponsesUsage(Struct):
    """OpenAI Responses ``usage``."""

    input_tokens: int
    input_tokens_details: InputTokensDetails
    output_tokens: int
    output_tokens_details: OutputTokensDetails
    total_tokens: int


class DeepSeekUsage(Struct):
    """DeepSeek's Chat Completions ``usage``, with its own cache fields."""

    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_cache_hit_tokens: int
    prompt_cache_miss_tokens: int
    completion_tokens_details: OutputTokensDetails


class GeminiUsage(Struct, rename="camel"):
    """Gemini ``usageMetadata``."""

    prompt_token_count: int
    cached_content_token_count: int
    candidates_token_count: int
    thoughts_token_count: int
    total_token_count: int


ProviderUsage = AnthropicUsage | ResponsesUsage | DeepSeekUsage | GeminiUsage


def anthropic_usage(
    uncached: int, write_5m: int, write_1h: int, read: int, output: int
) -> AnthropicUsage:
    return AnthropicUsage(
        input_tokens=uncached,
        cache_creation_input_tokens=write_5m + write_1h,
        cache_read_input_tokens=read,
        cache_creation=AnthropicCacheCreation(write_5m, write_1h),
        output_tokens=output,
    )


def responses_usage(total: int, read: int, output: int, reasoning: int) -> ResponsesUsage:
    return ResponsesUsage(
        total, InputTokensDetails(read), output, OutputTokensDetails(reasoning), total + output
    )


def provider_usage(shape: str, c: CacheOutcome, output: int, reasoning: int = 0) -> ProviderUsage:
    """The usage object exactly as that provider's API would report it."""
    if shape == "anthropic":
        written = c.write_5m + c.write_1h
        return anthropic_usage(c.total - c.read - written, c.write_5m, c.write_1h, c.read, output)
    if shape == "openai_responses":
        return responses_usage(c.total, c.read, output, reasoning)
    if shape == "deepseek":
        return DeepSeekUsage(
            c.total,
            output,
            c.total + output,
            c.read,
            c.total - c.read,
            OutputTokensDetails(reasoning),
        )
    return GeminiUsage(c.total, c.read, output - reasoning, reasoning, c.total + output)


#: Why a reply ended, as each usage shape's API reports it (what its adapter puts in
#: ``ModelResponse.stop_reason``): (with tool calls, text only, cut off at max_tokens).
STOP_REASONS: dict[str, tuple[str, str, str]] = {
    "anthropic": ("tool_use", "end_turn", "max_tokens"),  # Messages API stop_reason
    # Responses API: the status, or incomplete_details.reason when status is "incomplete"
    "openai_responses": ("completed", "completed", "max_output_tokens"),
    "deepseek": ("tool_calls", "stop", "length"),  # Chat Completions finish_reason
    "gemini": ("STOP", "STOP", "MAX_TOKENS"),  # generateContent finishReason
}


def served_tier(provider: str, requested: str | None) -> str:
    """The service tier the provider serves (and bills) a request at, as its response
    reports it. Anthropic's Messages API offers only fast mode beyond standard (stayer's
    adapter sends no other tier); OpenAI honours the tier asked for (``auto`` is the
    project's default); DeepSeek and Gemini, reached through OpenAI-compatible endpoints,
    are sent none."""
    if provider == "anthropic":
        return "fast" if requested == "fast" else "standard"
    if provider == "openai":
        return "default" if requested in (None, "", "auto") else requested
    return "standard"


def cut_off(message: Message, max_tokens: int, counter: MessageCounter) -> Message:
    """``message`` as generated up to ``max_tokens`` output tokens (as ``counter.message``
    counts them): the text, then each tool call in order; the one the limit falls in keeps
    its id and name with its arguments cut mid-way, and nothing after it is generated."""
    tokens = counter.counter
    left = max_tokens - counter.message(Message(message.role))  # the role line and framing

    def take(text: str, n: int) -> str:
        return tokens.decode(tokens.encode(text)[: max(n, 0)])

    content = tokens.encode(message.content)
    if len(content) >= left:
        return replace(message, content=take(message.content, left), tool_calls=())
    left -= len(content) + 1  # the newline before the calls
    calls: list[ToolCall] = []
    for call in message.tool_calls:
        size = tokens.count(f"{call.name} {call.arguments}") + 1
        if size > left:
            calls.append(
                replace(call, arguments=take(call.arguments, left - tokens.count(f"{call.name} ")))
            )
            break
        calls.append(call)
        left -= size
    return replace(message, tool_calls=tuple(calls))


_NORMALISE: dict[str, Callable[[dict[str, Any]], Usage]] = {
    "anthropic": Usage.from_anthropic,
    "openai_responses": Usage.from_openai_responses,
    "deepseek": Usage.from_deepseek,
    "gemini": Usage.from_gemini,
}


class SimPolicy(Protocol):
    """Decides what the simulated model says next, given the request it received."""

    def next_message(self, request: ModelRequest) -> Message: ...


@runtime_checkable
class ReasoningPolicy(SimPolicy, Protocol):
    """A policy that also knows how many reasoning tokens the model spent before its next
    message (a recorded trajectory does). They are billed as output, as the provider
    bills them, though no text of them is in the message."""

    def reasoning_tokens(self, request: ModelRequest) -> int: ...


class SimModel:
    def __init__(
        self,
        model_id: str,
        policy: SimPolicy,
        counter: MessageCounter,
        *,
        latency_s: float = 0.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.model_id = model_id
        self.spec = f"sim:{model_id}"
        self.provider = provider_of(model_id)
        self.rules = cache_rules(self.provider, model_id)
        self.policy = policy
        self.counter = counter
        self.latency_s = latency_s
        self.clock = clock
        self._caches: dict[str | None, ProviderCache] = {}
        self._tools_text = ToolsText()

    def account(self, request: ModelRequest) -> CacheOutcome:
        """Token counts and cache outcome of ``request`` (no latency, no reply)."""
        tools_text = self._tools_text(request.tools)
        segments: list[object] = [tools_text, request.system, *request.messages]
        cum: list[int] = []
        running = 0
        for seg in segments:
            running += (
                self.counter.text(seg) if isinstance(seg, str) else self.counter.message(seg)  # type: ignore[arg-type]
            )
            cum.append(running)
        # A breakpoint after message i ends segment i + 2; -1 marks the end of the system.
        bps = sorted({min(b + 2, len(segments) - 1) for b in request.cache_breakpoints})
        cache = self._caches.setdefault(
            request.cache_key if self.rules.mode == "automatic" else None, ProviderCache(self.rules)
        )
        now = request.now if request.now is not None else self.clock()
        return cache.apply(segments, cum, bps, now, request.cache_ttl)

    def token_ids(self, request: ModelRequest, reply: Message) -> tuple[list[int], list[int]]:
        """The token ids of ``request`` as ``account`` counts them (tool schemas, system,
        then each message) and of ``reply`` as its output is counted (reasoning, which the
        simulator does not write, has no ids)."""
        tokens = self.counter.counter
        prompt = tokens.encode(self._tools_text(request.tools)) + tokens.encode(request.system)
        for m in request.messages:
            prompt += message_ids(tokens, m)
        return prompt, message_ids(tokens, reply)

    async def complete(self, request: ModelRequest) -> ModelResponse:
        started = time.perf_counter()
        response = self.respond(request)
        if self.latency_s:
            await asyncio.sleep(self.latency_s)
        response.latency_s = time.perf_counter() - started
        return response

    def respond(self, request: ModelRequest) -> ModelResponse:
        """The reply to ``request`` without the modelled latency (for callers that serve
        it themselves, e.g. over HTTP in the provider's wire shape)."""
        started = time.perf_counter()
        outcome = self.account(request)
        reasoning = (
            self.policy.reasoning_tokens(request) if isinstance(self.policy, ReasoningPolicy) else 0
        )
        message = self.policy.next_message(request)
        # Reasoning comes first and counts towards max_tokens, as providers bill it.
        reasoning = min(reasoning, request.max_tokens)
        output = self.counter.message(message) + reasoning
        with_tools, text_only, cut = STOP_REASONS[self.rules.usage_shape]
        if output > request.max_tokens:
            message = cut_off(message, request.max_tokens - reasoning, self.counter)
            output, stop = request.max_tokens, cut
        else:
            stop = with_tools if message.tool_calls else text_only
        raw = msgspec.to_builtins(
            provider_usage(self.rules.usage_shape, outcome, output, reasoning)
        )
        return ModelResponse(
            message=message,
            usage=_NORMALISE[self.rules.usage_shape](raw),
            raw_usage=raw,
            model=self.model_id,
            latency_s=time.perf_counter() - started,
            stop_reason=stop,
            service_tier=served_tier(self.provider, request.service_tier),
        )

"""OpenAI adapters: the Responses API, and Chat Completions for OpenAI and any
OpenAI-compatible server (vLLM, Ollama, DeepSeek, ...).

OpenAI caches prefixes automatically, so ``cache_breakpoints`` are ignored here; what
matters for hits is that the prefix bytes stay identical and that ``prompt_cache_key``
(the run id) routes a run's calls to the same cache shard.

Compatible servers often reject unknown fields, so OpenAI-only parameters
(``prompt_cache_key``, ``service_tier``, ``max_completion_tokens``) are sent only to
OpenAI itself: when ``base_url`` is None or points at api.openai.com (override with
``openai_params``). Those servers get the portable ``max_tokens`` instead.
"""

from __future__ import annotations

import ipaddress
import os
import time
from typing import Any
from urllib.parse import urlsplit

import openai
from openai.types.chat import ChatCompletion
from openai.types.responses import Response

from stayer.errors import ConfigError
from stayer.messages import Message, ToolCall, ToolSpec
from stayer.models.base import ModelError, ModelRequest, ModelResponse
from stayer.models.retry import DEFAULT_RETRY, RetryPolicy, SdkErrors, call_with_retries
from stayer.models.wire import MessageJson, dumps, object_with_array, post_json
from stayer.usage import Usage

_ERRORS = SdkErrors(
    status=openai.APIStatusError,
    connection=openai.APIConnectionError,
    base=openai.OpenAIError,
)


def _is_openai(base_url: str | None) -> bool:
    return base_url is None or "api.openai.com" in base_url


def is_loopback(base_url: str) -> bool:
    """A server on this machine (llama.cpp, vLLM, Ollama run locally)."""
    host = (urlsplit(base_url).hostname or "").lower()
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def default_provider(base_url: str | None) -> str:
    """The provider a Chat Completions endpoint is priced and labelled as: DeepSeek when
    the URL names it, a server on this machine ``local`` (never OpenAI's prices), else
    OpenAI."""
    if base_url and "deepseek" in base_url.lower():
        return "deepseek"
    if base_url and is_loopback(base_url):
        return "local"
    return "openai"


def _make_client(
    base_url: str | None,
    api_key: str | None,
    client: openai.AsyncOpenAI | None,
    *,
    provider: str,
    model_id: str,
    timeout_s: float,
) -> tuple[openai.AsyncOpenAI, bool]:
    """Our client (SDK retries off) and whether we own it.

    OpenAI itself needs a key (OPENAI_API_KEY). Other servers get ``api_key``, else
    ``<PROVIDER>_API_KEY`` (e.g. DEEPSEEK_API_KEY), else the placeholder "none" that local
    servers accept; OPENAI_API_KEY is deliberately not sent to third-party URLs.
    """
    if client is not None:
        return client.with_options(max_retries=0), False
    if _is_openai(base_url):
        key = api_key or os.environ.get("OPENAI_API_KEY")
        if not key:
            raise ConfigError(
                f"no API key for openai:{model_id}: set OPENAI_API_KEY (or pass api_key)"
            )
    else:
        env = f"{provider.upper().replace('-', '_')}_API_KEY"
        key = api_key or os.environ.get(env) or "none"
    return (
        openai.AsyncOpenAI(api_key=key, base_url=base_url, max_retries=0, timeout=timeout_s),
        True,
    )


class _OpenAIBase:
    provider: str
    model_id: str
    client: openai.AsyncOpenAI
    retry: RetryPolicy
    _owns_client: bool

    async def _post(self, path: str, body: bytes, cast_to: type) -> tuple[Any, float]:
        async def attempt() -> tuple[Any, float]:
            t0 = time.perf_counter()
            resp = await post_json(self.client, path, body, cast_to, {})
            return resp, time.perf_counter() - t0

        return await call_with_retries(
            attempt, what=f"{self.provider} {self.model_id}", errors=_ERRORS, policy=self.retry
        )

    async def aclose(self) -> None:
        """Close the HTTP pool if we created it (a caller-supplied client is theirs)."""
        if self._owns_client:
            await self.client.close()


# --- Responses API ---------------------------------------------------------------------


class OpenAIResponsesModel(_OpenAIBase):
    """OpenAI's Responses API, stateless (``store=False``): we resend the history each
    turn, so the journal, not OpenAI, is the record of the conversation."""

    def __init__(
        self,
        model_id: str,
        *,
        api_key: str | None = None,
        base_url: str | None = None,
        client: openai.AsyncOpenAI | None = None,
        provider: str = "openai",
        retry: RetryPolicy = DEFAULT_RETRY,
        timeout_s: float = 600.0,
        spec: str | None = None,
    ) -> None:
        self.model_id = model_id
        self.provider = provider
        self.spec = spec or f"{provider}:{model_id}"
        self.retry = retry
        self.client, self._owns_client = _make_client(
            base_url, api_key, client, provider=provider, model_id=model_id, timeout_s=timeout_s
        )
        self._wire = MessageJson(_responses_wire)

    async def complete(self, request: ModelRequest) -> ModelResponse:
        body = build_responses_body(self.model_id, request, self._wire)
        resp, latency = await self._post("/responses", body, Response)
        return parse_responses_response(resp, latency, what=f"{self.provider} {self.model_id}")


def _responses_items(m: Message) -> list[dict[str, Any]]:
    """One history message → its Responses API input items."""
    if m.role == "tool":
        return [
            {"type": "function_call_output", "call_id": m.tool_call_id or "", "output": m.content}
        ]
    if m.role == "assistant":
        items: list[dict[str, Any]] = []
        if m.content:
            items.append({"type": "message", "role": "assistant", "content": m.content})
        for call in m.tool_calls:
            items.append(
                {
                    "type": "function_call",
                    "call_id": call.id,
                    "name": call.name,
                    "arguments": call.arguments,
                }
            )
        return items
    return [{"type": "message", "role": "user", "content": m.content}]


def _responses_wire(m: Message) -> tuple[bytes, ...]:
    return tuple(dumps(item).encode() for item in _responses_items(m))


def build_responses_params(model_id: str, request: ModelRequest) -> dict[str, Any]:
    """Keyword arguments for ``responses.create``; pure, so tests can inspect it.
    ``build_responses_body`` sends the same, encoded from per-message pieces."""
    return {
        "input": [item for m in request.messages for item in _responses_items(m)],
        **_responses_fields(model_id, request),
    }


def build_responses_body(
    model_id: str, request: ModelRequest, wire: MessageJson[tuple[bytes, ...]]
) -> bytes:
    items = [item for per_message in wire(request.messages) for item in per_message]
    return object_with_array(_responses_fields(model_id, request), "input", items)


def _responses_fields(model_id: str, request: ModelRequest) -> dict[str, Any]:
    """Everything of a Responses request but its input items."""
    params: dict[str, Any] = {
        "model": model_id,
        "max_output_tokens": request.max_tokens,
        "store": False,
    }
    if request.system:
        params["instructions"] = request.system
    if request.tools:
        # strict=False: the Responses API defaults to strict schemas, which reject ordinary
        # JSON schemas (optional properties, no additionalProperties: false).
        params["tools"] = [
            {
                "type": "function",
                "name": t.name,
                "description": t.description,
                "parameters": t.parameters,
                "strict": False,
            }
            for t in request.tools
        ]
    if request.cache_key:
        params["prompt_cache_key"] = request.cache_key
    if request.service_tier:
        params["service_tier"] = request.service_tier
    return params


def parse_responses_response(resp: Any, latency_s: float, *, what: str = "openai") -> ModelResponse:
    """Output items → one assistant Message. Reasoning items are dropped (with
    ``store=False`` they cannot be referenced later anyway); arguments stay raw text."""
    if getattr(resp, "error", None):
        raise ModelError(f"{what}: response failed: {resp.error.message}")
    texts: list[str] = []
    calls: list[ToolCall] = []
    for item in resp.output or []:
        if item.type == "message":
            for part in item.content or []:
                if part.type == "output_text":
                    texts.append(part.text)
                elif part.type == "refusal":
                    texts.append(part.refusal)
        elif item.type == "function_call":
            calls.append(ToolCall(id=item.call_id, name=item.name, arguments=item.arguments or ""))
    raw_usage = (
        resp.usage.model_dump(mode="json", exclude_unset=True) if resp.usage is not None else {}
    )
    details = getattr(resp, "incomplete_details", None)
    stop = (details.reason if details is not None else None) or resp.status or ""
    return ModelResponse(
        message=Message(role="assistant", content="".join(texts), tool_calls=tuple(calls)),
        usage=Usage.from_openai_responses(raw_usage),
        raw_usage=raw_usage,
        model=resp.model,
        latency_s=latency_s,
        stop_reason=stop,
        service_tier=resp.service_tier,
    )


# --- Chat Completions ------------------------------------------------------------------


class OpenAIChatModel(_OpenAIBase):
    """Chat Completions: OpenAI, or any compatible server given by ``base_url``.

    ``provider`` (the genai-prices id used for pricing) defaults to "local" for a server on
    this machine (a loopback ``base_url``), "deepseek" when the base_url mentions deepseek,
    else "openai"; pass it for other vendors. ``openai_params``
    forces (True) or suppresses (False) the OpenAI-only parameters; by default they are
    sent only when base_url is None or api.openai.com.
    """

    def __init__(
        self,
        model_id: str,
        *,
        base_url: str | None = None,
        api_key: str | None = None,
        client: openai.AsyncOpenAI | None = None,
        provider: str | None = None,
        openai_params: bool | None = None,
        retry: RetryPolicy = DEFAULT_RETRY,
        timeout_s: float = 600.0,
        spec: str | None = None,
    ) -> None:
        if provider is None:
            provider = default_provider(base_url)
        self.model_id = model_id
        self.provider = provider
        self.spec = spec or f"{provider}:{model_id}"
        self.retry = retry
        self.openai_params = _is_openai(base_url) if openai_params is None else openai_params
        self.client, self._owns_client = _make_client(
            base_url, api_key, client, provider=provider, model_id=model_id, timeout_s=timeout_s
        )
        self._wire = MessageJson(_chat_wire)

    async def complete(self, request: ModelRequest) -> ModelResponse:
        body = build_chat_body(self.model_id, request, self._wire, openai_params=self.openai_params)
        resp, latency = await self._post("/chat/completions", body, ChatCompletion)
        return parse_chat_response(resp, latency, what=f"{self.provider} {self.model_id}")


def _chat_tool(t: ToolSpec) -> dict[str, Any]:
    return {
        "type": "function",
        "function": {"name": t.name, "description": t.description, "parameters": t.parameters},
    }


def _chat_message(m: Message) -> dict[str, Any]:
    """One history message → its Chat Completions message."""
    if m.role == "tool":
        return {"role": "tool", "tool_call_id": m.tool_call_id or "", "content": m.content}
    if m.role == "assistant":
        msg: dict[str, Any] = {"role": "assistant", "content": m.content}
        if m.tool_calls:
            msg["content"] = m.content or None  # the spec's "no text" with tool calls
            msg["tool_calls"] = [
                {
                    "id": c.id,
                    "type": "function",
                    "function": {"name": c.name, "arguments": c.arguments},
                }
                for c in m.tool_calls
            ]
        return msg
    return {"role": "user", "content": m.content}


def _chat_wire(m: Message) -> bytes:
    return dumps(_chat_message(m)).encode()


def build_chat_params(
    model_id: str, request: ModelRequest, *, openai_params: bool
) -> dict[str, Any]:
    """Keyword arguments for ``chat.completions.create``; pure, so tests can inspect it.
    ``build_chat_body`` sends the same, encoded from per-message pieces."""
    messages = [{"role": "system", "content": request.system}] if request.system else []
    messages += [_chat_message(m) for m in request.messages]
    return {"messages": messages, **_chat_fields(model_id, request, openai_params)}


def build_chat_body(
    model_id: str, request: ModelRequest, wire: MessageJson[bytes], *, openai_params: bool
) -> bytes:
    system = (
        [dumps({"role": "system", "content": request.system}).encode()] if request.system else []
    )
    return object_with_array(
        _chat_fields(model_id, request, openai_params), "messages", system + wire(request.messages)
    )


def _chat_fields(model_id: str, request: ModelRequest, openai_params: bool) -> dict[str, Any]:
    """Everything of a Chat Completions request but its messages."""
    params: dict[str, Any] = {"model": model_id}
    if request.tools:
        params["tools"] = [_chat_tool(t) for t in request.tools]
    if openai_params:
        params["max_completion_tokens"] = request.max_tokens
        if request.cache_key:
            params["prompt_cache_key"] = request.cache_key
        if request.service_tier:
            params["service_tier"] = request.service_tier
    else:
        params["max_tokens"] = request.max_tokens
    return params


def parse_chat_response(resp: Any, latency_s: float, *, what: str = "openai") -> ModelResponse:
    """First choice → assistant Message; arguments kept as the raw string the model wrote.
    Usage keeps vendor extras (DeepSeek's prompt_cache_hit_tokens) since the SDK's models
    allow extra fields."""
    if not resp.choices:
        raise ModelError(f"{what}: response has no choices")
    choice = resp.choices[0]
    msg = choice.message
    calls = tuple(
        ToolCall(id=tc.id, name=tc.function.name, arguments=tc.function.arguments or "")
        for tc in (msg.tool_calls or [])
        if getattr(tc, "type", "function") == "function"
    )
    raw_usage = (
        resp.usage.model_dump(mode="json", exclude_unset=True) if resp.usage is not None else {}
    )
    return ModelResponse(
        message=Message(role="assistant", content=msg.content or "", tool_calls=calls),
        usage=Usage.from_openai_chat(raw_usage),
        raw_usage=raw_usage,
        model=resp.model,
        latency_s=latency_s,
        stop_reason=choice.finish_reason or "",
        service_tier=getattr(resp, "service_tier", None),
    )

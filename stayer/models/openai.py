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

import msgspec
import openai
from msgspec import UNSET, Struct, UnsetType
from openai.types.chat import ChatCompletion
from openai.types.responses import Response

from stayer.errors import ConfigError
from stayer.messages import Message, ToolCall
from stayer.models.base import ModelError, ModelRequest, ModelResponse
from stayer.models.openai_wire import ChatToolCall, chat_tool_calls
from stayer.models.retry import DEFAULT_RETRY, RetryPolicy, SdkErrors, call_with_retries
from stayer.models.wire import MessageJson, object_with_array, post_json
from stayer.usage import Usage

#: A message's wire JSON: its fields are strings, which msgspec writes as ``json.dumps``
#: does (the bytes of the cached prefix do not change).
_encode = msgspec.json.Encoder().encode
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


class FunctionCallOutput(Struct, tag="function_call_output", tag_field="type"):
    call_id: str
    output: str


class InputMessage(Struct, tag="message", tag_field="type"):
    role: str
    content: str


class FunctionCall(Struct, tag="function_call", tag_field="type"):
    call_id: str
    name: str
    arguments: str


InputItem = FunctionCallOutput | InputMessage | FunctionCall


class FunctionTool(Struct, tag="function", tag_field="type"):
    name: str
    description: str
    parameters: dict[str, Any]  # the tool's JSON schema, as its author wrote it
    strict: bool = False


class ResponsesFields(Struct, kw_only=True):
    """Everything of a Responses request but its input items, in the body's key order."""

    model: str
    max_output_tokens: int
    store: bool = False
    instructions: str | UnsetType = UNSET
    tools: list[FunctionTool] | UnsetType = UNSET
    prompt_cache_key: str | UnsetType = UNSET
    service_tier: str | UnsetType = UNSET


def _responses_items(m: Message) -> list[InputItem]:
    """One history message → its Responses API input items."""
    if m.role == "tool":
        return [FunctionCallOutput(m.tool_call_id or "", m.content)]
    if m.role == "assistant":
        items: list[InputItem] = []
        if m.content:
            items.append(InputMessage("assistant", m.content))
        items += [FunctionCall(c.id, c.name, c.arguments) for c in m.tool_calls]
        return items
    return [InputMessage("user", m.content)]


def _responses_wire(m: Message) -> tuple[bytes, ...]:
    return tuple(_encode(item) for item in _responses_items(m))


def build_responses_params(model_id: str, request: ModelRequest) -> dict[str, Any]:
    """Keyword arguments for ``responses.create``; pure, so tests can inspect it.
    ``build_responses_body`` sends the same, encoded from per-message pieces."""
    return {
        "input": msgspec.to_builtins(
            [item for m in request.messages for item in _responses_items(m)]
        ),
        **msgspec.to_builtins(_responses_fields(model_id, request)),
    }


def build_responses_body(
    model_id: str, request: ModelRequest, wire: MessageJson[tuple[bytes, ...]]
) -> bytes:
    items = [item for per_message in wire(request.messages) for item in per_message]
    return object_with_array(_responses_fields(model_id, request), "input", items)


def _responses_fields(model_id: str, request: ModelRequest) -> ResponsesFields:
    fields = ResponsesFields(model=model_id, max_output_tokens=request.max_tokens)
    if request.system:
        fields.instructions = request.system
    if request.tools:
        # strict=False: the Responses API defaults to strict schemas, which reject ordinary
        # JSON schemas (optional properties, no additionalProperties: false).
        fields.tools = [FunctionTool(t.name, t.description, t.parameters) for t in request.tools]
    if request.cache_key:
        fields.prompt_cache_key = request.cache_key
    if request.service_tier:
        fields.service_tier = request.service_tier
    return fields


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


class FunctionSpec(Struct):
    name: str
    description: str
    parameters: dict[str, Any]  # the tool's JSON schema, as its author wrote it


class ChatTool(Struct, tag="function", tag_field="type"):
    function: FunctionSpec


class SystemMessage(Struct, tag="system", tag_field="role"):
    content: str


class UserMessage(Struct, tag="user", tag_field="role"):
    content: str


class AssistantMessage(Struct, tag="assistant", tag_field="role"):
    content: str | None
    tool_calls: list[ChatToolCall] | UnsetType = UNSET


class ToolMessage(Struct, tag="tool", tag_field="role"):
    tool_call_id: str
    content: str


ChatMessage = SystemMessage | UserMessage | AssistantMessage | ToolMessage


class ChatFields(Struct, kw_only=True):
    """Everything of a Chat Completions request but its messages, in the body's key order:
    the OpenAI-only parameters, or the portable ``max_tokens``."""

    model: str
    tools: list[ChatTool] | UnsetType = UNSET
    max_completion_tokens: int | UnsetType = UNSET
    prompt_cache_key: str | UnsetType = UNSET
    service_tier: str | UnsetType = UNSET
    max_tokens: int | UnsetType = UNSET


class ChatPrompt(Struct, kw_only=True):
    """What a chat template renders: the messages (the system prompt first) and the tools."""

    messages: list[ChatMessage]
    tools: list[ChatTool] | UnsetType = UNSET


def chat_prompt(request: ModelRequest) -> ChatPrompt:
    messages = _chat_messages(request) + [_chat_message(m) for m in request.messages]
    prompt = ChatPrompt(messages=messages)
    if request.tools:
        prompt.tools = _chat_tools(request)
    return prompt


def _chat_tools(request: ModelRequest) -> list[ChatTool]:
    return [ChatTool(FunctionSpec(t.name, t.description, t.parameters)) for t in request.tools]


def _chat_message(m: Message) -> ChatMessage:
    """One history message → its Chat Completions message."""
    if m.role == "tool":
        return ToolMessage(m.tool_call_id or "", m.content)
    if m.role == "assistant":
        if not m.tool_calls:
            return AssistantMessage(m.content)
        # With calls, no text is sent as the spec's null.
        return AssistantMessage(m.content or None, chat_tool_calls(m))
    return UserMessage(m.content)


def _chat_wire(m: Message) -> bytes:
    return _encode(_chat_message(m))


def _chat_messages(request: ModelRequest) -> list[ChatMessage]:
    return [SystemMessage(request.system)] if request.system else []


def build_chat_params(
    model_id: str, request: ModelRequest, *, openai_params: bool
) -> dict[str, Any]:
    """Keyword arguments for ``chat.completions.create``; pure, so tests can inspect it.
    ``build_chat_body`` sends the same, encoded from per-message pieces."""
    return {
        "messages": msgspec.to_builtins(chat_prompt(request).messages),
        **msgspec.to_builtins(_chat_fields(model_id, request, openai_params)),
    }


def build_chat_body(
    model_id: str, request: ModelRequest, wire: MessageJson[bytes], *, openai_params: bool
) -> bytes:
    system = [_encode(m) for m in _chat_messages(request)]
    return object_with_array(
        _chat_fields(model_id, request, openai_params), "messages", system + wire(request.messages)
    )


def _chat_fields(model_id: str, request: ModelRequest, openai_params: bool) -> ChatFields:
    fields = ChatFields(model=model_id)
    if request.tools:
        fields.tools = _chat_tools(request)
    if openai_params:
        fields.max_completion_tokens = request.max_tokens
        if request.cache_key:
            fields.prompt_cache_key = request.cache_key
        if request.service_tier:
            fields.service_tier = request.service_tier
    else:
        fields.max_tokens = request.max_tokens
    return fields


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

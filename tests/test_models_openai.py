"""OpenAI Responses and Chat Completions adapters (incl. compatible servers) against a
local HTTP fake answering with the real response shapes."""

from __future__ import annotations

import json

import openai
import pytest
from histories import histories
from http_fake import (
    DEEPSEEK_CHAT_COMPLETION,
    OPENAI_CHAT_COMPLETION,
    OPENAI_RESPONSE,
    FakeServer,
    complete,
)
from hypothesis import given, settings
from hypothesis import strategies as st

from stayer.errors import ConfigError
from stayer.models.base import Message, ModelRequest, ToolCall, ToolSpec
from stayer.models.openai import (
    OpenAIChatModel,
    OpenAIResponsesModel,
    _chat_wire,
    _responses_wire,
    build_chat_body,
    build_chat_params,
    build_responses_body,
    build_responses_params,
)
from stayer.models.wire import MessageJson
from stayer.usage import Usage

TOOLS = [
    ToolSpec(
        "bash", "Run a command", {"type": "object", "properties": {"command": {"type": "string"}}}
    ),
    ToolSpec("submit", "Finish", {"type": "object", "properties": {}}),
]
HISTORY = [
    Message("user", "Fix the bug."),
    Message("assistant", "Looking.", tool_calls=(ToolCall("call_1", "bash", '{"command":"ls"}'),)),
    Message("tool", "a.py", tool_call_id="call_1"),
    Message("assistant", "", tool_calls=(ToolCall("call_2", "bash", '{"command":"cat a.py"}'),)),
    Message("tool", "boom", tool_call_id="call_2", is_error=True),
]


def _request(**kw) -> ModelRequest:
    return ModelRequest(
        system="You are careful.",
        tools=TOOLS,
        messages=HISTORY,
        max_tokens=777,
        cache_breakpoints=[-1, 2],
        cache_key="run-42",
        **kw,
    )


# --- Responses API ---------------------------------------------------------------------


def test_responses_request_and_response() -> None:
    with FakeServer() as srv:
        srv.reply(200, OPENAI_RESPONSE)
        model = OpenAIResponsesModel("gpt-5", api_key="sk-test", base_url=srv.url + "/v1")
        resp = complete(model, _request(service_tier="flex"))
        [got] = srv.requests

    assert got.path == "/v1/responses"
    assert got.headers["authorization"] == "Bearer sk-test"
    body = got.json
    assert body["model"] == "gpt-5"
    assert body["instructions"] == "You are careful."
    assert body["store"] is False
    assert body["max_output_tokens"] == 777
    assert body["prompt_cache_key"] == "run-42"
    assert body["service_tier"] == "flex"
    assert body["tools"] == [
        {
            "type": "function",
            "name": t.name,
            "description": t.description,
            "parameters": t.parameters,
            "strict": False,
        }
        for t in TOOLS
    ]
    assert body["input"] == [
        {"type": "message", "role": "user", "content": "Fix the bug."},
        {"type": "message", "role": "assistant", "content": "Looking."},
        {
            "type": "function_call",
            "call_id": "call_1",
            "name": "bash",
            "arguments": '{"command":"ls"}',
        },
        {"type": "function_call_output", "call_id": "call_1", "output": "a.py"},
        {
            "type": "function_call",
            "call_id": "call_2",
            "name": "bash",
            "arguments": '{"command":"cat a.py"}',
        },
        {"type": "function_call_output", "call_id": "call_2", "output": "boom"},
    ]
    assert "cache_control" not in got.body.decode()  # automatic caching: breakpoints ignored

    assert resp.message.content == "Running the tests."
    assert resp.message.tool_calls == (ToolCall("call_abc", "bash", '{"command": "pytest -q"'),)
    assert resp.usage == Usage(
        input_tokens=3000, cache_read_tokens=2048, output_tokens=300, reasoning_tokens=256
    )
    assert resp.raw_usage["input_tokens_details"] == {"cached_tokens": 2048}
    assert resp.model == "gpt-5-2025-08-07"
    assert resp.stop_reason == "completed"
    assert resp.service_tier == "flex"


def test_responses_incomplete_reason_is_the_stop_reason() -> None:
    reply = dict(
        OPENAI_RESPONSE,
        status="incomplete",
        incomplete_details={"reason": "max_output_tokens"},
        output=[OPENAI_RESPONSE["output"][0]],
    )
    with FakeServer() as srv:
        srv.reply(200, reply)
        model = OpenAIResponsesModel("gpt-5", api_key="sk-test", base_url=srv.url)
        resp = complete(model, ModelRequest("", [], [Message("user", "hi")]))
        body = srv.requests[0].json
    assert resp.stop_reason == "max_output_tokens"
    assert resp.message.content == "" and resp.message.tool_calls == ()
    assert "instructions" not in body and "tools" not in body and "prompt_cache_key" not in body


# --- Chat Completions ------------------------------------------------------------------


EXPECTED_CHAT_MESSAGES = [
    {"role": "system", "content": "You are careful."},
    {"role": "user", "content": "Fix the bug."},
    {
        "role": "assistant",
        "content": "Looking.",
        "tool_calls": [
            {
                "id": "call_1",
                "type": "function",
                "function": {"name": "bash", "arguments": '{"command":"ls"}'},
            }
        ],
    },
    {"role": "tool", "tool_call_id": "call_1", "content": "a.py"},
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "call_2",
                "type": "function",
                "function": {"name": "bash", "arguments": '{"command":"cat a.py"}'},
            }
        ],
    },
    {"role": "tool", "tool_call_id": "call_2", "content": "boom"},
]


def test_chat_openai_request_and_response() -> None:
    with FakeServer() as srv:
        srv.reply(200, OPENAI_CHAT_COMPLETION)
        # base_url=None means api.openai.com; the fake stands in via a supplied client.
        client = openai.AsyncOpenAI(api_key="sk-test", base_url=srv.url + "/v1")
        model = OpenAIChatModel("gpt-4.1", client=client)
        resp = complete(model, _request(service_tier="priority"), close=client)
        [got] = srv.requests

    assert model.provider == "openai" and model.spec == "openai:gpt-4.1"
    assert got.path == "/v1/chat/completions"
    body = got.json
    assert body["messages"] == EXPECTED_CHAT_MESSAGES
    assert body["tools"] == [
        {
            "type": "function",
            "function": {"name": t.name, "description": t.description, "parameters": t.parameters},
        }
        for t in TOOLS
    ]
    assert body["max_completion_tokens"] == 777 and "max_tokens" not in body
    assert body["prompt_cache_key"] == "run-42"
    assert body["service_tier"] == "priority"

    assert resp.message.content == ""
    assert resp.message.tool_calls == (
        ToolCall("call_DdmO9pD3xa9XTPNJ32zg2hcA", "bash", '{"command":"make test"}'),
        ToolCall("call_2", "submit", "{not json"),
    )
    assert resp.usage == Usage(input_tokens=2500, cache_read_tokens=2048, output_tokens=50)
    assert resp.raw_usage["prompt_tokens_details"]["cached_tokens"] == 2048
    assert resp.stop_reason == "tool_calls"
    assert resp.service_tier == "default"
    assert resp.model == "gpt-4.1-2025-04-14"


def test_chat_compatible_server_gets_only_standard_fields(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    with FakeServer() as srv:
        srv.reply(200, OPENAI_CHAT_COMPLETION)
        model = OpenAIChatModel("qwen3-coder", base_url=srv.url + "/v1")  # e.g. vLLM: no key
        complete(model, _request(service_tier="priority"))
        [got] = srv.requests
    # A server on this machine is its own provider, never priced as OpenAI.
    assert model.provider == "local" and model.spec == "local:qwen3-coder"
    assert got.headers["authorization"] == "Bearer none"
    body = got.json
    assert body["messages"] == EXPECTED_CHAT_MESSAGES
    assert body["max_tokens"] == 777
    for field in ("max_completion_tokens", "prompt_cache_key", "service_tier"):
        assert field not in body


def test_chat_deepseek_usage_and_provider(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DEEPSEEK_API_KEY", "sk-ds")
    monkeypatch.setenv("OPENAI_API_KEY", "sk-openai-must-not-leak")
    with FakeServer() as srv:
        srv.reply(200, DEEPSEEK_CHAT_COMPLETION)
        model = OpenAIChatModel("deepseek-chat", base_url=srv.url + "/deepseek/v1")
        resp = complete(model, ModelRequest("S", [], [Message("user", "go")], cache_key="r"))
        [got] = srv.requests
    assert model.provider == "deepseek" and model.spec == "deepseek:deepseek-chat"
    assert got.headers["authorization"] == "Bearer sk-ds"
    assert "prompt_cache_key" not in got.json
    assert resp.message == Message("assistant", "All tests pass.")
    assert resp.usage == Usage(input_tokens=1200, cache_read_tokens=1024, output_tokens=20)
    assert resp.raw_usage["prompt_cache_hit_tokens"] == 1024  # vendor field kept verbatim
    assert resp.stop_reason == "stop"


def test_explicit_provider_and_param_override() -> None:
    model = OpenAIChatModel(
        "m", base_url="http://localhost:1/v1", provider="together", openai_params=True
    )
    assert model.provider == "together" and model.openai_params is True
    assert model.client.max_retries == 0


def test_missing_openai_key_is_a_config_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    for cls in (OpenAIChatModel, OpenAIResponsesModel):
        with pytest.raises(ConfigError, match="set OPENAI_API_KEY") as e:
            cls("gpt-5")
        assert "\n" not in str(e.value)
    monkeypatch.setenv("OPENAI_API_KEY", "sk-env")
    assert OpenAIResponsesModel("gpt-5").client.api_key == "sk-env"


@settings(max_examples=200, deadline=None)
@given(
    history=histories(),
    more=histories(),
    system=st.sampled_from(["", "S"]),
    tools=st.sampled_from([[], [ToolSpec("bash", "Run.", {"type": "object", "properties": {}})]]),
    openai_params=st.booleans(),
    cache_key=st.sampled_from([None, "run-1"]),
    tier=st.sampled_from([None, "flex"]),
)
def test_the_bodies_sent_are_the_requests_built(
    history, more, system, tools, openai_params, cache_key, tier
) -> None:
    """Chat and Responses bodies, from per-message JSON kept between calls, say exactly
    what ``build_*_params`` describe."""
    chat, responses = MessageJson(_chat_wire), MessageJson(_responses_wire)
    first = ModelRequest(system, tools, history)
    build_chat_body("m", first, chat, openai_params=openai_params)
    build_responses_body("m", first, responses)
    req = ModelRequest(
        system, tools, history + more, max_tokens=55, cache_key=cache_key, service_tier=tier
    )
    assert json.loads(
        build_chat_body("m", req, chat, openai_params=openai_params)
    ) == build_chat_params("m", req, openai_params=openai_params)
    assert json.loads(build_responses_body("m", req, responses)) == build_responses_params("m", req)


def test_chat_provider_label_follows_the_base_url() -> None:
    from stayer.models.openai import default_provider

    assert default_provider(None) == "openai"
    assert default_provider("https://api.openai.com/v1") == "openai"
    assert default_provider("https://api.deepseek.com/v1") == "deepseek"
    for url in (
        "http://127.0.0.1:8080/v1",
        "http://localhost:8080/v1",
        "http://[::1]:9/v1",
        "http://127.3.4.5/v1",
    ):
        assert default_provider(url) == "local", url
    assert default_provider("https://llm.example.com/v1") == "openai"

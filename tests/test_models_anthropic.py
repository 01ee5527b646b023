"""AnthropicModel against a local HTTP fake speaking the Messages API's real shapes."""

from __future__ import annotations

import json

import pytest
from histories import histories
from http_fake import ANTHROPIC_MESSAGE, FakeServer, complete
from hypothesis import given, settings
from hypothesis import strategies as st

from stayer.errors import ConfigError
from stayer.models.anthropic import AnthropicModel, build_body, build_params, wire_blocks
from stayer.models.base import Message, ModelRequest, ToolCall, ToolSpec
from stayer.models.retry import RetryPolicy
from stayer.models.wire import MessageJson
from stayer.usage import Usage

EPH = {"type": "ephemeral"}


TOOLS = [
    ToolSpec(
        "bash", "Run a command", {"type": "object", "properties": {"command": {"type": "string"}}}
    ),
    ToolSpec("submit", "Finish", {"type": "object", "properties": {}}),
]

HISTORY = [
    Message("user", "Fix the bug.", kind="task"),  # 0
    Message(
        "assistant",
        "Running two things.",
        tool_calls=(
            ToolCall("toolu_1", "bash", '{"command": "ls"}'),
            ToolCall("toolu_2", "bash", '{"command": "cat x'),  # malformed: sent as {}
        ),
    ),  # 1
    Message("tool", "a.py\nb.py", tool_call_id="toolu_1"),  # 2
    Message("tool", "cat: x: No such file", tool_call_id="toolu_2", is_error=True),  # 3
    Message("user", "Note: tests are in tests/."),  # 4
    Message("assistant", "", tool_calls=(ToolCall("toolu_3", "submit", "{}"),)),  # 5
    Message("tool", "submitted", tool_call_id="toolu_3"),  # 6
]


def _model(srv: FakeServer, **kw) -> AnthropicModel:
    return AnthropicModel("claude-test-1", api_key="sk-ant-test", base_url=srv.url, **kw)


def test_request_body_and_parsed_response() -> None:
    req = ModelRequest(
        system="You are careful.",
        tools=TOOLS,
        messages=HISTORY,
        max_tokens=1000,
        cache_breakpoints=[-1, 3],
    )
    with FakeServer() as srv:
        srv.reply(200, ANTHROPIC_MESSAGE)
        resp = complete(_model(srv), req)
        [got] = srv.requests

    assert got.path == "/v1/messages"
    # This SDK generation sends the key as a bearer token; older ones used x-api-key.
    assert "sk-ant-test" in (got.headers.get("x-api-key"), got.headers.get("authorization", "")[7:])
    body = got.json
    assert body["model"] == "claude-test-1"
    assert body["max_tokens"] == 1000
    assert body["system"] == [{"type": "text", "text": "You are careful.", "cache_control": EPH}]
    # Tools in the order given, in Anthropic's shape, no breakpoint on them (system has it).
    assert body["tools"] == [
        {"name": t.name, "description": t.description, "input_schema": t.parameters} for t in TOOLS
    ]
    msgs = body["messages"]
    assert [m["role"] for m in msgs] == ["user", "assistant", "user", "assistant", "user"]
    assert msgs[0]["content"] == [{"type": "text", "text": "Fix the bug."}]
    assert msgs[1]["content"] == [
        {"type": "text", "text": "Running two things."},
        {"type": "tool_use", "id": "toolu_1", "name": "bash", "input": {"command": "ls"}},
        {"type": "tool_use", "id": "toolu_2", "name": "bash", "input": {}},
    ]
    # Consecutive tool results (and the note after them) merged into ONE user message;
    # breakpoint 3 sits on the last block of message 3, the second tool_result.
    assert msgs[2]["content"] == [
        {
            "type": "tool_result",
            "tool_use_id": "toolu_1",
            "content": "a.py\nb.py",
            "is_error": False,
        },
        {
            "type": "tool_result",
            "tool_use_id": "toolu_2",
            "content": "cat: x: No such file",
            "is_error": True,
            "cache_control": EPH,
        },
        {"type": "text", "text": "Note: tests are in tests/."},
    ]
    # An assistant turn with only a tool call has no (empty) text block.
    assert msgs[3]["content"] == [
        {"type": "tool_use", "id": "toolu_3", "name": "submit", "input": {}}
    ]
    assert "speed" not in body and "service_tier" not in body

    m = resp.message
    assert m.role == "assistant"
    assert m.content == "Let me look. Listing files."
    assert m.tool_calls == (
        ToolCall("toolu_01A09q90qw90lq917835lq9", "bash", '{"command": "ls -la", "timeout": 30}'),
    )
    assert resp.usage == Usage(
        input_tokens=12 + 5000 + 2000,
        cache_read_tokens=5000,
        cache_write_5m_tokens=1500,
        cache_write_1h_tokens=500,
        output_tokens=40,
    )
    assert resp.raw_usage["cache_creation"] == ANTHROPIC_MESSAGE["usage"]["cache_creation"]
    assert resp.raw_usage["input_tokens"] == 12
    assert resp.model == "claude-sonnet-4-5-20250929"
    assert resp.stop_reason == "tool_use"
    assert resp.service_tier == "standard"
    assert resp.latency_s >= 0


def _marked(params: dict) -> list[str]:
    """Where cache_control landed, as readable labels."""
    out = [f"system:{b['text']}" for b in params.get("system", []) if "cache_control" in b]
    out += [f"tool:{t['name']}" for t in params.get("tools", []) if "cache_control" in t]
    for i, m in enumerate(params["messages"]):
        for j, b in enumerate(m["content"]):
            if "cache_control" in b:
                out.append(f"msg{i}.{j}")
    return out


def test_breakpoints_capped_at_four_keeping_first_and_last() -> None:
    history = [Message("user" if i % 2 == 0 else "assistant", f"m{i}") for i in range(8)]
    req = ModelRequest(
        system="S", tools=TOOLS, messages=history, cache_breakpoints=[5, -1, 1, 3, 7, 6]
    )
    params = build_params("claude-x", req)
    assert _marked(params) == ["system:S", "msg5.0", "msg6.0", "msg7.0"]
    # Out-of-range indices are ignored; an index may be given twice.
    req2 = ModelRequest(system="S", tools=[], messages=history, cache_breakpoints=[2, 2, 99, -5])
    assert _marked(build_params("claude-x", req2)) == ["msg2.0"]


def test_prefix_breakpoint_without_system_goes_on_last_tool() -> None:
    req = ModelRequest(
        system="", tools=TOOLS, messages=[Message("user", "hi")], cache_breakpoints=[-1]
    )
    params = build_params("claude-x", req)
    assert "system" not in params
    assert params["tools"][-1]["cache_control"] == EPH
    assert "cache_control" not in params["tools"][0]


def test_breakpoint_on_message_without_blocks_uses_previous_block() -> None:
    history = [Message("user", "task"), Message("assistant", "   "), Message("user", "more")]
    req = ModelRequest(system="S", tools=[], messages=history, cache_breakpoints=[1])
    params = build_params("claude-x", req)
    # The blank assistant turn is dropped (the API rejects it); both user turns merge.
    assert params["messages"] == [
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "task", "cache_control": EPH},
                {"type": "text", "text": "more"},
            ],
        }
    ]


def test_fast_mode_and_service_tier() -> None:
    fast = build_params(
        "claude-opus-4-6", ModelRequest("S", [], [Message("user", "x")], service_tier="fast")
    )
    assert fast["speed"] == "fast"
    assert fast["extra_headers"] == {"anthropic-beta": "fast-mode-2026-02-01"}
    auto = build_params(
        "claude-x", ModelRequest("S", [], [Message("user", "x")], service_tier="auto")
    )
    assert auto["service_tier"] == "auto" and "speed" not in auto
    std = build_params(
        "claude-x", ModelRequest("S", [], [Message("user", "x")], service_tier="standard")
    )
    assert "service_tier" not in std and "speed" not in std

    reply = dict(ANTHROPIC_MESSAGE, usage=dict(ANTHROPIC_MESSAGE["usage"], speed="fast"))
    with FakeServer() as srv:
        srv.reply(200, reply)
        resp = complete(
            _model(srv), ModelRequest("S", [], [Message("user", "x")], service_tier="fast")
        )
        [got] = srv.requests
    assert got.json["speed"] == "fast"
    assert "fast-mode-2026-02-01" in got.headers["anthropic-beta"]
    assert resp.service_tier == "fast"


def test_missing_key_is_a_config_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    with pytest.raises(ConfigError, match="set ANTHROPIC_API_KEY") as e:
        AnthropicModel("claude-sonnet-4-5")
    assert "\n" not in str(e.value)
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-env")
    m = AnthropicModel("claude-sonnet-4-5", retry=RetryPolicy(max_attempts=1))
    assert m.spec == "anthropic:claude-sonnet-4-5" and m.provider == "anthropic"
    assert m.client.max_retries == 0


@settings(max_examples=300, deadline=None)
@given(
    history=histories(),
    more=histories(),
    system=st.sampled_from(["", "S"]),
    tools=st.sampled_from([[], TOOLS]),
    breakpoints=st.lists(st.integers(-2, 14), max_size=6),
    tier=st.sampled_from([None, "fast", "auto", "standard"]),
)
def test_the_body_sent_is_the_request_built_whatever_was_encoded_before(
    history, more, system, tools, breakpoints, tier
) -> None:
    """``build_body`` (per-message JSON, reused between calls) sends exactly what
    ``build_params`` describes, also when the same messages were encoded for an earlier
    request with other breakpoints."""
    wire = MessageJson(wire_blocks)
    build_body(
        "claude-x", ModelRequest(system, tools, history, cache_breakpoints=[len(history) - 1]), wire
    )
    req = ModelRequest(
        system,
        tools,
        history + more,
        cache_breakpoints=breakpoints,
        max_tokens=77,
        service_tier=tier,
    )
    body, headers = build_body("claude-x", req, wire)
    params = build_params("claude-x", req)
    assert headers == params.pop("extra_headers", {})
    assert json.loads(body) == params


def test_count_tokens_asks_anthropic_and_falls_back_to_none() -> None:
    import asyncio

    request = ModelRequest(
        "You are terse.",
        [ToolSpec("bash", "run", {"type": "object"})],
        [Message("user", "hi")],
        max_tokens=99,
        cache_breakpoints=[0],
    )

    async def count(srv: FakeServer) -> int | None:
        model = _model(srv)  # the SDK does not retry: one failure is one None
        try:
            return await model.count_tokens(request)
        finally:
            await model.aclose()

    with FakeServer() as srv:
        srv.reply(200, {"input_tokens": 1234})
        srv.reply(500, {"type": "error", "error": {"type": "api_error", "message": "down"}})
        assert asyncio.run(count(srv)) == 1234
        assert asyncio.run(count(srv)) is None
        first = srv.requests[0]
    assert first.path == "/v1/messages/count_tokens"
    body = first.json
    assert body["model"] == "claude-test-1" and "max_tokens" not in body
    assert body["system"][0]["text"] == "You are terse." and body["tools"][0]["name"] == "bash"

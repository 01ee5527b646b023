"""``stayer sim serve``: the simulator on the providers' wire APIs, driven by the official
``anthropic`` and ``openai`` SDKs against a server started as a user starts it. Usage is
checked against the in-process simulator on the same request (the same caching rules and
counts), and bad requests against each API's own error shapes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import httpx
import openai
import pytest
from service_helpers import listening

from stayer.metering import requests
from stayer.models.sim import SimModel
from stayer.models.sim_policies import parse_policy
from stayer.tokens import MessageCounter, TiktokenCounter, counter_for

SCRIPT = """
- tool: get_weather
  input: {city: Paris}
- [{tool: get_weather, input: {city: Rome}}, {tool: get_time, input: {zone: CET}}]
- text: It is sunny in Paris and Rome.
"""
TOOLS_A = [
    {
        "name": "get_weather",
        "description": "Weather of a city.",
        "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
    {
        "name": "get_time",
        "description": "Time in a zone.",
        "input_schema": {"type": "object", "properties": {"zone": {"type": "string"}}},
    },
]
TOOLS_O = [
    {"type": "function", "function": {"name": t["name"], "description": t["description"],
                                      "parameters": t["input_schema"]}}
    for t in TOOLS_A
]  # fmt: skip
TOOLS_R = [dict(t["function"], type="function") for t in TOOLS_O]
# A system prompt over every model's minimum cacheable length.
SYSTEM = "You are a careful assistant. " + " ".join(f"rule {i}: be exact." for i in range(700))


@pytest.fixture(scope="module")
def script(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("sim") / "turns.yaml"
    path.write_text(SCRIPT)
    return path


@pytest.fixture(scope="module")
def server(script: Path) -> Iterator[str]:
    with listening(["sim", "serve", "--port", "0", "--policy", f"script:{script}"]) as url:
        yield url


def _in_process(
    script: Path, body: dict[str, Any], parse: Any, history: list[dict[str, Any]]
) -> Any:
    """The in-process simulator's usage for the same request(s), a fresh cache."""
    sim = None
    for b in [*history, body]:
        parsed = parse(b)
        if sim is None:
            from stayer.models.caching import provider_of

            provider = provider_of(parsed.model)
            sim = SimModel(
                parsed.model,
                parse_policy(f"script:{script}", solution=None, counter=TiktokenCounter()),
                MessageCounter(counter_for(provider, parsed.model)),
            )
        out = sim.respond(parsed.request)
    return out.usage


def test_anthropic_sdk_runs_a_scripted_tool_loop_with_caching(server: str, script: Path) -> None:
    client = anthropic.Anthropic(base_url=server, api_key="sk-any", max_retries=0)
    system = [{"type": "text", "text": SYSTEM, "cache_control": {"type": "ephemeral"}}]
    messages: list[dict[str, Any]] = [{"role": "user", "content": "Weather in Paris?"}]
    first = client.messages.create(
        model="claude-sonnet-4-5", max_tokens=500, system=system, tools=TOOLS_A, messages=messages
    )
    assert first.stop_reason == "tool_use"
    (call,) = [b for b in first.content if b.type == "tool_use"]
    assert (call.name, call.input) == ("get_weather", {"city": "Paris"})
    assert (
        first.usage.cache_creation_input_tokens > 1024 and not first.usage.cache_read_input_tokens
    )
    messages += [
        {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in first.content]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call.id,
                                      "content": "18 C, sunny"}]},
    ]  # fmt: skip
    with client.messages.stream(
        model="claude-sonnet-4-5", max_tokens=500, system=system, tools=TOOLS_A, messages=messages
    ) as stream:
        second = stream.get_final_message()
    assert [b.name for b in second.content if b.type == "tool_use"] == ["get_weather", "get_time"]
    assert second.usage.cache_read_input_tokens == first.usage.cache_creation_input_tokens
    # the same counts as the in-process simulator on the same two requests
    bodies = [
        {"model": "claude-sonnet-4-5", "max_tokens": 500, "system": system, "tools": TOOLS_A,
         "messages": m}
        for m in (messages[:1], messages)
    ]  # fmt: skip
    usage = _in_process(script, bodies[1], requests.parse_anthropic, bodies[:1])
    assert second.usage.cache_read_input_tokens == usage.cache_read_tokens
    assert second.usage.input_tokens == usage.uncached_input_tokens
    assert second.usage.output_tokens == usage.output_tokens
    counted = client.messages.count_tokens(
        model="claude-sonnet-4-5", system=system, tools=TOOLS_A, messages=messages
    )
    u = second.usage
    total = u.input_tokens + u.cache_read_input_tokens + u.cache_creation_input_tokens
    assert counted.input_tokens == total


def test_anthropic_stream_events_and_cut_off(server: str) -> None:
    client = anthropic.Anthropic(base_url=server, api_key="sk-any", max_retries=0)
    kinds = []
    with client.messages.stream(
        model="claude-sonnet-4-5",
        max_tokens=3,
        tools=TOOLS_A,
        messages=[{"role": "user", "content": "Weather?"}],
    ) as stream:
        for event in stream:
            kinds.append(event.type)
        final = stream.get_final_message()
    assert kinds[0] == "message_start" and "message_stop" in kinds
    assert final.stop_reason == "max_tokens" and final.usage.output_tokens == 3


def test_openai_chat_completions_stream_and_not(server: str, script: Path) -> None:
    client = openai.OpenAI(base_url=f"{server}/v1", api_key="sk-any", max_retries=0)
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": "Weather in Paris?"},
    ]
    first = client.chat.completions.create(
        model="gpt-5", messages=messages, tools=TOOLS_O, prompt_cache_key="s1"
    )
    choice = first.choices[0]
    assert choice.finish_reason == "tool_calls"
    call = choice.message.tool_calls[0]
    assert (call.function.name, json.loads(call.function.arguments)) == (
        "get_weather",
        {"city": "Paris"},
    )
    assert first.usage.prompt_tokens_details.cached_tokens == 0
    messages += [
        choice.message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.id, "content": "18 C, sunny"},
    ]
    chunks = list(
        client.chat.completions.create(
            model="gpt-5", messages=messages, tools=TOOLS_O, prompt_cache_key="s1",
            stream=True, stream_options={"include_usage": True},
        )
    )  # fmt: skip
    usage = chunks[-1].usage
    assert usage is not None and chunks[-1].choices == []
    cached = usage.prompt_tokens_details.cached_tokens
    assert cached >= 1024 and (cached - 1024) % 128 == 0  # OpenAI's rule
    names = [
        tc.function.name
        for c in chunks
        for ch in c.choices
        for tc in ch.delta.tool_calls or []
        if tc.function and tc.function.name
    ]
    assert names == ["get_weather", "get_time"]
    bodies = [
        {"model": "gpt-5", "messages": m, "tools": TOOLS_O, "prompt_cache_key": "s1"}
        for m in (messages[:2], messages)
    ]
    expected = _in_process(script, bodies[1], requests.parse_chat, bodies[:1])
    assert (usage.prompt_tokens, cached) == (expected.input_tokens, expected.cache_read_tokens)


def test_openai_responses_stream_and_not(server: str) -> None:
    client = openai.OpenAI(base_url=f"{server}/v1", api_key="sk-any", max_retries=0)
    items: list[Any] = [{"role": "user", "content": "Weather in Paris?"}]
    first = client.responses.create(
        model="gpt-5", instructions=SYSTEM, input=items, tools=TOOLS_R, prompt_cache_key="r1"
    )
    (call,) = [o for o in first.output if o.type == "function_call"]
    assert call.name == "get_weather" and first.status == "completed"
    items += [
        call.model_dump(exclude_none=True),
        {"type": "function_call_output", "call_id": call.call_id, "output": "18 C"},
    ]
    with client.responses.stream(
        model="gpt-5", instructions=SYSTEM, input=items, tools=TOOLS_R, prompt_cache_key="r1"
    ) as stream:
        kinds = [event.type for event in stream]
        final = stream.get_final_response()
    assert kinds[0] == "response.created" and kinds[-1] == "response.completed"
    assert [o.name for o in final.output if o.type == "function_call"] == [
        "get_weather",
        "get_time",
    ]
    assert final.usage.input_tokens_details.cached_tokens >= 1024
    third = client.responses.create(
        model="gpt-5", input="Again?", tools=TOOLS_R, max_output_tokens=2, prompt_cache_key="r2"
    )
    assert third.status == "incomplete" and third.usage.output_tokens == 2


def test_errors_come_in_each_apis_own_shape(server: str) -> None:
    a = anthropic.Anthropic(base_url=server, api_key="sk-any", max_retries=0)
    with pytest.raises(anthropic.BadRequestError) as e:
        a.messages.create(model="claude-sonnet-4-5", messages=[{"role": "user", "content": "x"}],
                          max_tokens=0)  # fmt: skip
    assert "max_tokens" in str(e.value)
    with pytest.raises(anthropic.NotFoundError):
        a.messages.create(model="mystery-model-1", max_tokens=5, messages=[])
    with pytest.raises(anthropic.BadRequestError) as e:  # the script calls a tool not offered
        a.messages.create(model="claude-sonnet-4-5", max_tokens=50,
                          messages=[{"role": "user", "content": "x"}])  # fmt: skip
    assert "get_weather" in str(e.value)
    o = openai.OpenAI(base_url=f"{server}/v1", api_key="sk-any", max_retries=0)
    with pytest.raises(openai.BadRequestError) as e:
        o.chat.completions.create(model="gpt-5", messages=[{"role": "wizard", "content": "x"}])
    assert e.value.body["type"] == "invalid_request_error"  # type: ignore[index]
    raw = httpx.post(f"{server}/v1/messages", content=b'{"model": ', timeout=30)
    assert raw.status_code == 400 and raw.json()["type"] == "error"
    deep = httpx.post(f"{server}/v1/chat/completions", content=b"[" * 100_000, timeout=30)
    assert deep.status_code == 400 and "error" in deep.json()
    lost = httpx.get(f"{server}/v1/models", timeout=30)
    assert lost.status_code == 404 and lost.json()["error"]["message"]


def test_an_oversized_body_is_refused_before_it_is_read_whole() -> None:
    from starlette.testclient import TestClient

    from stayer.simserver.app import SimServer, create_app

    policy = parse_policy("echo", solution=None, counter=TiktokenCounter())
    client = TestClient(create_app(SimServer(policy, max_body=1000)))
    big = {"model": "gpt-5", "messages": [{"role": "user", "content": "x" * 5000}]}
    r = client.post("/v1/chat/completions", json=big)
    assert r.status_code == 413 and "1000 bytes" in r.json()["error"]["message"]

    def chunks() -> Iterator[bytes]:  # no content-length: counted as it comes
        yield b'{"model": "gpt-5", "messages": ['
        yield b" " * 2000
        yield b"]}"

    r = client.post("/v1/chat/completions", content=chunks())
    assert r.status_code == 413
    ok = client.post("/v1/chat/completions", json={"model": "gpt-5", "messages": []})
    assert ok.status_code == 200 and ok.json()["choices"][0]["message"]["content"] == "echo"


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ("- {text: 3}", "turn 1"),
        ("[]", "non-empty list"),
        ("- tool: x\n  input: [1]", "input must be an object"),
        ("a: [", "not YAML"),
    ],
)
def test_a_bad_script_is_one_line_naming_the_file_exit_2(
    tmp_path: Path, text: str, error: str
) -> None:
    script = tmp_path / "turns.yaml"
    script.write_text(text)
    done = subprocess.run(
        [sys.executable, "-m", "stayer.cli", "sim", "serve", "--policy", f"script:{script}"],
        capture_output=True, text=True, timeout=120, env={**os.environ, "COLUMNS": "300"},
    )  # fmt: skip
    assert done.returncode == 2
    assert str(script) in done.stderr and error in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1


def test_a_script_drives_stayer_run_in_process_too(tmp_path: Path) -> None:
    script = tmp_path / "turns.yaml"
    script.write_text(
        "- tool: bash\n"
        "  input: {command: \"printf 'Hello, world!\\\\n' > /app/hello.txt\"}\n"
        "- tool: submit\n"
        "  input: {summary: written}\n"
    )
    root = Path(__file__).resolve().parent.parent
    done = subprocess.run(
        [sys.executable, "-m", "stayer.cli", "run", str(root / "examples" / "hello-file"),
         "--model", "sim:claude-sonnet-4-5", "--sim-policy", f"script:{script}", "--json"],
        capture_output=True, text=True, timeout=300, cwd=tmp_path,
        env={**os.environ, "STAYER_HOME": str(tmp_path / "home")},
    )  # fmt: skip
    result = json.loads(done.stdout)
    assert (result["status"], result["reward"], result["steps"]) == ("succeeded", 1.0, 2)


def test_a_client_that_stalls_mid_body_holds_no_one_else_up(server: str) -> None:
    import socket

    host, port = server.removeprefix("http://").split(":")
    stalled = []
    for _ in range(8):
        s = socket.create_connection((host, int(port)))
        s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-length: 500\r\n\r\n{")
        stalled.append(s)
    try:
        ok = httpx.post(
            f"{server}/v1/chat/completions",
            json={
                "model": "gpt-5",
                "messages": [{"role": "user", "content": "x"}],
                "tools": TOOLS_O,
            },
            timeout=60,
        )
        assert ok.status_code == 200, ok.text
    finally:
        for s in stalled:
            s.close()

"""The gateway's opt-in savings, each priced on the ledger, in front of ``stayer sim serve``
(both started as a user starts them): ``--auto-cache`` against the same session without
it, ``--alias`` priced at the model called, and failover past an upstream that cannot be
reached and one that answers 529, under one budget hold."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from decimal import Decimal
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import anthropic
import httpx
import pytest
from service_helpers import start_listening as _serve

SYSTEM = "Be thrifty. " * 700  # a prefix no other test caches
TOOLS = [{"name": "look", "description": "Look.", "input_schema": {"type": "object"}}]


def _cli(env: dict[str, str], *args: str, code: int = 0) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(
        [sys.executable, "-m", "stayer.cli", *args],
        capture_output=True, text=True, env=env, timeout=120,
    )  # fmt: skip
    assert done.returncode == code, done.stderr
    return done


def _wait_steps(env: dict[str, str], session: str, n: int) -> list[dict[str, Any]]:
    deadline = time.monotonic() + 120
    while True:  # the ledger is written once the call's last byte is read: a condition
        done = subprocess.run(
            [sys.executable, "-m", "stayer.cli", "report", session, "--json"],
            capture_output=True, text=True, env=env, timeout=120,
        )  # fmt: skip
        if done.returncode == 0 and (doc := json.loads(done.stdout))["steps"] >= n:
            return list(doc["ledger"])
        assert time.monotonic() < deadline, done.stderr
        time.sleep(0.2)


class _Overloaded(BaseHTTPRequestHandler):
    hits = 0

    def do_POST(self) -> None:  # noqa: N802 - the stdlib's name
        type(self).hits += 1
        self.rfile.read(int(self.headers.get("content-length", 0)))
        body = b'{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}'
        self.send_response(529)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    home = tmp_path_factory.mktemp("home")
    e = {k: v for k, v in os.environ.items() if not k.endswith("_API_KEY") and k != "STAYER_DB"}
    e["STAYER_HOME"] = str(home)
    return e


@pytest.fixture(scope="module")
def keys(env: dict[str, str]) -> dict[str, str]:
    return {
        name: json.loads(_cli(env, "tenants", "create", name, "--max-cost", "50", "--json").stdout)[
            "api_key"
        ]
        for name in ("plain", "cache", "alias", "route", "down")
    }


@pytest.fixture(scope="module")
def upstreams() -> Iterator[dict[str, str]]:
    closed = socket.socket()  # bound, never listening: connections to it are refused
    closed.bind(("127.0.0.1", 0))
    overloaded = ThreadingHTTPServer(("127.0.0.1", 0), _Overloaded)
    threading.Thread(target=overloaded.serve_forever, daemon=True).start()
    yield {
        "closed": f"http://127.0.0.1:{closed.getsockname()[1]}",
        "overloaded": f"http://127.0.0.1:{overloaded.server_address[1]}",
    }
    overloaded.shutdown()
    closed.close()


@pytest.fixture(scope="module")
def gateways(env: dict[str, str], upstreams: dict[str, str]) -> Iterator[dict[str, str]]:
    sim, sim_url = _serve(["sim", "serve", "--port", "0"], env)
    procs, urls = [sim], {"sim": sim_url}
    flags = {
        "plain": ["--upstream", f"anthropic={sim_url}"],
        "cache": ["--upstream", f"anthropic={sim_url}", "--auto-cache"],
        "route": [
            "--upstream", f"anthropic={upstreams['closed']}",
            "--upstream", f"anthropic={upstreams['overloaded']}",
            "--failover", f"anthropic={sim_url}",
            "--alias", "claude-opus-5-5=claude-sonnet-4-5",
        ],
    }  # fmt: skip
    for name, argv in flags.items():
        proc, urls[name] = _serve(["gateway", "--port", "0", *argv], env)
        procs.append(proc)
    yield urls
    for p in procs:
        p.terminate()
        p.wait(timeout=60)


def _client(url: str, key: str, session: str) -> anthropic.Anthropic:
    return anthropic.Anthropic(
        base_url=url, api_key=key, max_retries=0, default_headers={"x-stayer-session": session}
    )


def _conversation(client: anthropic.Anthropic) -> list[Any]:
    """Three turns of one session, none marked for caching; the last one streamed."""
    messages: list[dict[str, Any]] = []
    seen = []
    for n, said in enumerate(("first question", "second question", "third question")):
        messages.append({"role": "user", "content": said})
        kw: dict[str, Any] = dict(
            model="claude-sonnet-4-5", max_tokens=100, system=SYSTEM, tools=TOOLS,
            messages=messages,
        )  # fmt: skip
        if n == 2:
            with client.messages.stream(**kw) as stream:
                reply = stream.get_final_message()
        else:
            reply = client.messages.create(**kw)
        seen.append(reply)
        messages.append({"role": "assistant", "content": reply.content[0].text})  # type: ignore[union-attr]
    return seen


def test_auto_cache_adds_breakpoints_and_prices_what_they_saved(
    gateways: dict[str, str], keys: dict[str, str], env: dict[str, str]
) -> None:
    plain = _conversation(_client(gateways["plain"], keys["plain"], "s-plain"))
    cached = _conversation(_client(gateways["cache"], keys["cache"], "s-cache"))
    assert all(r.usage.cache_read_input_tokens == 0 for r in plain)
    assert all(r.usage.cache_creation_input_tokens == 0 for r in plain)
    assert cached[0].usage.cache_creation_input_tokens > 0  # the prefix and the first turn
    assert all(r.usage.cache_read_input_tokens > 0 for r in cached[1:])  # reads only with it
    for p, c in zip(plain, cached, strict=True):  # the same prompts, cached or not
        assert p.usage.input_tokens == (
            c.usage.input_tokens + c.usage.cache_read_input_tokens
            + c.usage.cache_creation_input_tokens
        )  # fmt: skip
    without, with_ = _wait_steps(env, "s-plain", 3), _wait_steps(env, "s-cache", 3)
    assert all("auto_cache" not in e for e in without)
    saved = Decimal(0)
    for p, c in zip(without, with_, strict=True):
        mark = c["auto_cache"]
        assert mark["breakpoints"] == 2  # after tools + system, and at the last message
        # what it would have cost unmarked is what the unmarked session paid
        assert Decimal(mark["cost_without_usd"]) == Decimal(p["cost_usd"])
        assert Decimal(mark["saved_usd"]) == Decimal(p["cost_usd"]) - Decimal(c["cost_usd"])
        saved += Decimal(mark["saved_usd"])
    assert Decimal(with_[0]["auto_cache"]["saved_usd"]) < 0  # the first call only writes
    paid = [sum(Decimal(e["cost_usd"]) for e in led) for led in (without, with_)]
    assert saved == paid[0] - paid[1] > 0
    # a request that marks its own breakpoints is forwarded as it came
    client = _client(gateways["cache"], keys["cache"], "s-cache-own")
    client.messages.create(
        model="claude-sonnet-4-5", max_tokens=50, messages=[{"role": "user", "content": "hi"}],
        system=[{"type": "text", "text": "Mine. " * 800, "cache_control": {"type": "ephemeral"}}],
    )  # fmt: skip
    (own,) = _wait_steps(env, "s-cache-own", 1)
    assert "auto_cache" not in own and own["usage"]["cache_write_tokens"] > 0


def test_an_alias_calls_the_model_it_names_and_is_priced_at_it(
    gateways: dict[str, str], keys: dict[str, str], env: dict[str, str]
) -> None:
    client = _client(gateways["route"], keys["alias"], "s-alias")
    reply = client.messages.create(
        model="claude-opus-5-5", max_tokens=100, messages=[{"role": "user", "content": "hi"}]
    )
    assert reply.model == "claude-sonnet-4-5"
    (entry,) = _wait_steps(env, "s-alias", 1)
    assert entry["alias"] == {"asked": "claude-opus-5-5", "served": "claude-sonnet-4-5"}
    assert entry["model"] == "claude-sonnet-4-5"
    u = reply.usage  # at Sonnet 4.5's $3/M input, $15/M output
    expected = (Decimal(u.input_tokens) * 3 + u.output_tokens * 15) / 10**6
    assert Decimal(entry["cost_usd"]) == expected
    # a model no alias names is forwarded as asked
    plain = client.messages.create(
        model="claude-haiku-4-5", max_tokens=50, messages=[{"role": "user", "content": "x"}]
    )
    assert plain.model == "claude-haiku-4-5"
    assert "alias" not in _wait_steps(env, "s-alias", 2)[1]


def test_failover_past_a_closed_port_and_a_529_under_one_hold(
    gateways: dict[str, str],
    keys: dict[str, str],
    env: dict[str, str],
    upstreams: dict[str, str],
) -> None:
    client = _client(gateways["route"], keys["route"], "s-route")
    before = _Overloaded.hits
    kw: dict[str, Any] = dict(model="claude-sonnet-4-5", max_tokens=100)
    first = client.messages.create(messages=[{"role": "user", "content": "one"}], **kw)
    with client.messages.stream(messages=[{"role": "user", "content": "two"}], **kw) as stream:
        second = stream.get_final_message()
    assert (first.content[0].text, second.content[0].text) == ("echo: one", "echo: two")  # type: ignore[union-attr]
    assert _Overloaded.hits - before == 2  # each call tried it once, then the next
    ledger = _wait_steps(env, "s-route", 2)
    for entry in ledger:
        assert entry["upstream"] == gateways["sim"]
        assert entry["failed_attempts"] == [
            {"upstream": upstreams["closed"], "cost_usd": "0", "error": "ConnectError"},
            {"upstream": upstreams["overloaded"], "cost_usd": "0", "status": 529},
        ]
        assert Decimal(entry["cost_usd"]) > 0
    tenants = json.loads(_cli(env, "tenants", "list", "--json").stdout)["tenants"]
    (route,) = [t for t in tenants if t["tenant"] == "route"]
    assert Decimal(route["reserved_usd"]) == 0  # the one hold settled, none left behind
    assert Decimal(route["spent_usd"]) == sum(Decimal(e["cost_usd"]) for e in ledger)


def test_when_every_upstream_fails_the_last_answer_is_passed_back_and_nothing_is_held(
    env: dict[str, str], keys: dict[str, str], upstreams: dict[str, str]
) -> None:
    gw, url = _serve(
        ["gateway", "--port", "0", "--upstream", f"anthropic={upstreams['closed']}",
         "--failover", f"anthropic={upstreams['overloaded']}"], env,
    )  # fmt: skip
    try:
        r = httpx.post(
            f"{url}/v1/messages",
            json={"model": "claude-sonnet-4-5", "max_tokens": 10,
                  "messages": [{"role": "user", "content": "x"}]},
            headers={"x-api-key": keys["down"], "x-stayer-session": "s-down"}, timeout=60,
        )  # fmt: skip
        assert r.status_code == 529 and r.json()["error"]["type"] == "overloaded_error"
    finally:
        gw.terminate()
        gw.wait(timeout=60)
    tenants = json.loads(_cli(env, "tenants", "list", "--json").stdout)["tenants"]
    (down,) = [t for t in tenants if t["tenant"] == "down"]
    assert Decimal(down["reserved_usd"]) == 0 == Decimal(down["spent_usd"])


def test_savings_flags_are_checked(env: dict[str, str]) -> None:
    up = ["--upstream", "anthropic=http://127.0.0.1:1"]
    for argv, said in (
        ([*up, "--alias", "nomodel"], "--alias nomodel: expected NAME=MODEL"),
        ([*up, "--alias", "a=b", "--alias", "a=c"], "--alias a: given twice"),
        (["--upstream", "openai=http://127.0.0.1:1", "--failover", "anthropic=http://x:1"],
         "no --upstream anthropic=URL to fail over from"),
        ([*up, "--failover", "anthropic=file:///x"],
         "--failover anthropic=file:///x: expected an http(s) URL"),
    ):  # fmt: skip
        done = _cli(env, "gateway", *argv, code=2)
        assert said in done.stderr and len(done.stderr.strip().splitlines()) == 1, done.stderr


def test_breakpoints_go_after_the_prefix_and_on_the_last_markable_block() -> None:
    from stayer.metering.savings import add_cache_breakpoints, has_cache_control

    cc = {"type": "ephemeral"}
    body = {
        "model": "m", "tools": TOOLS, "system": "S",
        "messages": [
            {"role": "user", "content": "q"},
            {"role": "assistant", "content": [{"type": "text", "text": "a"},
                                              {"type": "thinking", "thinking": "t"}]},
        ],
    }  # fmt: skip
    out, n = add_cache_breakpoints(body)
    assert n == 2 and not has_cache_control(body)  # the client's body is not touched
    assert out["system"] == [{"type": "text", "text": "S", "cache_control": cc}]
    assert out["tools"] == TOOLS  # the system block after them covers them
    assert out["messages"][0] == body["messages"][0]
    assert out["messages"][1]["content"][0]["cache_control"] == cc  # not on thinking
    assert "cache_control" not in out["messages"][1]["content"][1]
    assert has_cache_control(out)
    tools_only, n = add_cache_breakpoints(
        {"tools": TOOLS, "messages": [{"role": "user", "content": ""}]}
    )
    assert n == 1 and tools_only["tools"][-1]["cache_control"] == cc  # not on an empty text
    nested = {"messages": [{"role": "user", "content": [{"type": "tool_result", "content": [
        {"type": "text", "text": "r", "cache_control": cc}]}]}]}  # fmt: skip
    assert has_cache_control(nested) and has_cache_control({"cache_control": cc, "messages": []})

"""``stayer gateway`` in front of ``stayer sim serve``, both started as a user starts them,
driven by the official SDKs: calls pass through (streamed or not), each lands priced on
its session's ledger (``stayer report SESSION``), caps hold under 100 concurrent calls,
a client that hangs up mid-stream is still priced, and the new surface is attacked."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from decimal import Decimal
from pathlib import Path
from typing import Any

import anthropic
import httpx
import openai
import pytest
from service_helpers import start_listening as _serve

SYSTEM = "Be exact. " * 700
SECRETS: dict[str, str] = {}  # the tenants' webhook secrets


def _cli(env: dict[str, str], *args: str) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "stayer.cli", *args],
        capture_output=True, text=True, env=env, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return done.stdout


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    home = tmp_path_factory.mktemp("home")
    e = {k: v for k, v in os.environ.items() if not k.endswith("_API_KEY") and k != "STAYER_DB"}
    e["STAYER_HOME"] = str(home)
    return e


@pytest.fixture(scope="module")
def keys(env: dict[str, str]) -> dict[str, str]:
    made = {}
    for name, cap in (("acme", "50"), ("other", "50"), ("poor", "0.01"), ("hooked", "50")):
        doc = json.loads(_cli(env, "tenants", "create", name, "--max-cost", cap, "--json"))
        made[name] = doc["api_key"]
        SECRETS[name] = doc["webhook_secret"]
    made["defaulted"] = json.loads(
        _cli(env, "tenants", "create", "defaulted", "--session-max-cost", "0.05", "--json")
    )["api_key"]
    return made


@pytest.fixture(scope="module")
def gateway(env: dict[str, str], keys: dict[str, str]) -> Iterator[str]:
    sim, sim_url = _serve(["sim", "serve", "--port", "0"], env)
    gw, url = _serve(
        ["gateway", "--port", "0", "--upstream", f"anthropic={sim_url}",
         "--upstream", f"openai={sim_url}", "--metrics-token", "scrape-me",
         "--allow-private-webhooks"],
        {**env, "ANTHROPIC_API_KEY": "sk-upstream-secret"},
    )  # fmt: skip
    yield url
    for p in (gw, sim):
        p.terminate()
        p.wait(timeout=60)


def _report(env: dict[str, str], session: str) -> dict[str, Any]:
    return json.loads(_cli(env, "report", session, "--json"))


def _wait_steps(env: dict[str, str], session: str, n: int) -> dict[str, Any]:
    deadline = time.monotonic() + 120
    while True:  # the ledger is written once the call's last byte is read: a condition
        done = subprocess.run(
            [sys.executable, "-m", "stayer.cli", "report", session, "--json"],
            capture_output=True, text=True, env=env, timeout=120,
        )  # fmt: skip
        if done.returncode == 0 and (doc := json.loads(done.stdout))["steps"] >= n:
            return doc
        assert time.monotonic() < deadline, done.stderr
        time.sleep(0.2)


def test_anthropic_calls_pass_through_and_land_priced_on_the_sessions_ledger(
    gateway: str, keys: dict[str, str], env: dict[str, str]
) -> None:
    client = anthropic.Anthropic(
        base_url=gateway, api_key=keys["acme"], max_retries=0,
        default_headers={"x-stayer-session": "s-anthropic"},
    )  # fmt: skip
    system = [{"type": "text", "text": SYSTEM, "cache_control": {"type": "ephemeral"}}]
    messages = [{"role": "user", "content": "hello"}]
    first = client.messages.create(
        model="claude-sonnet-4-5", max_tokens=200, system=system, messages=messages
    )
    with client.messages.stream(
        model="claude-sonnet-4-5", max_tokens=200, system=system, messages=messages
    ) as stream:
        second = stream.get_final_message()
    assert first.content[0].text == "echo: hello" == second.content[0].text
    assert second.usage.cache_read_input_tokens == first.usage.cache_creation_input_tokens > 0
    doc = _wait_steps(env, "s-anthropic", 2)
    ledger = doc["ledger"]
    for entry, seen in zip(ledger, (first, second), strict=True):
        u = seen.usage
        assert entry["usage"]["cache_read_tokens"] == u.cache_read_input_tokens
        assert entry["usage"]["output_tokens"] == u.output_tokens
        assert entry["complete"] is True
    # priced as stayer prices: $3/M input, $3.75/M 5m writes, $0.30/M reads, $15/M output
    u = first.usage
    expected = (
        Decimal(u.input_tokens) * 3 + Decimal(u.cache_creation_input_tokens) * Decimal("3.75")
        + Decimal(u.output_tokens) * 15
    ) / 1_000_000  # fmt: skip
    assert Decimal(ledger[0]["cost_usd"]) == expected
    assert Decimal(doc["totals"]["cost_usd"]) == sum(Decimal(e["cost_usd"]) for e in ledger)


def test_openai_apis_pass_through_and_are_priced(
    gateway: str, keys: dict[str, str], env: dict[str, str]
) -> None:
    client = openai.OpenAI(
        base_url=f"{gateway}/v1", api_key=keys["acme"], max_retries=0,
        default_headers={"x-stayer-session": "s-openai"},
    )  # fmt: skip
    chat = client.chat.completions.create(
        model="gpt-5", messages=[{"role": "user", "content": "hi"}]
    )
    chunks = list(
        client.chat.completions.create(
            model="gpt-5", messages=[{"role": "user", "content": "hi"}], stream=True,
            stream_options={"include_usage": True},
        )
    )  # fmt: skip
    response = client.responses.create(model="gpt-5", input="hi")
    assert chat.choices[0].message.content == "echo: hi"
    assert chunks[-1].usage is not None and response.output_text == "echo: hi"
    ledger = _wait_steps(env, "s-openai", 3)["ledger"]
    assert [e["usage"]["input_tokens"] for e in ledger] == [
        chat.usage.prompt_tokens,
        chunks[-1].usage.prompt_tokens,
        response.usage.input_tokens,
    ]
    assert all(Decimal(e["cost_usd"]) > 0 for e in ledger)


def test_a_call_over_the_budget_is_refused_in_the_providers_shape(
    gateway: str, keys: dict[str, str]
) -> None:
    client = anthropic.Anthropic(base_url=gateway, api_key=keys["poor"], max_retries=0)
    with pytest.raises(anthropic.APIStatusError) as e:
        client.messages.create(
            model="claude-sonnet-4-5", max_tokens=100_000, system=SYSTEM,
            messages=[{"role": "user", "content": "hi"}], timeout=60,
        )  # fmt: skip
    assert e.value.status_code == 402
    assert e.value.body["type"] == "error" and "worst case" in e.value.body["error"]["message"]  # type: ignore[index]
    scrape = httpx.get(
        f"{gateway}/metrics", headers={"authorization": "Bearer scrape-me"}, timeout=30
    ).text
    assert 'stayer_gateway_refused_total{reason="budget"}' in scrape
    # a call that fits gets fewer max_tokens instead
    small = client.messages.create(
        model="claude-sonnet-4-5", max_tokens=100_000, timeout=60,
        messages=[{"role": "user", "content": "hi"}],
    )  # fmt: skip
    assert small.content[0].text == "echo: hi"


def _in_session(url: str, key: str, session: str) -> anthropic.Anthropic:
    return anthropic.Anthropic(
        base_url=url, api_key=key, max_retries=0, default_headers={"x-stayer-session": session}
    )


def _capped_calls(client: anthropic.Anthropic, n: int) -> list[str]:
    """``n`` concurrent calls, each "ok" or "refused" (a 402 over a budget); some of each."""

    def call(i: int) -> str:
        try:
            client.messages.create(
                model="claude-sonnet-4-5", max_tokens=300,
                messages=[{"role": "user", "content": f"call {i} " + "word " * 400}],
            )  # fmt: skip
            return "ok"
        except anthropic.APIStatusError as e:
            assert e.status_code == 402 and "budget" in e.message, e
            return "refused"

    with ThreadPoolExecutor(32) as pool:
        outcomes = list(pool.map(call, range(n)))
    assert "ok" in outcomes and "refused" in outcomes
    return outcomes


def test_100_concurrent_calls_never_overshoot_a_session_cap(
    gateway: str, keys: dict[str, str], env: dict[str, str]
) -> None:
    cap = Decimal("0.05")
    client = anthropic.Anthropic(
        base_url=gateway, api_key=keys["acme"], max_retries=0,
        default_headers={"x-stayer-session": "s-capped", "x-stayer-max-cost": str(cap)},
    )  # fmt: skip

    outcomes = _capped_calls(client, 100)
    doc = _wait_steps(env, "s-capped", outcomes.count("ok"))
    spent = sum(Decimal(e["cost_usd"]) for e in doc["ledger"])
    assert doc["steps"] == outcomes.count("ok")
    assert spent <= cap, spent
    tenants = json.loads(_cli(env, "tenants", "list", "--json"))["tenants"]
    (acme,) = [t for t in tenants if t["tenant"] == "acme"]
    assert Decimal(acme["reserved_usd"]) == 0  # every hold settled or released
    assert Decimal(acme["spent_usd"]) >= spent


def test_a_client_that_hangs_up_mid_stream_is_still_priced(
    gateway: str, keys: dict[str, str], env: dict[str, str]
) -> None:
    body = {
        "model": "claude-sonnet-4-5", "max_tokens": 4000, "stream": True,
        "messages": [{"role": "user", "content": "x " * 3000}],
    }  # fmt: skip
    headers = {"x-api-key": keys["acme"], "x-stayer-session": "s-hangup"}
    with httpx.stream(
        "POST", f"{gateway}/v1/messages", json=body, headers=headers, timeout=60
    ) as r:
        assert r.status_code == 200
        next(r.iter_bytes())  # the first bytes, then gone
    (entry,) = _wait_steps(env, "s-hangup", 1)["ledger"]
    assert entry["complete"] is True and entry["usage"]["output_tokens"] > 1
    assert Decimal(entry["cost_usd"]) > 0


def test_keys_sessions_and_bodies_are_checked(gateway: str, keys: dict[str, str]) -> None:
    url = f"{gateway}/v1/messages"
    body = {"model": "claude-sonnet-4-5", "max_tokens": 10, "messages": []}
    assert httpx.post(url, json=body, timeout=30).status_code == 401
    bad = httpx.post(url, json=body, headers={"x-api-key": "sk-stayer-nope"}, timeout=30)
    assert bad.status_code == 401 and bad.json()["error"]["type"] == "authentication_error"
    bearer = httpx.post(
        f"{gateway}/v1/chat/completions",
        json={"model": "gpt-5", "messages": [{"role": "user", "content": "x"}]},
        headers={"authorization": f"Bearer {keys['acme']}"},
        timeout=30,
    )
    assert bearer.status_code == 200
    mine = {"x-api-key": keys["acme"], "x-stayer-session": "s-owned"}
    assert httpx.post(url, json=dict(body, messages=[{"role": "user", "content": "a"}]),
                      headers=mine, timeout=30).status_code == 200  # fmt: skip
    theirs = dict(mine, **{"x-api-key": keys["other"]})
    stolen = httpx.post(url, json=body, headers=theirs, timeout=30)
    assert stolen.status_code == 403  # another tenant cannot spend or read into it
    recapped = httpx.post(url, json=body, headers=dict(theirs, **{"x-stayer-max-cost": "0.0001"}),
                          timeout=30)  # fmt: skip
    assert recapped.status_code == 403  # nor set its cap
    for raw in (b"{", b"[1]", b"[" * 100_000):
        r = httpx.post(url, content=raw, headers={"x-api-key": keys["acme"]}, timeout=30)
        assert r.status_code == 400 and r.json()["type"] == "error"
    huge = b'{"model": "claude-sonnet-4-5", "pad": "' + b"x" * (33 << 20) + b'"}'
    r = httpx.post(url, content=huge, headers={"x-api-key": keys["acme"]}, timeout=60)
    assert r.status_code == 413 and r.json()["type"] == "error"
    for cap in ("nan", "-1", "1e100", "abc", "0", "inf", "sNaN", "", "1e999999999"):
        r = httpx.post(url, json=body, headers=dict(mine, **{"x-stayer-max-cost": cap}), timeout=30)
        assert r.status_code == 400, cap


def _refused(env: dict[str, str], *args: str) -> str:
    """``stayer ARGS`` (in-process) refused: exit 2 and a one-line error; its stderr."""
    from typer.testing import CliRunner

    from stayer.cli import app

    done = CliRunner().invoke(app, args, env={"STAYER_HOME": env["STAYER_HOME"], "STAYER_DB": None})
    assert done.exit_code == 2, (args, done.stdout, done.stderr)
    assert done.stderr.startswith("error: ") and done.stderr.count("\n") == 1, done.stderr
    return done.stderr


def test_a_tenants_gateway_settings_refuse_bad_values_and_write_nothing(
    env: dict[str, str], keys: dict[str, str]
) -> None:
    before = _cli(env, "tenants", "list", "--json")
    for flag in ("--key-max-cost", "--session-max-cost"):
        for value in ("-1", "nan", "inf", "1e100", "abc", ""):
            assert flag in _refused(env, "tenants", "budget", "acme", flag, value)
            assert flag in _refused(env, "tenants", "create", "fresh", flag, value)
    assert "--session-max-cost" in _refused(
        env, "tenants", "budget", "acme", "--session-max-cost", "0"
    )
    for url in (
        "ftp://127.0.0.1/x",
        "file:///etc/passwd",
        "javascript:alert(1)",
        "http://user:pw@127.0.0.1/",
        "http://127.0.0.1/a\r\nX-Evil: 1",
        "http://127.0.0.1/a\nb",
        "http://127.0.0.1/a b",
        "http://127.0.0.1/hook",  # private: refused without --allow-private-webhooks
        "http://169.254.169.254/latest",
    ):
        assert "webhook" in _refused(env, "tenants", "webhook", "acme", url), url
    _refused(env, "tenants", "webhook", "nosuch", "http://127.0.0.1/", "--allow-private-webhooks")
    assert _cli(env, "tenants", "list", "--json") == before


def test_tenants_create_takes_none_for_unlimited_as_tenants_budget_does(
    env: dict[str, str],
) -> None:
    """Both commands' help says of each cap "'none' for unlimited"; create took it too."""
    args = ("--max-cost", "none", "--key-max-cost", "none", "--session-max-cost", "none")
    doc = json.loads(_cli(env, "tenants", "create", "unlimited", *args, "--json"))
    caps = (doc["max_cost"], doc["key_max_cost"], doc["session_max_cost"])
    assert caps == (None, None, None)
    assert (
        json.loads(_cli(env, "tenants", "budget", "unlimited", *args, "--json"))["max_cost"] is None
    )


def test_a_key_deleted_from_the_database_is_refused_at_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A known key is cached for a while (an hour here); a lowered cap and whether the
    key is still valid count on the next call all the same (there is no revoke command
    yet: its row is deleted as a revocation would)."""
    from starlette.testclient import TestClient

    from stayer.gateway import app as gateway_app
    from stayer.guard.budget import MemoryBudgetStore
    from stayer.journal.backends import open_store
    from stayer.journal.metered import SessionLedger
    from stayer.metering.meter import Meter
    from stayer.pricing import PriceBook
    from stayer.runtime.db import ServiceDB, key_hash
    from stayer.runtime.tenants import TenantBudgets

    monkeypatch.setattr(gateway_app, "KEY_TTL_S", 3600.0)
    db = ThreadPoolExecutor(1)  # a SQLite connection is its thread's: all on this one
    store = db.submit(open_store, tmp_path, "").result()
    assert store is not None
    service = db.submit(ServiceDB, store).result()
    key = db.submit(service.create_tenant, "revoked").result()
    gw = gateway_app.Gateway(
        db=db,
        meter=Meter(PriceBook.load(), MemoryBudgetStore()),
        ledger=SessionLedger(store),
        key_info=service.gateway_key,
        upstreams={"anthropic": gateway_app.Upstream("http://127.0.0.1:1")},  # unreachable
    )
    body = {"model": "claude-sonnet-4-5", "max_tokens": 10,
            "messages": [{"role": "user", "content": "a"}]}  # fmt: skip
    with TestClient(gateway_app.create_app(gw)) as client:
        first = client.post("/v1/messages", json=body, headers={"x-api-key": key})
        assert first.status_code not in (401, 403), first.text  # known: past the key check
        digest = key_hash(key)
        TenantBudgets(gw.meter.budgets).set_key_cap("revoked", digest, Decimal(0))
        capped = client.post("/v1/messages", json=body, headers={"x-api-key": key})
        assert capped.status_code == 402  # a lowered cap counts at once
        TenantBudgets(gw.meter.budgets).set_key_cap("revoked", digest, None)
        db.submit(_delete_tenant, store, key_hash(key)).result()
        r = client.post("/v1/messages", json=body, headers={"x-api-key": key})
    assert r.status_code == 401 and r.json()["error"]["type"] == "authentication_error"


def _delete_tenant(store: Any, digest: str) -> None:
    with store._tx() as cur:
        cur.execute("DELETE FROM stayer_tenants WHERE key_hash = ?", (digest,))


class _Recorder:
    """An upstream of the test's own: records what reaches it; hangs or sends garbage."""

    def __init__(self, mode: str) -> None:
        self.mode, self.seen = mode, []  # type: ignore[var-annotated]
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(8)
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            data = conn.recv(1 << 20)
            self.seen.append(data)
            if self.mode == "garbage":
                junk = b"\x00\xffnot http at all\r\n\r\n"
                conn.sendall(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
                             b"content-length: %d\r\n\r\n%s" % (len(junk), junk))  # fmt: skip
                conn.close()
            # "hang": never answers


@pytest.mark.parametrize("mode", ["hang", "garbage"])
def test_an_upstream_that_hangs_or_sends_garbage_fails_the_call_not_the_gateway(
    mode: str, env: dict[str, str], keys: dict[str, str]
) -> None:
    upstream = _Recorder(mode)
    gw, url = _serve(
        ["gateway", "--port", "0", "--upstream", f"anthropic={upstream.url}",
         "--upstream-timeout", "2"],
        {**env, "ANTHROPIC_API_KEY": "sk-upstream-secret"},
    )  # fmt: skip
    try:
        r = httpx.post(
            f"{url}/v1/messages",
            json={"model": "claude-sonnet-4-5", "max_tokens": 10,
                  "messages": [{"role": "user", "content": "x"}]},
            headers={"x-api-key": keys["acme"], "x-stayer-session": f"s-{mode}",
                     "x-evil": "a", "anthropic-version": "2023-06-01"},
            timeout=60,
        )  # fmt: skip
        if mode == "hang":
            assert r.status_code == 502 and r.json()["type"] == "error"
        else:
            assert r.status_code == 200  # passed back as it came; priced at its worst case
        sent = upstream.seen[0].decode(errors="replace").lower()
        assert "x-api-key: sk-upstream-secret" in sent
        assert keys["acme"].lower() not in sent and "x-stayer-session" not in sent
        assert httpx.get(f"{url}/healthz", timeout=30).json() == {"status": "ok"}
    finally:
        gw.terminate()
        gw.wait(timeout=60)
        upstream.sock.close()


def test_an_upstream_is_an_http_url_without_credentials(env: dict[str, str]) -> None:
    for bad in ("anthropic=file:///etc/passwd", "anthropic=http://u:p@127.0.0.1:1",
                "mystery=http://127.0.0.1:1", "anthropic"):  # fmt: skip
        done = subprocess.run(
            [sys.executable, "-m", "stayer.cli", "gateway", "--upstream", bad],
            capture_output=True, text=True, env=env, timeout=120,
        )  # fmt: skip
        assert done.returncode == 2 and "--upstream" in done.stderr, bad


def test_a_cache_break_gets_its_reason_and_its_price(
    gateway: str, keys: dict[str, str], env: dict[str, str]
) -> None:
    client = anthropic.Anthropic(
        base_url=gateway, api_key=keys["acme"], max_retries=0,
        default_headers={"x-stayer-session": "s-break"},
    )  # fmt: skip

    def call(system: str) -> Any:
        return client.messages.create(
            model="claude-sonnet-4-5", max_tokens=100,
            system=[{"type": "text", "text": system, "cache_control": {"type": "ephemeral"}}],
            messages=[{"role": "user", "content": "hello"}],
        )  # fmt: skip

    own = "Be careful. " * 700  # a prefix no other test has cached
    first, second = call(own), call(own)
    edited = call("Be caring. " + own)  # an edit at the head of the prefix
    ledger = _wait_steps(env, "s-break", 3)["ledger"]
    assert ledger[0]["cache_break"] is None and ledger[1]["cache_break"] is None
    br = ledger[2]["cache_break"]
    assert br["reason"] == "prefix_edit" and "system prompt differs at byte 6" in br["detail"]
    missed = first.usage.cache_creation_input_tokens  # the whole prefix, written again
    assert second.usage.cache_read_input_tokens == missed
    assert edited.usage.cache_read_input_tokens == 0 and br["missed_tokens"] == missed
    # a write at $3.75/M instead of a read at $0.30/M
    assert Decimal(br["cost_usd"]) == Decimal(missed) * (Decimal("3.75") - Decimal("0.30")) / 10**6
    scrape = httpx.get(
        f"{gateway}/metrics", headers={"authorization": "Bearer scrape-me"}, timeout=30
    ).text
    line = next(
        ln for ln in scrape.splitlines()
        if ln.startswith('stayer_cache_miss_cost_usd_total{reason="prefix_edit"}')
    )  # fmt: skip
    assert float(line.split()[-1]) >= float(br["cost_usd"])
    assert httpx.get(f"{gateway}/metrics", timeout=30).status_code == 401


class _Receiver:
    """A local webhook receiver: every POST's headers and body."""

    def __init__(self) -> None:
        import http.server

        got = self.got = []  # type: list[tuple[dict[str, str], bytes]]

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - the stdlib's name
                body = self.rfile.read(int(self.headers["content-length"]))
                got.append((dict(self.headers.items()), body))
                self.send_response(204)
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


def test_a_cache_miss_sends_the_tenant_a_signed_webhook_with_its_reason_and_price(
    gateway: str, keys: dict[str, str], env: dict[str, str]
) -> None:
    from stayer.runtime.webhooks import verify

    receiver = _Receiver()
    done = json.loads(
        _cli(
            env, "tenants", "webhook", "hooked", receiver.url, "--allow-private-webhooks", "--json"
        )
    )
    assert done == {"tenant": "hooked", "webhook": receiver.url}
    client = _in_session(gateway, keys["hooked"], "s-hooked")
    own = "Be hooked. " * 700
    for system in (own, own, "Be caught. " + own):
        client.messages.create(
            model="claude-sonnet-4-5", max_tokens=100,
            system=[{"type": "text", "text": system, "cache_control": {"type": "ephemeral"}}],
            messages=[{"role": "user", "content": "hello"}],
        )  # fmt: skip
    ledger = _wait_steps(env, "s-hooked", 3)["ledger"]
    deadline = time.monotonic() + 60
    while not receiver.got:  # delivered after the ledger entry is written
        assert time.monotonic() < deadline
        time.sleep(0.1)
    receiver.server.shutdown()
    ((headers, body),) = receiver.got  # one miss, one webhook: the hits send none
    assert verify(SECRETS["hooked"], body, headers)
    doc = json.loads(body)
    br = ledger[2]["cache_break"]
    assert doc["type"] == "gateway.cache_miss" and doc["session"] == "s-hooked"
    assert doc["step"] == 3 and doc["reason"] == br["reason"] == "prefix_edit"
    assert Decimal(doc["miss_cost_usd"]) == Decimal(br["cost_usd"]) > 0
    assert doc["cache_break"] == br


def test_a_tenants_default_session_cap_holds_a_session_that_names_none(
    gateway: str, keys: dict[str, str], env: dict[str, str]
) -> None:
    client = _in_session(gateway, keys["defaulted"], "s-defaulted")
    outcomes = _capped_calls(client, 40)
    doc = _wait_steps(env, "s-defaulted", outcomes.count("ok"))
    spent = sum(Decimal(e["cost_usd"]) for e in doc["ledger"])
    assert spent <= Decimal("0.05"), spent
    (t,) = [
        t
        for t in json.loads(_cli(env, "tenants", "list", "--json"))["tenants"]
        if t["tenant"] == "defaulted"
    ]
    assert t["session_max_cost"] == "0.05" and t["max_cost"] is None  # the tenant is uncapped


def test_breakers_stop_a_session_that_loops_or_runs_past_its_steps(
    gateway: str, keys: dict[str, str], env: dict[str, str]
) -> None:
    body = {"model": "claude-sonnet-4-5", "max_tokens": 50,
            "messages": [{"role": "user", "content": "again"}]}  # fmt: skip
    loop = {"x-api-key": keys["acme"], "x-stayer-session": "s-loop"}
    codes = [httpx.post(f"{gateway}/v1/messages", json=body, headers=loop, timeout=30)
             for _ in range(5)]  # fmt: skip
    assert [r.status_code for r in codes] == [200, 200, 200, 200, 403]
    assert "breaker loop" in codes[-1].json()["error"]["message"]
    ledger = _wait_steps(env, "s-loop", 4)["ledger"]
    assert [t["reason"] for t in ledger[3]["breakers"]] == ["loop"]
    capped = {"x-api-key": keys["acme"], "x-stayer-session": "s-steps", "x-stayer-max-steps": "2"}
    got = [
        httpx.post(f"{gateway}/v1/messages", headers=capped, timeout=30,
                   json=dict(body, messages=[{"role": "user", "content": f"n{i}"}])).status_code
        for i in range(3)
    ]  # fmt: skip
    assert got == [200, 200, 403]


def _stalled_client(url: str) -> socket.socket:
    """A client that sends its headers and half a body, then nothing: it holds a connection."""
    host, port = url.removeprefix("http://").split(":")
    sock = socket.create_connection((host, int(port)))
    sock.sendall(
        b"POST /v1/messages HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
        b'content-length: 1000\r\n\r\n{"model": "claude'
    )
    return sock


def test_a_client_that_stalls_mid_body_holds_no_one_else_up(
    gateway: str, keys: dict[str, str]
) -> None:
    stalled = [_stalled_client(gateway) for _ in range(8)]
    try:
        ok = httpx.post(
            f"{gateway}/v1/messages",
            json={"model": "claude-sonnet-4-5", "max_tokens": 20,
                  "messages": [{"role": "user", "content": "still here?"}]},
            headers={"x-api-key": keys["acme"], "x-stayer-session": "s-stall"},
            timeout=60,
        )  # fmt: skip
        assert ok.status_code == 200
    finally:
        for s in stalled:
            s.close()


def test_a_session_id_that_is_no_plain_name_is_filed_under_a_digest(
    gateway: str, keys: dict[str, str], env: dict[str, str]
) -> None:
    weird = "../../etc/passwd\u202e"
    r = httpx.post(
        f"{gateway}/v1/messages",
        json={"model": "claude-sonnet-4-5", "max_tokens": 20,
              "messages": [{"role": "user", "content": "hi"}]},
        headers={"x-api-key": keys["acme"], "x-stayer-session": weird.encode()},
        timeout=60,
    )  # fmt: skip
    assert r.status_code == 200
    from stayer.journal.metered import session_id

    sid = session_id(weird.encode().decode("latin-1"))
    assert sid.startswith("gw-") and "/" not in sid
    assert _wait_steps(env, sid, 1)["steps"] == 1


def test_the_cache_miss_webhook_is_a_record_with_the_documented_fields() -> None:
    import msgspec

    from stayer.context.forensics import CacheBreak
    from stayer.gateway.app import CacheMiss
    from stayer.money import Usd
    from stayer.records import to_json

    brk = CacheBreak(position_tokens=10, reason="prefix_edit", detail="d")
    miss = CacheMiss(
        run_id="s", session="s", step=2, model="m", reason="x", miss_cost=None, cache_break=brk
    )
    doc = to_json(miss)
    assert list(doc) == [
        "type", "run_id", "session", "step", "model", "reason", "miss_cost_usd", "cache_break",
    ]  # fmt: skip
    assert doc["type"] == "gateway.cache_miss" and doc["miss_cost_usd"] is None
    assert doc["cache_break"] == {"position_tokens": 10, "reason": "prefix_edit", "detail": "d"}
    priced = to_json(msgspec.structs.replace(miss, miss_cost=Usd(Decimal("0.5"))))
    assert priced["miss_cost_usd"] == "0.5"

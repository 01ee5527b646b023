"""Two ``stayer gateway`` processes sharing one store (PostgreSQL through ``STAYER_DB``, or
SQLite in one ``STAYER_HOME``) in front of one ``stayer sim serve``: 100 concurrent calls
split across both, by the official SDKs over both wire APIs, streamed and not, never
overshoot a session's cap (``x-stayer-max-cost``), a key's nor a tenant's, in exact Decimal; no
hold is left behind, every refusal is a 402 in the provider's own error shape, and every
call that was let through is on its session's ledger."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

import anthropic
import openai
import pytest
from pg_server import database_fixture
from service_helpers import start_listening

pg_url = database_fixture()


@dataclass
class Cluster:
    env: dict[str, str]
    gateways: list[str]  # two processes, one store
    keys: dict[str, str]

    def cli(self, *args: str) -> str:
        done = subprocess.run(
            [sys.executable, "-m", "stayer.cli", *args],
            capture_output=True, text=True, env=self.env, timeout=120,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        return done.stdout

    def tenant(self, name: str) -> dict[str, Any]:
        tenants = json.loads(self.cli("tenants", "list", "--json"))["tenants"]
        (t,) = [t for t in tenants if t["tenant"] == name]
        return t  # type: ignore[no-any-return]

    def ledger(self, session: str, steps: int) -> list[dict[str, Any]]:
        deadline = time.monotonic() + 120
        while True:  # a streamed call is on the ledger once its last byte is read
            doc = json.loads(self.cli("report", session, "--json"))
            if doc["steps"] >= steps:
                assert doc["steps"] == steps, doc["steps"]
                return doc["ledger"]  # type: ignore[no-any-return]
            assert time.monotonic() < deadline, (session, doc["steps"], steps)
            time.sleep(0.2)


LOGS: list[str] = []  # what the servers wrote after their first line (a traceback, say)


def _serve(argv: list[str], env: dict[str, str]) -> tuple[subprocess.Popen[str], str]:
    return start_listening([*argv, "--port", "0"], env, sink=LOGS)


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def cluster(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Cluster]:
    env = {k: v for k, v in os.environ.items() if not k.endswith("_API_KEY") and k != "STAYER_DB"}
    env.update(STAYER_HOME=str(tmp_path_factory.mktemp("home")), COLUMNS="300")
    if request.param == "postgresql":
        env["STAYER_DB"] = request.getfixturevalue("pg_url")
    c = Cluster(env, [], {})
    for name, caps in (
        ("wide", ["--max-cost", "50"]),
        ("tight", ["--max-cost", "0.1"]),
        ("keyed", ["--max-cost", "50", "--key-max-cost", "0.1"]),
    ):
        made = json.loads(c.cli("tenants", "create", name, *caps, "--json"))
        c.keys[name] = made["api_key"]
    procs = []
    try:
        sim, sim_url = _serve(["sim", "serve"], env)
        procs.append(sim)
        for _ in range(2):
            gw, url = _serve(
                ["gateway", "--upstream", f"anthropic={sim_url}", "--upstream", f"openai={sim_url}"],
                env,
            )  # fmt: skip
            procs.append(gw)
            c.gateways.append(url)
        yield c
    finally:
        for p in reversed(procs):
            p.terminate()
            p.wait(timeout=60)


def _caller(c: Cluster, key: str, session: Callable[[int], dict[str, str]]) -> Callable[[int], str]:
    """Call ``i`` goes to gateway ``i % 2``, in turn over the Anthropic Messages API (every
    other one streamed) and OpenAI Chat Completions; returns "ok" or "refused" (a 402 in
    the API's own error shape). Anything else fails the test."""
    anthropics = [anthropic.Anthropic(base_url=u, api_key=key, max_retries=0) for u in c.gateways]
    openais = [openai.OpenAI(base_url=f"{u}/v1", api_key=key, max_retries=0) for u in c.gateways]

    def call(i: int) -> str:
        prompt = [{"role": "user", "content": f"call {i} " + "word " * 400}]
        headers = session(i)
        try:
            if i % 4 in (0, 1):
                client = anthropics[i % 2]
                kw: dict[str, Any] = dict(
                    model="claude-sonnet-4-5", max_tokens=300, messages=prompt,
                    extra_headers=headers, timeout=120,
                )  # fmt: skip
                if i % 4 == 0:
                    with client.messages.stream(**kw) as stream:
                        stream.get_final_message()
                else:
                    client.messages.create(**kw)
            else:
                openais[i % 2].chat.completions.create(
                    model="gpt-5", max_completion_tokens=300, messages=prompt,  # type: ignore[arg-type]
                    extra_headers=headers, timeout=120,
                )  # fmt: skip
            return "ok"
        except anthropic.APIStatusError as e:
            assert e.status_code == 402, (e.status_code, e.body, "".join(LOGS)[-3000:])
            body = e.response.json()
            assert body["type"] == "error" and body["error"]["type"] == "invalid_request_error"
            assert "budget" in body["error"]["message"]
            return "refused"
        except openai.APIStatusError as e:
            assert e.status_code == 402, (e.status_code, e.body, "".join(LOGS)[-3000:])
            error = e.response.json()["error"]
            assert set(error) == {"message", "type", "param", "code"}
            assert error["type"] == "invalid_request_error" and "budget" in error["message"]
            return "refused"

    return call


def _run(call: Callable[[int], str]) -> list[str]:
    with ThreadPoolExecutor(32) as pool:
        outcomes = list(pool.map(call, range(100)))
    assert "ok" in outcomes and "refused" in outcomes, outcomes
    return outcomes


def test_two_gateways_never_overshoot_a_session_cap(cluster: Cluster) -> None:
    cap = Decimal("0.1")
    session = {"x-stayer-session": "shared-capped", "x-stayer-max-cost": str(cap)}
    outcomes = _run(_caller(cluster, cluster.keys["wide"], lambda i: session))
    ledger = cluster.ledger("shared-capped", outcomes.count("ok"))
    spent = sum(Decimal(e["cost_usd"]) for e in ledger)
    assert spent <= cap, spent
    assert all(e["complete"] for e in ledger)
    assert Decimal(cluster.tenant("wide")["reserved_usd"]) == 0  # every hold settled


def test_two_gateways_never_overshoot_a_key_cap(cluster: Cluster) -> None:
    """100 calls over 100 sessions of one key, whose tenant has room: the key's cap binds."""
    keyed = cluster.tenant("keyed")
    cap = Decimal(keyed["key_max_cost"])
    assert cap == Decimal("0.1") and Decimal(keyed["max_cost"]) == 50
    outcomes = _run(
        _caller(cluster, cluster.keys["keyed"], lambda i: {"x-stayer-session": f"keyed-{i}"})
    )
    with ThreadPoolExecutor(8) as pool:
        ledgers = list(pool.map(lambda i: cluster.ledger(f"keyed-{i}", 1),
                                [i for i, o in enumerate(outcomes) if o == "ok"]))  # fmt: skip
    spent = sum(Decimal(e["cost_usd"]) for ledger in ledgers for e in ledger)
    assert spent <= cap, spent
    keyed = cluster.tenant("keyed")
    assert Decimal(keyed["key_reserved_usd"]) == 0 and Decimal(keyed["reserved_usd"]) == 0
    assert Decimal(keyed["key_spent_usd"]) == spent == Decimal(keyed["spent_usd"])


def test_two_gateways_never_overshoot_a_tenant_cap(cluster: Cluster) -> None:
    """Calls 2k and 2k+1 open session ``tight-k`` on both gateways at once: 50 sessions, each
    created by two processes racing, all spending one tenant's cap."""
    cap = Decimal(cluster.tenant("tight")["max_cost"])
    outcomes = _run(
        _caller(cluster, cluster.keys["tight"], lambda i: {"x-stayer-session": f"tight-{i // 2}"})
    )
    listed = json.loads(cluster.cli("runs", "--limit", "1000", "--json"))["runs"]
    ids = sorted(r["id"] for r in listed if r["id"].startswith("tight-"))
    assert ids == sorted(f"tight-{k}" for k in range(50))  # every session, each one row
    made = {k: outcomes[2 * k : 2 * k + 2].count("ok") for k in range(50)}
    with ThreadPoolExecutor(8) as pool:
        ledgers = list(pool.map(lambda k: cluster.ledger(f"tight-{k}", made[k]),
                                [k for k, n in made.items() if n]))  # fmt: skip
    spent = sum(Decimal(e["cost_usd"]) for ledger in ledgers for e in ledger)
    assert spent <= cap, spent
    tight = cluster.tenant("tight")
    assert Decimal(tight["reserved_usd"]) == 0
    assert Decimal(tight["spent_usd"]) == spent  # the budget and the ledgers agree exactly

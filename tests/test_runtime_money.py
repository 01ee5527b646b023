"""The hosted runtime's money: holds settled on every path, budget admission, what an
unfinished run is shown to have spent, and retried requests (on SQLite and PostgreSQL)."""

from __future__ import annotations

import json
import signal
import threading
import time
import uuid
from decimal import Decimal
from pathlib import Path

import httpx
import pytest
from pg_server import _fresh_database as fresh_database
from pg_server import database_fixture
from service_helpers import HANG_S, Env, copy_tasks, finished, spawn, start_server, wait_for

from stayer.journal import open_store

pg_url = database_fixture()

SIM = "sim:claude-sonnet-4-5"
BACKENDS = ["sqlite", pytest.param("postgres", marks=pytest.mark.slow)]
TOKEN = "metrics-" + uuid.uuid4().hex


@pytest.fixture(scope="module", params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> str:
    return "" if request.param == "sqlite" else request.getfixturevalue("pg_url")


@pytest.fixture(scope="module")
def tasks(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return copy_tasks(tmp_path_factory.mktemp("tasks"), "hello-file")


@pytest.fixture
def env(backend: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Env:
    """A home (and database) of the test's own; its processes have no provider keys."""
    for var in ("ANTHROPIC_API_KEY", "OPENAI_API_KEY"):
        monkeypatch.delenv(var, raising=False)
    return Env(tmp_path / "home", fresh_database(backend) if backend else "")


def name() -> str:
    return "t" + uuid.uuid4().hex[:10]


def account(env: Env, tenant: str) -> dict:
    tenants = json.loads(env.cli("tenants", "list", "--json").stdout)["tenants"]
    return next(t for t in tenants if t["tenant"] == tenant)


def ledger_total(ledger: list[dict]) -> Decimal:
    return sum((Decimal(e["cost_usd"]) for e in ledger), Decimal(0))


def test_no_hold_is_left_by_a_run_that_could_not_start(env: Env, tasks: Path) -> None:
    server = start_server(env, tasks, "--workers", "1")
    tenant = name()
    key = env.tenant(tenant, "--max-cost", "5")["api_key"]
    try:
        with server.client(key) as c:
            # What `stayer run` refuses before it starts, the API refuses at once, naming
            # the field: a model no price data knows, an unpriced one under a cap.
            refused = [
                ({"model": "sim:gpt-55"}, "model: sim:gpt-55"),
                ({"model": "sim:claude-sonet-4-5"}, "model: sim:claude-sonet-4-5"),
                ({"model": "nope:x"}, "model: nope:x"),
                (
                    {"model": "openai-chat:no-such-model-priced", "max_cost": "1"},
                    "model: openai-chat:no-such-model-priced",
                ),
                (
                    {
                        "model": SIM,
                        "team": {"entry": "a", "agents": {"a": {"model": "sim:gpt-55"}}},
                    },
                    "team.agents.a.model: sim:gpt-55",
                ),
            ]
            refused += [
                ({"model": SIM, "policy": "nope"}, "policy: nope: unknown policy"),
                ({"model": SIM, "sim_policy": "bogus"}, "sim_policy: bogus: unknown policy"),
                (
                    {"model": "anthropic:claude-sonnet-4-5", "sim_policy": "synthetic:steps=2"},
                    "sim_policy: only meaningful for sim: models",
                ),
            ]
            for body, said in refused:
                r = c.post("/v1/runs", json={"task": "hello-file", **body})
                assert r.status_code == 422, r.text
                assert r.json()["detail"].startswith(said), r.text
            assert c.get("/v1/runs").json()["data"] == []
            # A priced model whose provider the worker cannot reach (no API key): the run
            # is held for, fails to start, and gives its hold back.
            ids = [
                c.post(
                    "/v1/runs",
                    json={"task": "hello-file", "model": "anthropic:claude-sonnet-4-5"},
                ).json()["id"]
                for _ in range(2)
            ]
            for run_id in ids:
                run = wait_for(c, run_id, finished)
                assert run["status"] == "error" and "ANTHROPIC_API_KEY" in run["error"], run
                assert run["steps"] == 0 and run["cost_usd"] == "0"
        budget = account(env, tenant)
        assert Decimal(budget["reserved_usd"]) == 0 and Decimal(budget["spent_usd"]) == 0, budget
    finally:
        server.process.kill()


def test_a_hold_left_open_by_a_process_that_died_is_settled(env: Env, tasks: Path) -> None:
    from stayer.runtime.db import ServiceDB
    from stayer.runtime.tenants import TenantBudgets, open_budget_store

    tenant = name()
    env.tenant(tenant, "--max-cost", "5")
    store = open_store(env.home, env.db_url or None)
    budgets = TenantBudgets(open_budget_store(env.home, env.db_url or None))
    try:
        db = ServiceDB(store)
        db.insert_run("r-" + tenant, tenant, "hello-file", SIM, {})
        # What a process that ended a run (error, or a cancel) and died before settling
        # its hold leaves behind.
        hold = budgets.hold(tenant, Decimal(1))
        db.record_result("r-" + tenant, status="error", budget_hold=hold, held="1", run_cap="1")
        assert budgets.account(tenant).reserved == 1
        server = start_server(env, tasks, "--workers", "1")
        try:
            deadline = time.monotonic() + HANG_S
            while budgets.account(tenant).reserved != 0:
                assert time.monotonic() < deadline, server.process.output()
                time.sleep(0.05)
        finally:
            server.process.kill()
        assert budgets.account(tenant).spent == 0  # the run never started: it spent nothing
        run = db.run("r-" + tenant)
        assert run is not None and run.budget_hold is None
    finally:
        store.close()
        budgets.store.close_connection()  # type: ignore[attr-defined]


def test_runs_without_a_cap_get_what_their_tenant_can_afford(env: Env, tasks: Path) -> None:
    server = start_server(env, tasks, "--workers", "2")  # --default-max-cost: $1
    tenant = name()
    key = env.tenant(tenant, "--max-cost", "0.5")["api_key"]
    broke = env.tenant(name(), "--max-cost", "0")["api_key"]
    try:
        with server.client(key) as c:
            ids = [c.post("/v1/runs", json={"task": "hello-file", "model": SIM}) for _ in range(3)]
            assert [r.status_code for r in ids] == [201] * 3
            runs = [wait_for(c, r.json()["id"], finished) for r in ids]
            assert [r["status"] for r in runs] == ["succeeded"] * 3, runs
        budget = account(env, tenant)
        assert Decimal(budget["reserved_usd"]) == 0
        assert Decimal(budget["spent_usd"]) == sum(Decimal(r["cost_usd"]) for r in runs)
        with server.client(broke) as c:
            r = c.post("/v1/runs", json={"task": "hello-file", "model": SIM})
            assert r.status_code == 422 and r.json()["detail"].startswith("max_cost:"), r.text
            assert c.get("/v1/runs").json()["data"] == []
    finally:
        server.process.kill()


def _decide_all(c: httpx.Client, run_id: str) -> dict:
    while True:
        run = wait_for(c, run_id, lambda r: r["status"] == "requires_action" or finished(r))
        if finished(run):
            return run
        call = run["pending_action"]["call_id"]
        r = c.post(f"/v1/runs/{run_id}/actions", json={"call_id": call, "decision": "approve"})
        assert r.status_code == 200, r.text


def test_runs_waiting_on_their_tenants_budget_start_as_holds_are_settled(
    env: Env, tasks: Path
) -> None:
    server = start_server(env, tasks, "--workers", "2")
    tenant = name()
    key = env.tenant(tenant, "--max-cost", "0.5")["api_key"]
    try:
        with server.client(key) as c:
            body = {"task": "hello-file", "model": SIM, "max_cost": "0.3"}
            # The first holds $0.30 while a person decides on its calls; the second does
            # not fit beside it and waits on the tenant's budget.
            first = c.post("/v1/runs", json={**body, "confirm_tools": ["bash"]}).json()["id"]
            wait_for(c, first, lambda r: r["status"] == "requires_action")
            second = c.post("/v1/runs", json=body).json()["id"]
            waiting = wait_for(c, second, lambda r: r["status"] == "paused")
            assert waiting["stop_reason"] == "budget_reached"
            # The first ends and settles at what it spent: the second starts, unraised.
            assert _decide_all(c, first)["status"] == "succeeded"
            assert wait_for(c, second, finished)["status"] == "succeeded"
            # A run paused at its own cap holds what it spent, not its whole cap.
            capped = {
                "task": "hello-file",
                "model": SIM,
                "max_cost": "0.02",
                "max_steps": 40,
                "sim_policy": "synthetic:steps=30,obs_tokens=400,out_tokens=30",
            }
            third = c.post("/v1/runs", json=capped).json()["id"]
            paused = wait_for(c, third, lambda r: r["status"] == "paused" or finished(r))
            assert paused["status"] == "paused", paused
        budget = account(env, tenant)
        assert Decimal(budget["reserved_usd"]) == Decimal(paused["cost_usd"]) < Decimal("0.02")
        # Cancelled while it waits: what it holds is settled, nothing is left held.
        with server.client(key) as c:
            assert c.post(f"/v1/runs/{third}/cancel").json()["status"] == "cancelled"
        budget = account(env, tenant)
        assert Decimal(budget["reserved_usd"]) == 0
        runs = [first, second, third]
        with server.client(key) as c:
            spent = sum(Decimal(c.get(f"/v1/runs/{r}").json()["cost_usd"]) for r in runs)
        assert Decimal(budget["spent_usd"]) == spent
    finally:
        server.process.kill()


def _in_flight(store, run_id: str) -> bool:  # noqa: ANN001 - a journal Store
    """Whether the run's journal holds a model call started and not (yet) answered."""
    kinds = [e.kind for e in store.events(run_id)]
    return kinds.count("model_started") > kinds.count("model_finished") + kinds.count(
        "model_failed"
    )


def _metric_cost(server, tenant: str) -> Decimal:  # noqa: ANN001
    from prometheus_client.parser import text_string_to_metric_families

    r = httpx.get(server.url + "/metrics", headers={"Authorization": f"Bearer {TOKEN}"})
    assert r.status_code == 200, r.text
    return sum(
        (
            Decimal(str(s.value))
            for f in text_string_to_metric_families(r.text)
            for s in f.samples
            if s.name == "stayer_cost_usd_total" and s.labels["tenant"] == tenant
        ),
        Decimal(0),
    )


def test_a_call_lost_in_flight_counts_while_the_run_is_unfinished(
    env: Env, tasks: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    api = start_server(env, tasks, "--workers", "0", "--metrics-token", TOKEN)
    tenant = name()
    key = env.tenant(tenant)["api_key"]
    worker_args = ["worker", "--tasks-dir", str(tasks), "--concurrency", "1", "--lease-ttl", "2"]
    monkeypatch.setenv("STAYER_HOME", str(env.home))
    if env.db_url:
        monkeypatch.setenv("STAYER_DB", env.db_url)
    else:
        monkeypatch.delenv("STAYER_DB", raising=False)
    store = open_store(env.home)
    body = {
        "task": "hello-file",
        "model": SIM,
        "sim_policy": "synthetic:steps=60,obs_tokens=400,out_tokens=30",
        "max_steps": 80,
        "sim_latency": 0.5,  # a call is in flight most of the time
        "max_cost": "0.05",  # it pauses at its cap, unfinished
    }
    try:
        with api.client(key) as c:
            victim = spawn(env, worker_args, env.home.parent / "w1.log")
            run_id = c.post("/v1/runs", json=body).json()["id"]
            wait_for(c, run_id, lambda r: r["steps"] >= 2)
            deadline = time.monotonic() + HANG_S
            while not _in_flight(store, run_id):
                assert time.monotonic() < deadline, victim.output()
                time.sleep(0.01)
            victim.kill(signal.SIGKILL)  # with a model call in flight: billed, never seen
            rescuer = spawn(env, worker_args, env.home.parent / "w2.log")
            try:
                run = wait_for(c, run_id, lambda r: r["status"] == "paused" or finished(r))
            finally:
                rescuer.kill()
            assert run["status"] == "paused", rescuer.output()
            ledger = c.get(f"/v1/runs/{run_id}/ledger").json()["ledger"]
            lost = [e for e in ledger if e.get("kind") == "lost_in_flight"]
            assert len(lost) == 1, ledger
            journal = store.run(run_id)
            assert journal is not None
            held = Decimal(journal.cost_usd)  # what the journal holds: the lost call too
            assert ledger_total(ledger) == held
            shown = c.get(f"/v1/runs/{run_id}").json()
            assert Decimal(shown["cost_usd"]) == held
            for kind in ("input_tokens", "output_tokens"):  # its tokens too
                assert shown["usage"][kind] == sum(e["usage"][kind] for e in ledger)
            assert Decimal(c.get("/v1/runs").json()["data"][0]["cost_usd"]) == held
            assert abs(_metric_cost(api, tenant) - held) < Decimal("1e-9")
    finally:
        store.close()
        api.process.kill()


def test_a_retried_request_with_its_idempotency_key_makes_one_run(env: Env, tasks: Path) -> None:
    api = start_server(env, tasks, "--workers", "0")  # the runs stay queued
    tenant = name()
    key, other = env.tenant(tenant, "--max-cost", "5")["api_key"], env.tenant(name())["api_key"]
    body = {"task": "hello-file", "model": SIM, "metadata": {"try": "1"}}
    try:
        with api.client(key) as c:
            first = c.post("/v1/runs", json=body, headers={"Idempotency-Key": "k-1"})
            assert first.status_code == 201, first.text
            again = c.post("/v1/runs", json=body, headers={"Idempotency-Key": "k-1"})
            assert again.status_code == 200 and again.json()["id"] == first.json()["id"]
            # The same body, written differently, is the same request.
            same = c.post(
                "/v1/runs",
                content=json.dumps({"model": SIM, "metadata": {"try": "1"}, "task": "hello-file"}),
                headers={"Idempotency-Key": "k-1", "Content-Type": "application/json"},
            )
            assert same.status_code == 200 and same.json()["id"] == first.json()["id"]
            clash = c.post(
                "/v1/runs", json={**body, "max_steps": 3}, headers={"Idempotency-Key": "k-1"}
            )
            assert clash.status_code == 422 and "Idempotency-Key" in clash.json()["detail"]
            assert first.json()["id"] in clash.json()["detail"]
            assert c.post("/v1/runs", json=body, headers={"Idempotency-Key": ""}).status_code == 422
            # Concurrent duplicates: one run.
            answers: list[httpx.Response] = []

            def post() -> None:
                with api.client(key) as mine:
                    answers.append(
                        mine.post("/v1/runs", json=body, headers={"Idempotency-Key": "k-2"})
                    )

            threads = [threading.Thread(target=post) for _ in range(8)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            assert sorted(r.status_code for r in answers) == [200] * 7 + [201], answers
            assert len({r.json()["id"] for r in answers}) == 1
            runs = c.get("/v1/runs").json()["data"]
            assert len(runs) == 2  # k-1's and k-2's
            # A retry gets its run even where a new request would now be refused.
            env.cli("tenants", "budget", tenant, "--max-cost", "0")
            assert c.post("/v1/runs", json=body).status_code == 422
            late = c.post("/v1/runs", json=body, headers={"Idempotency-Key": "k-1"})
            assert late.status_code == 200 and late.json()["id"] == first.json()["id"]
        with api.client(other) as c:  # keys are the tenant's own
            mine = c.post("/v1/runs", json=body, headers={"Idempotency-Key": "k-1"})
            assert mine.status_code == 201 and mine.json()["id"] != first.json()["id"]
    finally:
        api.process.kill()

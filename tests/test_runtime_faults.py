"""The hosted runtime under faults, on PostgreSQL: a worker stalled past its lease, the
database restarting, bursts of clients, workers started together on an empty database, a
worker told to stop (SIGTERM) while its runs are mid-step.

Live ``stayer serve`` / ``stayer worker`` processes (``service_helpers``); every wait is on
a condition, bounded only to turn a hang into a failure.
"""

from __future__ import annotations

import json
import shutil
import signal
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import httpx
import pytest
from pg_server import _fresh_database as fresh_database
from pg_server import database_fixture
from pg_server import start as start_pg
from pg_server import stop as stop_pg
from service_helpers import (
    HANG_S,
    Env,
    Process,
    copy_tasks,
    finished,
    free_port,
    spawn,
    start_server,
    wait_for,
)

pg_url = database_fixture()
pytestmark = pytest.mark.slow

SIM = "sim:claude-sonnet-4-5"


def name() -> str:
    return "t" + uuid.uuid4().hex[:10]


def until(
    what: str, done: Callable[[], Any], *, give_up: Callable[[], str | None] = lambda: None
) -> Any:
    """Poll ``done()`` until it is truthy (its value); ``give_up()`` names a reason to stop."""
    deadline = time.monotonic() + HANG_S
    while True:
        value = done()
        if value:
            return value
        reason = give_up()
        if reason:
            raise AssertionError(f"{what}: {reason}")
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {HANG_S} s")
        time.sleep(0.05)


def rows(url: str, sql: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    import psycopg

    with psycopg.connect(url, autocommit=True, connect_timeout=10) as conn:
        return list(conn.execute(sql, params).fetchall())


def held(env: Env, tenant: str) -> Decimal:
    doc = json.loads(env.cli("tenants", "list", "--json").stdout)
    (row,) = [t for t in doc["tenants"] if t["tenant"] == tenant]
    return Decimal(row["reserved_usd"])


def worker_args(tasks: Path, *extra: str) -> list[str]:
    return ["worker", "--tasks-dir", str(tasks), *extra]


@pytest.fixture(scope="module")
def tasks(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return copy_tasks(tmp_path_factory.mktemp("tasks"), "hello-file")


@pytest.fixture
def env(pg_url: str, tmp_path: Path) -> Env:
    return Env(tmp_path / "home", fresh_database(pg_url))


@pytest.fixture
def own_pg() -> Iterator[tuple[Path, str]]:
    """A PostgreSQL server of the test's own (to restart): its directory and URL."""
    base = Path(tempfile.mkdtemp(prefix="stayer-pg-"))
    try:
        url = start_pg(base)
    except (RuntimeError, OSError) as e:
        shutil.rmtree(base, ignore_errors=True)
        pytest.skip(f"no PostgreSQL server could be started here: {e}")
    try:
        yield base, fresh_database(url)
    finally:
        stop_pg(base)
        shutil.rmtree(base, ignore_errors=True)


def steps_body(steps: int, latency: float, **extra: Any) -> dict[str, Any]:
    """A run of ``steps`` synthetic steps and a submit (``steps + 1`` in all)."""
    return {
        "task": "hello-file",
        "model": SIM,
        "sim_policy": f"synthetic:steps={steps},obs_tokens=200,out_tokens=30",
        "max_steps": steps + 10,
        "sim_latency": latency,
        **extra,
    }


def ledger_is_its_cost(c: httpx.Client, run: dict[str, Any]) -> list[dict[str, Any]]:
    """The run's ledger, checked to add up to its cost, one entry per step (a call lost in
    flight is the only other kind); the lost entries."""
    ledger = c.get(f"/v1/runs/{run['id']}/ledger").json()["ledger"]
    assert sum((Decimal(e["cost_usd"]) for e in ledger), Decimal(0)) == Decimal(run["cost_usd"])
    steps = [e for e in ledger if e.get("kind") != "lost_in_flight"]
    assert [e["step"] for e in steps] == list(range(1, run["steps"] + 1))
    return [e for e in ledger if e.get("kind") == "lost_in_flight"]


def test_a_stalled_workers_runs_are_taken_over_and_resumed_not_failed(
    env: Env, tasks: Path
) -> None:
    """Item 1 of issue 34: the worker's lease and the journal's are one. A worker stopped
    (SIGSTOP: alive, as one on another host looks) past its --lease-ttl has its runs
    resumed by another worker from their journals, which end as they would have, with
    their budget holds settled."""
    api = start_server(env, tasks, "--workers", "0")
    tenant = name()
    key = env.tenant(tenant, "--max-cost", "10")["api_key"]
    stalled = spawn(
        env,
        worker_args(tasks, "--concurrency", "4", "--lease-ttl", "2"),
        env.home.parent / "stalled.log",
    )
    rescuer: Process | None = None
    try:
        with api.client(key) as c:
            ids = [
                c.post("/v1/runs", json=steps_body(20, 0.2, max_cost=0.5)).json()["id"]
                for _ in range(3)
            ]
            for run_id in ids:
                wait_for(c, run_id, lambda r: r["steps"] >= 3)
            stalled.proc.send_signal(signal.SIGSTOP)
            rescuer = spawn(
                env,
                worker_args(tasks, "--concurrency", "4", "--lease-ttl", "2"),
                env.home.parent / "rescuer.log",
            )
            runs = [wait_for(c, run_id, finished) for run_id in ids]
            for run in runs:
                # The synthetic policy works and submits without solving the task.
                assert run["status"] == "failed" and run["steps"] == 21, (run, rescuer.output())
                # Each call lost in flight (at the stall, or at a takeover of the rescuer
                # itself: its 2 s lease can lapse on a loaded machine) is on the ledger once,
                # as its re-issue said: never paid twice unseen, whatever the timing.
                log = rescuer.log.read_text(errors="replace")
                reissued = log.count(f"run {run['id']}: model call")
                assert len(ledger_is_its_cost(c, run)) == reissued, log
            assert held(env, tenant) == 0
    finally:
        stalled.proc.send_signal(signal.SIGCONT)
        stalled.kill(signal.SIGKILL)
        if rescuer is not None:
            rescuer.kill()
        api.process.kill()


def test_workers_and_the_api_outlive_a_postgresql_restart(
    own_pg: tuple[Path, str], tasks: Path, tmp_path: Path
) -> None:
    """Item 2: the database restarts under running runs. The API answers 503 with
    Retry-After meanwhile (never 500 or 422) and its /healthz says so; the workers wait it
    out (their /healthz too) and the runs end as they would have."""
    base, url = own_pg
    env = Env(tmp_path / "home", url)
    api = start_server(env, tasks, "--workers", "0")
    key = env.tenant(name())["api_key"]
    port = free_port()
    worker = spawn(
        env,
        worker_args(tasks, "--concurrency", "4", "--lease-ttl", "3", "--metrics-port", str(port)),
        tmp_path / "worker.log",
    )
    health = f"http://127.0.0.1:{port}/healthz"

    def worker_health() -> int:
        try:
            return httpx.get(health, timeout=5.0).status_code
        except httpx.HTTPError:
            return 0

    def worker_died() -> str | None:
        code = worker.proc.poll()
        return None if code is None else f"the worker exited {code}: {worker.output()}"

    try:
        with api.client(key) as c:
            ids = [c.post("/v1/runs", json=steps_body(12, 0.1)).json()["id"] for _ in range(3)]
            for run_id in ids:
                wait_for(c, run_id, lambda r: r["steps"] >= 2)
            pg_port = int(url.split(":")[2].split("/")[0])
            stop_pg(base)
            answers: list[httpx.Response] = []

            def api_says_unavailable() -> bool:
                r = c.get("/v1/runs")
                answers.append(r)
                return r.status_code == 503

            until("the API answers 503", api_says_unavailable, give_up=worker_died)
            until(
                "the worker's /healthz says 503",
                lambda: worker_health() == 503,
                give_up=worker_died,
            )
            r = c.get("/healthz")
            assert r.status_code == 503 and r.json()["status"] == "unavailable"
            assert all(a.status_code in (200, 503) for a in answers), [
                a.status_code for a in answers
            ]
            assert all(a.headers.get("retry-after") for a in answers if a.status_code == 503)
            start_pg(base, port=pg_port)
            until("the API's /healthz is 200 again", lambda: c.get("/healthz").status_code == 200)
            runs = [wait_for(c, run_id, finished) for run_id in ids]
            assert worker.proc.poll() is None, worker.output()
            until(
                "the worker's /healthz is 200 again",
                lambda: worker_health() == 200,
                give_up=worker_died,
            )
            for run in runs:
                assert run["status"] == "failed" and run["steps"] == 13, (run, worker.output())
                # Each call lost in flight while the database was away is on the ledger
                # once, as its re-issue said, however often the run was taken up again.
                log = worker.log.read_text(errors="replace")
                reissued = log.count(f"run {run['id']}: model call")
                assert len(ledger_is_its_cost(c, run)) == reissued, log
    finally:
        worker.kill()
        api.process.kill()


def test_the_apis_database_connections_stay_bounded_under_bursts(env: Env, tasks: Path) -> None:
    """Item 3: bursts of clients; the API's connections come from one bounded pool
    (STAYER_DB_POOL, default 10), not one kept per thread forever."""
    api = start_server(env, tasks, "--workers", "0")
    key = env.tenant(name())["api_key"]
    statuses: list[int] = []
    most = 0

    def client() -> None:
        with api.client(key) as c:
            for _ in range(3):
                statuses.append(c.get("/v1/runs").status_code)

    try:
        for _ in range(4):
            burst = [threading.Thread(target=client) for _ in range(60)]
            for t in burst:
                t.start()
            for t in burst:
                t.join()
            (count,) = rows(
                env.db_url,
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                "AND pid <> pg_backend_pid()",
            )[0]
            most = max(most, int(count))
        assert set(statuses) == {200}, sorted(set(statuses))
        assert most <= 10, most
    finally:
        api.process.kill()


def test_stores_opened_together_on_an_empty_database_all_open(pg_url: str) -> None:
    """Item 4: processes that create the runtime's tables at once (several workers and the
    API started together on an empty database) neither race nor fail."""
    from stayer.journal.postgres import PostgresStore
    from stayer.runtime.actions import Actions
    from stayer.runtime.db import ServiceDB
    from stayer.runtime.tenants import TenantBudgets, open_budget_store

    def open_all(url: str, start: threading.Barrier, errors: list[BaseException]) -> None:
        start.wait()
        try:
            store = PostgresStore(url)
            try:
                ServiceDB(store)
                Actions(store)
                TenantBudgets(open_budget_store(Path("."), url))
            finally:
                store.close()
        except BaseException as e:  # noqa: BLE001 - collected for the assertion
            errors.append(e)

    for _ in range(3):
        url, start, errors = fresh_database(pg_url), threading.Barrier(8), []
        threads = [threading.Thread(target=open_all, args=(url, start, errors)) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert not errors, [f"{type(e).__name__}: {e}" for e in errors]


def test_workers_started_together_on_an_empty_database_all_run(env: Env, tasks: Path) -> None:
    """Item 4, as processes: four workers and the API at once on an empty database."""
    workers = [
        spawn(env, worker_args(tasks, "--concurrency", "2"), env.home.parent / f"w{i}.log")
        for i in range(4)
    ]
    api = start_server(env, tasks, "--workers", "0")
    try:
        key = env.tenant(name())["api_key"]
        with api.client(key) as c:
            answers = [c.post("/v1/runs", json=steps_body(3, 0.0)) for _ in range(8)]
            assert [a.status_code for a in answers] == [201] * 8
            runs = [wait_for(c, a.json()["id"], finished) for a in answers]
        assert {r["status"] for r in runs} == {"failed"}
        for w in workers:
            assert w.proc.poll() is None, w.output()
    finally:
        for w in workers:
            w.kill()
        api.process.kill()


def test_sigterm_hands_runs_back_at_a_step_boundary_within_the_drain_timeout(
    env: Env, tasks: Path
) -> None:
    """Item 5: SIGTERM stops claiming and hands each run back at its next step boundary;
    one still inside a step (a 15 s model call) at --drain-timeout is cut short there.
    The worker exits; another resumes both runs from their journals."""
    api = start_server(env, tasks, "--workers", "0")
    tenant = name()
    key = env.tenant(tenant, "--max-cost", "10")["api_key"]
    draining = spawn(
        env,
        worker_args(tasks, "--concurrency", "2", "--drain-timeout", "6"),
        env.home.parent / "draining.log",
    )
    rescuer: Process | None = None
    try:
        with api.client(key) as c:
            stepping = c.post("/v1/runs", json=steps_body(30, 0.2, max_cost=0.5)).json()["id"]
            wait_for(c, stepping, lambda r: r["steps"] >= 2)
            stuck = c.post("/v1/runs", json=steps_body(1, 15, max_cost=0.5)).json()["id"]
            until(
                "the second run is claimed",
                lambda: rows(
                    env.db_url, "SELECT worker FROM stayer_service_runs WHERE id = %s", (stuck,)
                )[0][0],
            )
            draining.proc.send_signal(signal.SIGTERM)
            until(
                "the draining worker exits",
                lambda: draining.proc.poll() is not None,
            )
            assert draining.proc.returncode == 0, draining.output()
            # Both handed back: running, no worker, no lease (on the run or its journal).
            for run_id in (stepping, stuck):
                ((status, worker, lease),) = rows(
                    env.db_url,
                    "SELECT status, worker, lease_expires FROM stayer_service_runs WHERE id = %s",
                    (run_id,),
                )
                assert (status, worker, lease) == ("running", None, None), draining.output()
                ((owner,),) = rows(
                    env.db_url, "SELECT lease_owner FROM stayer_runs WHERE id = %s", (run_id,)
                )
                assert owner is None
            handed_at = c.get(f"/v1/runs/{stepping}").json()["steps"]
            assert handed_at < 30
            rescuer = spawn(
                env, worker_args(tasks, "--concurrency", "2"), env.home.parent / "rescuer.log"
            )
            run = wait_for(c, stepping, finished)
            assert run["status"] == "failed" and run["steps"] == 31, (run, rescuer.output())
            # Handed back at a step boundary: no call was lost in flight.
            assert ledger_is_its_cost(c, run) == []
            run = wait_for(c, stuck, finished)
            assert run["status"] == "failed" and run["steps"] == 2, (run, rescuer.output())
            # Cut short inside its first call: that call is billed and issued again.
            assert len(ledger_is_its_cost(c, run)) <= 1
            assert held(env, tenant) == 0
    finally:
        draining.kill(signal.SIGKILL)
        if rescuer is not None:
            rescuer.kill()
        api.process.kill()


def test_a_workers_health_endpoint_serves_two_paths_and_nothing_else() -> None:
    """The worker's /healthz and /metrics (on 127.0.0.1 only): another path or method gets
    nothing, a path with a query string is the same path, nothing else is read."""
    from types import SimpleNamespace

    from prometheus_client import CollectorRegistry

    from stayer.runtime.worker import serve_health

    state = {"ok": True}
    fake = SimpleNamespace(
        health=lambda: (state["ok"], {"status": "ok" if state["ok"] else "unavailable"}),
        metrics=SimpleNamespace(registry=CollectorRegistry()),
    )
    port = free_port()
    server = serve_health(fake, port)  # type: ignore[arg-type]
    try:
        base = f"http://127.0.0.1:{port}"
        assert server.server_address[0] == "127.0.0.1"
        assert httpx.get(f"{base}/healthz?x=1", timeout=30).json() == {"status": "ok"}
        state["ok"] = False
        r = httpx.get(f"{base}/healthz", timeout=30)
        assert r.status_code == 503 and r.headers["retry-after"]
        assert httpx.get(f"{base}/metrics", timeout=30).status_code == 200
        for path in ("/", "/../etc/passwd", "/healthz/../metrics/x", "/%00"):
            assert httpx.get(f"{base}{path}", timeout=30).status_code == 404, path
        assert httpx.post(f"{base}/healthz", content=b"x" * 100, timeout=30).status_code == 501
    finally:
        server.shutdown()

"""The hosted runtime against live servers and workers, on SQLite and on PostgreSQL."""

from __future__ import annotations

import hashlib
import hmac
import io
import json
import signal
import tarfile
import threading
import uuid
from decimal import Decimal
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path

import pytest
from pg_server import _fresh_database as fresh_database
from pg_server import database_fixture
from service_helpers import Env, copy_tasks, finished, read_events, spawn, start_server, wait_for

from stayer.runtime.webhooks import sign, url_problem, verify

pg_url = database_fixture()

SIM = "sim:claude-sonnet-4-5"
LONG = "synthetic:steps=400,obs_tokens=50,out_tokens=20"


# One server per backend for the module: tests keep apart by using tenants of their own.
# The PostgreSQL lane is `slow` (CI runs it); SQLite runs in the default suite.
BACKENDS = ["sqlite", pytest.param("postgres", marks=pytest.mark.slow)]


@pytest.fixture(scope="module", params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> str:
    return "" if request.param == "sqlite" else request.getfixturevalue("pg_url")


@pytest.fixture(scope="module")
def tasks(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return copy_tasks(tmp_path_factory.mktemp("tasks"), "hello-file", "fix-median")


@pytest.fixture(scope="module")
def server(backend: str, tasks: Path, tmp_path_factory: pytest.TempPathFactory):  # noqa: ANN201
    s = start_server(
        Env(tmp_path_factory.mktemp("shared") / "home", backend), tasks, "--workers", "2"
    )
    yield s
    s.process.kill()


@pytest.fixture
def env(backend: str, tmp_path: Path) -> Env:
    """A home (and database) of the test's own, for servers without workers."""
    return Env(tmp_path / "home", fresh_database(backend) if backend else "")


def name() -> str:
    return "t" + uuid.uuid4().hex[:10]


def ledger_total(ledger: list[dict]) -> Decimal:
    return sum((Decimal(e["cost_usd"]) for e in ledger), Decimal(0))


def test_a_run_through_the_api_succeeds_and_its_cost_is_its_ledger(server) -> None:
    key = server.env.tenant(name())["api_key"]
    with server.client(key) as c:
        created = c.post(
            "/v1/runs", json={"task": "hello-file", "model": SIM, "metadata": {"ticket": "T-1"}}
        )
        assert created.status_code == 201, created.text
        body = created.json()
        assert body["status"] == "queued" and body["metadata"] == {"ticket": "T-1"}
        run = wait_for(c, body["id"], finished)
        assert (
            run["status"] == "succeeded" and run["reward"] == 1.0 and run["stop_reason"] == "submit"
        )
        ledger = c.get(f"/v1/runs/{body['id']}/ledger").json()["ledger"]
        assert len(ledger) == run["steps"] > 0
        assert ledger_total(ledger) == Decimal(run["cost_usd"])
        assert run["usage"]["input_tokens"] == sum(e["usage"]["input_tokens"] for e in ledger)
        listed = c.get("/v1/runs", params={"status": "succeeded"}).json()
        assert [r["id"] for r in listed["data"]] == [body["id"]]
        assert c.get("/openapi.json").json()["paths"]["/v1/runs"]["post"]


def test_a_team_run_through_the_api_has_cost_per_agent(server) -> None:
    team = {
        "entry": "lead",
        "agents": {
            "lead": {"model": SIM, "budget_share": 0.4, "talks_to": ["helper"]},
            "helper": {"model": "sim:claude-haiku-4-5", "talks_to": ["lead"]},
        },
    }
    key = server.env.tenant(name())["api_key"]
    with server.client(key) as c:
        created = c.post(
            "/v1/runs", json={"task": "fix-median", "model": SIM, "team": team, "max_cost": "0.5"}
        )
        assert created.status_code == 201, created.text
        run = wait_for(c, created.json()["id"], finished)
        assert run["status"] == "succeeded", run
        ledger = c.get(f"/v1/runs/{run['id']}/ledger").json()["ledger"]
        assert {e["agent"] for e in ledger} == {"lead", "helper"}
        assert ledger_total(ledger) == Decimal(run["cost_usd"])


def test_every_request_needs_a_key_and_tenants_see_only_their_runs(server) -> None:
    alice, bob = server.env.tenant(name())["api_key"], server.env.tenant(name())["api_key"]
    with server.client(alice) as a:
        run_id = a.post("/v1/runs", json={"task": "hello-file", "model": SIM}).json()["id"]
    for key in (None, "", "sk-stayer-wrong", alice + "x"):
        with server.client(key) as anon:
            assert anon.get("/v1/runs").status_code == 401
            assert anon.get(f"/v1/runs/{run_id}").status_code == 401
            assert (
                anon.post("/v1/runs", json={"task": "hello-file", "model": SIM}).status_code == 401
            )
    with server.client(alice) as a:
        assert (
            a.get(f"/v1/runs/{run_id}", headers={"Authorization": f"Basic {alice}"}).status_code
            == 401
        )
    with server.client(bob) as b:
        for path in ("", "/ledger", "/events"):
            assert b.get(f"/v1/runs/{run_id}{path}").status_code == 404
        assert b.post(f"/v1/runs/{run_id}/cancel").status_code == 404
        assert b.get("/v1/runs").json()["data"] == []
    with server.client(alice) as a:
        wait_for(a, run_id, finished)


@pytest.mark.parametrize(
    "body",
    [
        {"task": "../hello-file", "model": SIM},
        {"task": "nope", "model": SIM},
        {"task": ".", "model": SIM},
        {"task": "hello-file", "model": "nomodel"},
        {"task": "hello-file", "model": "gpt:x"},
        {"task": "hello-file", "model": SIM, "max_cost": -1},
        {"task": "hello-file", "model": SIM, "max_cost": "NaN"},
        {"task": "hello-file", "model": SIM, "max_cost": "1e17"},
        {"task": "hello-file", "model": SIM, "max_steps": 0},
        {"task": "hello-file", "model": SIM, "sim_latency": "inf"},
        {"task": "hello-file", "model": SIM, "sim_policy": "replay:/etc/passwd"},
        {"task": "hello-file", "model": SIM, "webhook": "file:///etc/passwd"},
        {"task": "hello-file", "model": SIM, "surprise": 1},
        {
            "task": "hello-file",
            "model": SIM,
            "team": {"entry": "a", "agents": {"b": {"model": SIM}}},
        },
    ],
)
def test_bad_run_requests_are_422_and_create_nothing(server, body: dict) -> None:
    key = server.env.tenant(name())["api_key"]
    with server.client(key) as c:
        r = c.post("/v1/runs", json=body)
        assert r.status_code == 422, r.text
        assert c.get("/v1/runs").json()["data"] == []


def test_events_stream_from_the_journal_and_resume_exactly_after_last_event_id(server) -> None:
    key = server.env.tenant(name())["api_key"]
    with server.client(key) as c:
        run_id = c.post("/v1/runs", json={"task": "fix-median", "model": SIM}).json()["id"]
        full = list(read_events(c, run_id))  # follows the run live until its final status
        ids = [int(e["id"]) for e in full]
        assert ids == sorted(set(ids)) and ids[0] == 0
        assert full[0]["data"]["status"] == "queued" and full[-1]["data"]["status"] == "succeeded"
        types = {e["event"] for e in full}
        assert {"run.status", "message", "tool.call", "tool.result", "step"} <= types
        steps = [e["data"] for e in full if e["event"] == "step"]
        run = c.get(f"/v1/runs/{run_id}").json()
        assert len(steps) == run["steps"] and ledger_total(steps) == Decimal(run["cost_usd"])
        # Reconnect after every event (20 at most): the rest of the stream, exactly.
        for cut in ids[:: max(1, len(ids) // 20)]:
            rest = list(read_events(c, run_id, last_event_id=str(cut)))
            assert [int(e["id"]) for e in rest] == [i for i in ids if i > cut]
            assert rest == [e for e in full if int(e["id"]) > cut]
        assert list(read_events(c, run_id, last_event_id=str(ids[-1]))) == []
        assert (
            c.get(f"/v1/runs/{run_id}/events", params={"after": ids[-2]}).text.count(
                "event: run.status"
            )
            == 1
        )
        assert c.get(f"/v1/runs/{run_id}/events", headers={"Last-Event-ID": "x"}).status_code == 422


def test_cancel_stops_a_running_run_and_keeps_what_it_spent(server) -> None:
    key = server.env.tenant(name())["api_key"]
    with server.client(key) as c:
        body = {
            "task": "hello-file",
            "model": SIM,
            "sim_policy": LONG,
            "max_steps": 400,
            "sim_latency": 0.02,
        }
        run_id = c.post("/v1/runs", json=body).json()["id"]
        wait_for(c, run_id, lambda r: r["steps"] >= 2)
        assert c.post(f"/v1/runs/{run_id}/cancel").json()["cancel_requested"] is True
        run = wait_for(c, run_id, finished)
        assert run["status"] == "cancelled" and run["stop_reason"] == "cancelled"
        assert 2 <= run["steps"] < 400
        ledger = c.get(f"/v1/runs/{run_id}/ledger").json()["ledger"]
        assert len(ledger) == run["steps"] and ledger_total(ledger) == Decimal(run["cost_usd"])
        events = list(read_events(c, run_id))
        assert events[-1]["data"]["status"] == "cancelled"
        # Cancelling again changes nothing.
        assert c.post(f"/v1/runs/{run_id}/cancel").json()["status"] == "cancelled"
    result = json.loads((server.env.home / "runs" / run_id / "result.json").read_text())
    assert result["status"] == "cancelled" and len(result["ledger"]) == run["steps"]


def test_a_queued_run_cancels_at_once(env: Env, tasks: Path) -> None:
    api_only = start_server(env, tasks, "--workers", "0")
    try:
        key = env.tenant(name())["api_key"]
        with api_only.client(key) as c:
            run_id = c.post("/v1/runs", json={"task": "hello-file", "model": SIM}).json()["id"]
            assert c.get(f"/v1/runs/{run_id}").json()["status"] == "queued"
            assert c.post(f"/v1/runs/{run_id}/cancel").json()["status"] == "cancelled"
            events = list(read_events(c, run_id))
            assert [(e["id"], e["data"]["status"]) for e in events] == [
                ("0", "queued"),
                ("1", "cancelled"),
            ]
            assert list(read_events(c, run_id, last_event_id="1")) == []
    finally:
        api_only.process.kill()


def test_a_run_over_its_tenants_budget_pauses_until_the_budget_is_raised(server) -> None:
    tenant = name()
    key = server.env.tenant(tenant, "--max-cost", "0.01")["api_key"]
    with server.client(key) as c:
        run_id = c.post(
            "/v1/runs", json={"task": "hello-file", "model": SIM, "max_cost": "0.5"}
        ).json()["id"]
        run = wait_for(c, run_id, lambda r: r["status"] == "paused")
        assert run["stop_reason"] == "budget_reached" and run["steps"] == 0
        raised = json.loads(
            server.env.cli("tenants", "budget", tenant, "--max-cost", "1", "--json").stdout
        )
        assert raised["requeued_runs"] == 1
        run = wait_for(c, run_id, finished)
        assert run["status"] == "succeeded"
    tenants = json.loads(server.env.cli("tenants", "list", "--json").stdout)["tenants"]
    mine = next(t for t in tenants if t["tenant"] == tenant)
    assert (
        Decimal(mine["spent_usd"]) == Decimal(run["cost_usd"])
        and Decimal(mine["reserved_usd"]) == 0
    )


def test_tenant_commands_refuse_bad_input(env: Env) -> None:
    tenant = name()
    env.tenant(tenant, "--max-cost", "1")
    r = env.cli("tenants", "budget", tenant, "--max-cost", "-1", check=False)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    r = env.cli("tenants", "budget", "nobody-" + tenant, "--max-cost", "1", check=False)
    assert r.returncode == 2 and "no such tenant" in r.stderr
    r = env.cli("tenants", "create", tenant, check=False)
    assert r.returncode == 2 and "already exists" in r.stderr
    r = env.cli("tenants", "create", "../x", check=False)
    assert r.returncode == 2


class _Receiver(BaseHTTPRequestHandler):
    received: list[tuple[bytes, dict[str, str]]] = []

    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        body = self.rfile.read(int(self.headers["Content-Length"]))
        type(self).received.append((body, dict(self.headers)))
        self.send_response(204)
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


def test_webhooks_are_signed_with_the_tenants_secret(server) -> None:
    tenant = server.env.tenant(name())
    receiver = HTTPServer(("127.0.0.1", 0), _Receiver)
    _Receiver.received = []
    threading.Thread(target=receiver.serve_forever, daemon=True).start()
    try:
        hook = f"http://127.0.0.1:{receiver.server_port}/hook"
        with server.client(tenant["api_key"]) as c:
            run_id = c.post(
                "/v1/runs", json={"task": "hello-file", "model": SIM, "webhook": hook}
            ).json()["id"]
            wait_for(c, run_id, finished)
            wait_for(c, run_id, lambda _r: any(b"succeeded" in b for b, _ in _Receiver.received))
    finally:
        receiver.shutdown()
    statuses = []
    for body, headers in _Receiver.received:
        # Signed with its delivery id and time (issue 34, S8): id.timestamp.body.
        signed = f"{headers['X-Stayer-Webhook-Id']}.{headers['X-Stayer-Timestamp']}.".encode()
        expected = (
            "sha256="
            + hmac.new(tenant["webhook_secret"].encode(), signed + body, hashlib.sha256).hexdigest()
        )
        assert hmac.compare_digest(headers["X-Stayer-Signature"], expected)
        assert verify(tenant["webhook_secret"], body, headers)
        doc = json.loads(body)
        assert doc["type"] == "run.status" and doc["run_id"] == run_id
        statuses.append(doc["status"])
    assert statuses[0] == "running" and statuses[-1] == "succeeded"


def test_webhook_urls_to_private_addresses_are_refused_unless_allowed() -> None:
    for url in (
        "http://127.0.0.1/x",
        "http://localhost:9/x",
        "http://169.254.169.254/latest",
        "http://10.0.0.1/",
        "http://[::1]/x",
        "ftp://example.org/",
        "http://user:pw@example.org/",
        "http:///x",
    ):
        assert url_problem(url, allow_private=False) is not None, url
    assert url_problem("http://127.0.0.1:9/x", allow_private=True) is None
    assert (
        sign("s", b"{}", delivery_id="d", timestamp=7)
        == "sha256=" + hmac.new(b"s", b"d.7.{}", hashlib.sha256).hexdigest()
    )


def _comparable(ledger: list[dict]) -> list[dict]:
    drop = {"latency_s"}
    return [{k: v for k, v in e.items() if k not in drop} for e in ledger]


def test_a_sigkilled_workers_run_is_finished_by_another_with_the_same_ledger(
    env: Env, tasks: Path
) -> None:
    api = start_server(env, tasks, "--workers", "0")
    key = env.tenant(name())["api_key"]
    body = {
        "task": "hello-file",
        "model": SIM,
        "sim_policy": "synthetic:steps=12,obs_tokens=300,out_tokens=40",
        "max_steps": 30,
        "sim_latency": 0.05,
    }
    worker_args = ["worker", "--tasks-dir", str(tasks), "--concurrency", "1", "--lease-ttl", "2"]
    try:
        with api.client(key) as c:
            # The reference: the same run, uninterrupted.
            first = spawn(env, worker_args, env.home.parent / "w0.log")
            ref_id = c.post("/v1/runs", json=body).json()["id"]
            reference = wait_for(c, ref_id, finished)
            first.kill()
            # The synthetic policy works and submits without solving the task: "failed".
            assert reference["status"] == "failed" and reference["steps"] > 4, first.output()

            victim = spawn(env, worker_args, env.home.parent / "w1.log")
            run_id = c.post("/v1/runs", json=body).json()["id"]
            wait_for(c, run_id, lambda r: r["steps"] >= 4)
            victim.kill(signal.SIGKILL)
            assert not finished(c.get(f"/v1/runs/{run_id}").json())
            rescuer = spawn(env, worker_args, env.home.parent / "w2.log")
            try:
                run = wait_for(c, run_id, finished)
            finally:
                rescuer.kill()
            assert run["status"] == reference["status"], rescuer.output()
            assert run["steps"] == reference["steps"]
            ledger = c.get(f"/v1/runs/{run_id}/ledger").json()["ledger"]
            ref_ledger = c.get(f"/v1/runs/{ref_id}/ledger").json()["ledger"]
            # A model call in flight at the kill was billed and is issued again: it is on the
            # ledger as lost_in_flight, and every other entry is the uninterrupted run's.
            lost = [e for e in ledger if e.get("kind") == "lost_in_flight"]
            steps = [e for e in ledger if e.get("kind") != "lost_in_flight"]
            assert len(lost) <= 1 and _comparable(steps) == _comparable(ref_ledger)
            assert Decimal(run["cost_usd"]) == Decimal(reference["cost_usd"]) + ledger_total(lost)
            events = list(read_events(c, run_id))
            ids = [int(e["id"]) for e in events]
            assert ids == sorted(set(ids))
            stepped = [e["data"] for e in events if e["event"] == "step"]
            assert [d["step"] for d in stepped if d.get("kind") != "lost_in_flight"] == list(
                range(1, run["steps"] + 1)
            )
            assert len([d for d in stepped if d.get("kind") == "lost_in_flight"]) == len(lost)
    finally:
        api.process.kill()


def _decide_all(c, run_id: str, decision: str, message: str | None = None) -> dict:
    """Answer every call the run asks about until it ends; its final state."""
    while True:
        run = wait_for(c, run_id, lambda r: r["status"] == "requires_action" or finished(r))
        if finished(run):
            return run
        pending = run["pending_action"]
        r = c.post(
            f"/v1/runs/{run_id}/actions",
            json={"call_id": pending["call_id"], "decision": decision, "message": message},
        )
        assert r.status_code == 200, r.text


def test_confirmed_tools_wait_for_a_person_without_holding_a_worker(server) -> None:
    key = server.env.tenant(name())["api_key"]
    with server.client(key) as c:
        waiting = [
            c.post(
                "/v1/runs", json={"task": "hello-file", "model": SIM, "confirm_tools": ["bash"]}
            ).json()["id"]
            for _ in range(3)
        ]  # more than the server's 2 worker slots
        for run_id in waiting:
            run = wait_for(c, run_id, lambda r: r["status"] == "requires_action")
            action = run["pending_action"]
            assert (
                action["call_id"] == "act-1"
                and action["tool"] == "bash"
                and action["status"] == "pending"
            )
            assert "command" in action["arguments"]
            cost = action["wait_cost"]
            assert cost["cache_ttl_s"] == 300 and Decimal(cost["cost_if_cache_expires_usd"]) >= 0
            assert cost["context_tokens"] > 0 and cost["cache_expires_at"]
        # Nobody holds a slot while they wait: a plain run still goes through.
        plain = c.post("/v1/runs", json={"task": "hello-file", "model": SIM}).json()["id"]
        assert wait_for(c, plain, finished)["status"] == "succeeded"

        run_id = waiting[0]
        assert (
            c.post(
                f"/v1/runs/{run_id}/actions", json={"call_id": "act-9", "decision": "approve"}
            ).status_code
            == 409
        )
        assert (
            c.post(
                f"/v1/runs/{run_id}/actions", json={"call_id": "x", "decision": "approve"}
            ).status_code
            == 422
        )
        assert (
            c.post(
                f"/v1/runs/{run_id}/actions", json={"call_id": "act-1", "decision": "maybe"}
            ).status_code
            == 422
        )
        run = _decide_all(c, run_id, "approve")
        assert run["status"] == "succeeded" and run["pending_action"] is None
        actions = c.get(f"/v1/runs/{run_id}/actions").json()["data"]
        assert actions and all(a["status"] == "approved" for a in actions)
        ledger = c.get(f"/v1/runs/{run_id}/ledger").json()["ledger"]
        assert len(ledger) == run["steps"] and ledger_total(ledger) == Decimal(run["cost_usd"])
        events = list(read_events(c, run_id))
        kinds = [(e["event"], e["data"].get("status")) for e in events]
        assert ("requires_action", None) in [(k, None) for k, _ in kinds]
        assert ("run.status", "requires_action") in kinds and kinds[-1] == (
            "run.status",
            "succeeded",
        )
        ids = [int(e["id"]) for e in events]
        assert ids == sorted(set(ids))

        # Rejected: the person's reason reaches the model as the tool's error.
        rejected = waiting[1]
        run = _decide_all(c, rejected, "reject", "not on production")
        assert finished(run)
        tool_results = [e["data"] for e in read_events(c, rejected) if e["event"] == "tool.result"]
        assert not any(r["name"] == "bash" for r in tool_results)  # no bash call ever ran
        actions = c.get(f"/v1/runs/{rejected}/actions").json()["data"]
        assert actions and all(
            a["status"] == "rejected" and a["message"] == "not on production" for a in actions
        )
        trajectory = (server.env.home / "runs" / rejected / "trajectory.jsonl").read_text()
        assert "a person rejected this call: not on production" in trajectory

        # Cancelled while it waits: ends at once, its journal closed with what it spent.
        idle = waiting[2]
        spent_before = c.get(f"/v1/runs/{idle}/ledger").json()["ledger"]
        run = c.post(f"/v1/runs/{idle}/cancel").json()
        assert run["status"] == "cancelled" and run["steps"] == len(spent_before)
        assert Decimal(run["cost_usd"]) == ledger_total(spent_before)
        assert list(read_events(c, idle))[-1]["data"]["status"] == "cancelled"
    with server.client(server.env.tenant(name())["api_key"]) as other:
        assert (
            other.post(
                f"/v1/runs/{waiting[0]}/actions", json={"call_id": "act-1", "decision": "approve"}
            ).status_code
            == 404
        )
        assert other.get(f"/v1/runs/{waiting[0]}/actions").status_code == 404


def test_people_talk_to_a_running_or_waiting_agent(server) -> None:
    key = server.env.tenant(name())["api_key"]
    with server.client(key) as c:
        # Waiting for a decision: the message is read at the step after it.
        waiting = c.post(
            "/v1/runs", json={"task": "hello-file", "model": SIM, "confirm_tools": ["bash"]}
        ).json()["id"]
        wait_for(c, waiting, lambda r: r["status"] == "requires_action")
        assert (
            c.post(
                f"/v1/runs/{waiting}/messages", json={"content": "use [b]printf[/b], not echo"}
            ).json()["n"]
            == 1
        )
        run = _decide_all(c, waiting, "approve")
        assert run["status"] == "succeeded"
        said = [
            e["data"]
            for e in read_events(c, waiting)
            if e["event"] == "message" and e["data"].get("role") == "user"
        ]
        assert [m["content"] for m in said] == ["use [b]printf[/b], not echo"]
        trajectory = [
            json.loads(line)
            for line in (server.env.home / "runs" / waiting / "trajectory.jsonl")
            .read_text()
            .splitlines()
        ]
        assert sum(1 for m in trajectory if m.get("kind") == "person") == 1
        assert c.post(f"/v1/runs/{waiting}/messages", json={"content": "late"}).status_code == 409

        # Running: read within a step, in order.
        body = {
            "task": "hello-file",
            "model": SIM,
            "sim_policy": LONG,
            "max_steps": 400,
            "sim_latency": 0.02,
        }
        running = c.post("/v1/runs", json=body).json()["id"]
        wait_for(c, running, lambda r: r["steps"] >= 1)
        for text in ("first", "second"):
            c.post(f"/v1/runs/{running}/messages", json={"content": text})
        seen: list[str] = []
        for event in read_events(c, running):
            if event["event"] == "message" and event["data"].get("role") == "user":
                seen.append(event["data"]["content"])
                if len(seen) == 2:
                    break
        assert seen == ["first", "second"]
        c.post(f"/v1/runs/{running}/cancel")
        wait_for(c, running, finished)
        assert c.post(f"/v1/runs/{running}/messages", json={"content": ""}).status_code == 422


def test_a_run_pauses_at_its_cap_and_resumes_when_it_is_raised_without_paying_again(server) -> None:
    key = server.env.tenant(name())["api_key"]
    with server.client(key) as c:
        body = {
            "task": "hello-file",
            "model": SIM,
            "max_cost": "0.02",
            "max_steps": 40,
            "sim_policy": "synthetic:steps=30,obs_tokens=400,out_tokens=30",
        }
        run_id = c.post("/v1/runs", json=body).json()["id"]
        paused = wait_for(c, run_id, lambda r: r["status"] == "paused" or finished(r))
        assert paused["status"] == "paused" and paused["stop_reason"] == "budget_reached"
        assert 1 <= paused["steps"] < 30 and Decimal(paused["cost_usd"]) <= Decimal("0.02")
        before = c.get(f"/v1/runs/{run_id}/ledger").json()["ledger"]
        assert len(before) == paused["steps"] and ledger_total(before) == Decimal(
            paused["cost_usd"]
        )
        assert c.patch(f"/v1/runs/{run_id}", json={"max_cost": "0.01"}).status_code == 422
        assert c.patch(f"/v1/runs/{run_id}", json={"max_cost": "NaN"}).status_code == 422
        raised = c.patch(f"/v1/runs/{run_id}", json={"max_cost": "5"})
        assert raised.status_code == 200 and raised.json()["status"] == "queued"
        run = wait_for(c, run_id, finished)
        assert run["steps"] == 31 and run["stop_reason"] == "submit"
        after = c.get(f"/v1/runs/{run_id}/ledger").json()["ledger"]
        assert _comparable(after[: len(before)]) == _comparable(
            before
        )  # the paid steps, as they were
        assert not [e for e in after if e.get("kind") == "lost_in_flight"]
        assert ledger_total(after) == Decimal(run["cost_usd"])
        statuses = [
            e["data"]["status"] for e in read_events(c, run_id) if e["event"] == "run.status"
        ]
        assert statuses == ["queued", "running", "paused", "running", run["status"]]
        assert c.patch(f"/v1/runs/{run_id}", json={"max_cost": "9"}).status_code == 409
    with server.client(server.env.tenant(name())["api_key"]) as other:
        assert other.patch(f"/v1/runs/{run_id}", json={"max_cost": "9"}).status_code == 404


def _tgz(entries: list[tuple[tarfile.TarInfo, bytes | None]]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for info, data in entries:
            if data is not None:
                info.size = len(data)
            tar.addfile(info, io.BytesIO(data) if data is not None else None)
    return buf.getvalue()


def _file(path: str, data: bytes, mode: int = 0o644) -> tuple[tarfile.TarInfo, bytes]:
    info = tarfile.TarInfo(path)
    info.mode = mode
    return info, data


def _task_entries(top: str = "mine") -> list[tuple[tarfile.TarInfo, bytes | None]]:
    root = Path(__file__).resolve().parent.parent / "examples" / "hello-file"
    out = []
    for p in sorted(root.rglob("*")):
        if p.is_file():
            out.append(
                _file(f"{top}/{p.relative_to(root)}", p.read_bytes(), p.stat().st_mode & 0o777)
            )
    return out


def _special(path: str, kind: bytes, link: str = "") -> tuple[tarfile.TarInfo, None]:
    info = tarfile.TarInfo(path)
    info.type, info.linkname = kind, link
    return info, None


def test_uploaded_tasks_are_checked_unpacked_safely_and_private(server) -> None:
    alice, bob = server.env.tenant(name())["api_key"], server.env.tenant(name())["api_key"]
    uploads = server.env.home / "uploads"
    with server.client(alice) as c:
        ok = c.post("/v1/tasks", params={"name": "mine"}, content=_tgz(_task_entries()))
        assert ok.status_code == 201, ok.text
        assert (
            c.post("/v1/tasks", params={"name": "mine"}, content=_tgz(_task_entries())).status_code
            == 422
        )
        run_id = c.post("/v1/runs", json={"task": "mine", "model": SIM}).json()["id"]
        assert wait_for(c, run_id, finished)["status"] == "succeeded"
        bad = {
            "symlink": [
                *_task_entries(),
                _special("mine/environment/x", tarfile.SYMTYPE, "/etc/shadow"),
            ],
            "hardlink": [
                *_task_entries(),
                _special("mine/environment/y", tarfile.LNKTYPE, "mine/instruction.md"),
            ],
            "device": [*_task_entries(), _special("mine/environment/z", tarfile.CHRTYPE)],
            "fifo": [*_task_entries(), _special("mine/environment/f", tarfile.FIFOTYPE)],
            "dotdot": [*_task_entries(), _file("mine/../../escape", b"x")],
            "absolute": [*_task_entries(), _file("/tmp/escape", b"x")],
            "network": [
                e
                if e[0].name != "mine/task.toml"
                else _file("mine/task.toml", b"[environment]\nallow_internet = true\n")
                for e in _task_entries()
            ],
            "no-instruction": [
                e for e in _task_entries() if not e[0].name.endswith("instruction.md")
            ],
        }
        for label, entries in bad.items():
            r = c.post("/v1/tasks", params={"name": f"bad-{label}"}, content=_tgz(entries))
            assert r.status_code == 422, (label, r.text)
            assert str(server.env.home) not in r.text, label  # no server paths in answers
        assert (
            c.post("/v1/tasks", params={"name": "junk"}, content=b"not a tarball").status_code
            == 422
        )
        assert (
            c.post("/v1/tasks", params={"name": "../x"}, content=_tgz(_task_entries())).status_code
            == 422
        )
        setuid = [
            e if not e[0].name.endswith("solve.sh") else _file(e[0].name, e[1], 0o4755)
            for e in _task_entries("s")
        ]
        assert c.post("/v1/tasks", params={"name": "suid"}, content=_tgz(setuid)).status_code == 201
    # Unpacked here as uploads/<tenant>/<archive's sha256>/<name> (a cache of the store's).
    tenant_dir = next(d for d in uploads.iterdir() if list(d.glob("*/mine")))
    unpacked = sorted(p.name for h in tenant_dir.iterdir() for p in h.iterdir())
    assert unpacked == ["mine", "suid"]  # nothing half-unpacked
    assert all(p.stat().st_mode & 0o7000 == 0 for p in next(tenant_dir.glob("*/suid")).rglob("*"))
    assert not (Path("/tmp") / "escape").exists()
    with server.client(bob) as b:
        assert b.post("/v1/runs", json={"task": "mine", "model": SIM}).status_code == 422


def test_the_api_restarts_without_affecting_runs(env: Env, tasks: Path) -> None:
    first = start_server(env, tasks, "--workers", "0")
    worker = spawn(
        env, ["worker", "--tasks-dir", str(tasks), "--concurrency", "2"], env.home.parent / "w.log"
    )
    key = env.tenant(name())["api_key"]
    body = {
        "task": "hello-file",
        "model": SIM,
        "sim_policy": "synthetic:steps=10,obs_tokens=100,out_tokens=20",
        "sim_latency": 0.05,
    }
    try:
        with first.client(key) as c:
            run_id = c.post("/v1/runs", json=body).json()["id"]
            wait_for(c, run_id, lambda r: r["steps"] >= 2)
        first.process.kill(signal.SIGKILL)
        second = start_server(env, tasks, "--workers", "0")
        try:
            with second.client(key) as c:
                run = wait_for(c, run_id, finished)
                assert run["steps"] == 11, worker.output()
                events = list(read_events(c, run_id))
                assert [e["data"]["step"] for e in events if e["event"] == "step"] == list(
                    range(1, 12)
                )
        finally:
            second.process.kill()
    finally:
        worker.kill()


def test_request_bodies_are_bounded(server) -> None:
    key = server.env.tenant(name())["api_key"]
    with server.client(key) as c:
        huge = {"task": "hello-file", "model": SIM, "metadata": {"k": "x" * (2 << 20)}}
        assert c.post("/v1/runs", json=huge).status_code == 413

        def chunks():  # no Content-Length: counted as it streams
            for _ in range(40):
                yield b"x" * 65536

        assert (
            c.post(
                "/v1/runs", content=chunks(), headers={"Content-Type": "application/json"}
            ).status_code
            == 413
        )
        assert c.get("/v1/runs").json()["data"] == []


def test_runs_that_end_in_error_or_at_their_step_limit_say_so(server) -> None:
    key = server.env.tenant(name())["api_key"]
    with server.client(key) as c:
        # A model the run cannot use is refused at once (test_runtime_money: its hold);
        # one it cannot reach (no local model server runs) ends in error.
        r = c.post("/v1/runs", json={"task": "hello-file", "model": "sim:claude-sonet-4-5"})
        assert r.status_code == 422 and "claude-sonet-4-5" in r.json()["detail"]
        broken = c.post(
            "/v1/runs", json={"task": "hello-file", "model": "local:no-such-model"}
        ).json()["id"]
        run = wait_for(c, broken, finished)
        assert run["status"] == "error" and "no local model" in run["error"] and run["steps"] == 0
        assert [e["data"]["status"] for e in read_events(c, broken)] == ["queued", "error"]
        # The step limit reached with the tests failing: budget_exhausted, stop reason max_steps.
        body = {"task": "hello-file", "model": SIM, "max_steps": 2, "sim_policy": LONG}
        limited = c.post("/v1/runs", json=body).json()["id"]
        run = wait_for(c, limited, finished)
        assert (
            run["status"] == "budget_exhausted"
            and run["stop_reason"] == "max_steps"
            and run["steps"] == 2
        )
        ledger = c.get(f"/v1/runs/{limited}/ledger").json()["ledger"]
        assert ledger_total(ledger) == Decimal(run["cost_usd"])


def test_an_approval_with_words_reaches_the_agent_with_the_tools_result(tmp_path: Path) -> None:
    """A person approves a held call and says something: the tool runs and its result
    carries their words (the result is frozen, so they go on a copy)."""
    import asyncio

    from stayer.journal import open_store
    from stayer.messages import ToolSpec
    from stayer.runtime.actions import Actions, Gate, RunSuspended
    from stayer.tools.base import ToolContext, ToolResult

    class Echo:
        spec = ToolSpec("deploy", "deploys", {"type": "object"})

        async def __call__(self, args: dict, ctx: ToolContext) -> ToolResult:
            return ToolResult("deployed")

    store = open_store(tmp_path / "home", "")
    actions = Actions(store)  # type: ignore[arg-type]
    [held] = Gate(actions, "r1", ["deploy"])([Echo()])
    ctx = ToolContext(sandbox=None, workspace=str(tmp_path))  # type: ignore[arg-type]
    with pytest.raises(RunSuspended):
        asyncio.run(held({}, ctx))  # the first call waits for a person
    assert actions.decide("r1", 1, True, "go ahead, it is Friday")
    [again] = Gate(actions, "r1", ["deploy"])([Echo()])
    result = asyncio.run(again({}, ctx))
    assert (
        result.output == "deployed\n[a person approved this call and said: go ahead, it is Friday]"
    )
    store.close()

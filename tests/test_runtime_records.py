"""The runtime's records between its layers: read by attribute inside, written as the
same JSON bytes as before at their boundary (the worker's /healthz, webhook bodies, the
stored run request, the SSE stream)."""

from __future__ import annotations

import asyncio
import http.server
import json
import threading
from pathlib import Path

import httpx
import msgspec

from stayer.journal import open_store
from stayer.records import from_json
from stayer.runtime.db import RunRequest, ServiceDB
from stayer.runtime.schemas import RunCreate
from stayer.runtime.webhooks import RunStatusHook, Webhooks, verify
from stayer.runtime.worker import Worker, serve_health
from tests.service_helpers import free_port


def test_the_workers_health_is_a_record_served_as_the_same_bytes(tmp_path: Path) -> None:
    worker = Worker(tmp_path / "home", tmp_path, concurrency=3)
    ok, health = worker.health()
    assert ok and (health.status, health.store, health.runs, health.slots) == ("ok", "ok", 0, 3)
    worker.store_problem = "database down"
    ok, health = worker.health()
    assert not ok and (health.status, health.store) == ("unavailable", "database down")
    port = free_port()
    server = serve_health(worker, port)
    try:
        r = httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=30)
        assert r.status_code == 503
        assert r.content == (
            b'{"status": "unavailable", "store": "database down", "runs": 0, '
            b'"slots": 3, "draining": false}'
        )
    finally:
        server.shutdown()


def test_a_status_webhook_is_a_record_sent_as_the_same_signed_bytes() -> None:
    got: list[tuple[bytes, dict[str, str]]] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 - http.server's name
            got.append((self.rfile.read(int(self.headers["Content-Length"])), dict(self.headers)))
            self.send_response(204)
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    receiver = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=receiver.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{receiver.server_address[1]}/hook"
    hook = RunStatusHook(run_id="r-1", status="failed", stop_reason="caf\u00e9 closed")
    assert (hook.type, hook.run_id) == ("run.status", "r-1")

    async def send() -> None:
        webhooks = Webhooks(allow_private=True)
        webhooks.send(url, "s3cret", hook)
        await webhooks.aclose(timeout_s=30)

    try:
        asyncio.run(send())
    finally:
        receiver.shutdown()
    ((body, headers),) = got
    before = {
        "type": "run.status",
        "run_id": "r-1",
        "status": "failed",
        "stop_reason": "caf\u00e9 closed",
    }
    assert body == json.dumps(before, separators=(",", ":")).encode()
    assert (
        body
        == b'{"type":"run.status","run_id":"r-1","status":"failed","stop_reason":"caf\\u00e9 closed"}'
    )
    assert verify("s3cret", body, headers)


def test_a_stored_run_request_is_a_record_whose_column_keeps_its_json(tmp_path: Path) -> None:
    fields = [f.encode_name for f in msgspec.structs.fields(RunRequest)]
    assert fields == [*RunCreate.model_fields, "max_cost_default"]  # none dropped, same order
    body = RunCreate.model_validate(
        {
            "task": "hello-file",
            "model": "sim:claude-sonnet-4-5",
            "max_cost": "2.50",
            "max_steps": 7,
            "sim_latency": 1,
            "webhook": "https://example.org/h",
            "metadata": {"who": "caf\u00e9"},
            "team": {"lead": "a", "agents": {"a": {"model": "sim:x", "n": [1, 2.5, None]}}},
            "mcp_servers": {"fs": {"command": ["x"], "env": {}}},
            "confirm_tools": ["bash"],
        }
    )
    asked = body.model_dump(mode="json")
    request = from_json(asked, RunRequest)
    request.max_cost_default = "1"
    store = open_store(tmp_path / "home")
    try:
        db = ServiceDB(store)
        db.insert_run("r-1", "t", body.task, body.model, request)
        ((column,),) = store._read("SELECT request FROM stayer_service_runs WHERE id = 'r-1'", ())
        assert column == json.dumps({**asked, "max_cost_default": "1"})  # as stored before
        run = db.run("r-1")
        assert run is not None and run.request == request
        assert (run.request.max_cost, run.request.max_steps, run.request.sim_latency) == (
            "2.50",
            7,
            1.0,
        )
        assert run.request.metadata == {"who": "caf\u00e9"} and run.request.confirm_tools == [
            "bash"
        ]
        # A row stored before a field existed (or an empty request) reads its defaults.
        with store._tx() as cur:
            cur.execute("UPDATE stayer_service_runs SET request = '{}' WHERE id = 'r-1'")
        run = db.run("r-1")
        assert run is not None and run.request == RunRequest()
        assert run.request.max_cost_default is msgspec.UNSET and run.request.metadata == {}
    finally:
        store.close()

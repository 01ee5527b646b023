"""The runtime's records between its layers: read by attribute inside, written as the
same JSON bytes as before at their boundary (the worker's /healthz, webhook bodies, the
stored run request, the SSE stream)."""

from __future__ import annotations

from pathlib import Path

import httpx

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

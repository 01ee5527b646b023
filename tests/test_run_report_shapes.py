"""A run's report keeps its shape wherever it is read: ``stayer run --json`` and
``result.json``, ``stayer report --json``, ``stayer runs --json``, and the hosted runtime's
run, ledger and events, compared with snapshots taken before the report became a record
(tests/fixtures/shapes/, ``STAYER_WRITE_SHAPES=1`` writes them again)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from service_helpers import Env, copy_tasks, finished, read_events, start_server, wait_for
from test_doc_shapes import check
from test_eval_fixtures import EXAMPLES, needs_bwrap, stayer

SIM = "sim:claude-sonnet-4-5"
# Values that change from run to run besides those test_doc_shapes knows.
CHANGING = {
    "latency_s",
    "updated",
    "blob_bytes",
    "store",
    "sent_at",
    "created_at",
    "updated_at",
    "requested_at",
    "decided_at",
    "cache_expires_at",
    "at",
}


def steady(value: Any) -> Any:
    """``value`` with what changes from run to run (timings, clocks, sizes) replaced by its
    type's name."""
    if isinstance(value, dict):
        return {
            k: f"<{type(v).__name__}>" if k in CHANGING and v is not None else steady(v)
            for k, v in value.items()
        }
    if isinstance(value, list):
        return [steady(v) for v in value]
    return value


@needs_bwrap
def test_run_report_and_runs_json_keep_their_shape(tmp_path: Path) -> None:
    home = tmp_path / "home"
    r = stayer("run", str(EXAMPLES / "hello-file"), "--model", SIM, "--json", home=home)
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    check("run-stdout", steady(doc), tmp_path)
    written = json.loads((Path(doc["run_dir"]) / "result.json").read_text())
    assert written == doc
    r = stayer("report", "--last", "--json", home=home)
    assert r.returncode == 0, r.stderr
    check("report-json", steady(json.loads(r.stdout)), tmp_path)
    r = stayer("runs", "--json", home=home)
    assert r.returncode == 0, r.stderr
    check("runs-json", steady(json.loads(r.stdout)), tmp_path)


@needs_bwrap
def test_the_runtimes_run_ledger_and_events_keep_their_shape(tmp_path: Path) -> None:
    env = Env(tmp_path / "home")
    server = start_server(env, copy_tasks(tmp_path / "tasks", "hello-file"), "--workers", "1")
    try:
        key = env.tenant("acme")["api_key"]
        with server.client(key) as c:
            created = c.post("/v1/runs", json={"task": "hello-file", "model": SIM})
            assert created.status_code == 201, created.text
            run = wait_for(c, created.json()["id"], finished)
            check("runtime-run", steady(run), tmp_path)
            ledger = c.get(f"/v1/runs/{run['id']}/ledger").json()
            check("runtime-ledger", steady(ledger), tmp_path)
            listed = c.get("/v1/runs").json()
            check("runtime-runs", steady(listed), tmp_path)
            body = {"task": "hello-file", "model": SIM, "confirm_tools": ["bash"]}
            waiting = c.post("/v1/runs", json=body).json()["id"]
            run = wait_for(c, waiting, lambda r: r["status"] == "requires_action")
            check("runtime-pending-run", steady(run), tmp_path)
            decided = c.post(
                f"/v1/runs/{waiting}/actions", json={"call_id": "act-1", "decision": "reject"}
            )
            assert decided.status_code < 300, decided.text
            wait_for(c, waiting, finished)
            actions = c.get(f"/v1/runs/{waiting}/actions").json()
            check("runtime-actions", steady(actions), tmp_path)
            events = [e for e in read_events(c, waiting) if e["event"] == "requires_action"]
            check("runtime-requires-action", steady(events), tmp_path)
    finally:
        server.process.kill()

"""An MCP server's side effects under kill -9 (issue 39): a real server process
(tests/mcp_servers/tiny.py --count-dir) counts calls in a file outside the workspace; its
annotations say ``count_idem`` is idempotent and ``count_once`` is not. ``stayer run`` is
killed with SIGKILL while the server is inside a call (at a point the server signals, not
after a delay), and resumed with ``stayer resume``: every call is counted exactly once, or
the agent is told its outcome is unknown and it is counted at most once; the idempotent
call killed after counting is sent again with the same idempotency key (``_meta``), which
the server uses to count it once. Eagerly offered tools and ``--mcp-tools lazy`` (the call
goes through ``tool_search``), on SQLite and PostgreSQL (STAYER_TEST_PG).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
from pg_server import database_fixture
from test_effects_kill import kill_when_reached, unknown_labels

from stayer.journal import open_store

ROOT = Path(__file__).resolve().parent.parent
TINY = ROOT / "tests" / "mcp_servers" / "tiny.py"
#: (label, tool) of the run's calls, two per step.
CALLS = [("L1", "count_idem"), ("L2", "count_once"), ("L3", "count_once"), ("L4", "count_idem")]
#: Where each run is killed, in call order: the idempotent call after counting, the other
#: one after counting, then before.
KILLS = [("L1", "after"), ("L2", "after"), ("L3", "before")]

pg_url = database_fixture()


class Run:
    def __init__(self, root: Path, mode: str, db: str) -> None:
        self.root, self.mode, self.home = root, mode, root / "home"
        self.where = root / "outside"  # the counter, outside the workspace
        self.where.mkdir()
        self.env = {k: v for k, v in os.environ.items() if not k.endswith("_API_KEY")}
        self.env.update(STAYER_HOME=str(self.home), STAYER_DB=db, COLUMNS="80")
        self.task = self.make_task()
        self.trajectory = root / "trajectory.jsonl"
        lines = []
        for s in range(0, len(CALLS), 2):
            calls = [
                {"id": f"c{i + 1}", **self.call(tool, label)}
                for i, (label, tool) in enumerate(CALLS[s : s + 2], s)
            ]
            lines.append(json.dumps({"role": "assistant", "content": "", "tool_calls": calls}))
        self.trajectory.write_text("\n".join(lines) + "\n")

    def call(self, tool: str, label: str) -> dict:
        if self.mode == "lazy":
            args = {"call": f"t__{tool}", "arguments": {"label": label}}
            return {"name": "tool_search", "arguments": json.dumps(args)}
        return {"name": f"t__{tool}", "arguments": json.dumps({"label": label})}

    def make_task(self) -> Path:
        task = self.root / "task"
        shutil.copytree(ROOT / "examples" / "hello-file", task)
        toml = task / "task.toml"
        text = toml.read_text().replace("timeout_sec = 60.0", "timeout_sec = 3600.0")
        server = [sys.executable, str(TINY), f"--count-dir={self.where}"]
        toml.write_text(
            text + '\n[environment]\nsandbox = "local"\n\n[mcp.servers.t]\n'
            f'command = {json.dumps(server)}\ntrust = "host"\n'
        )
        return task

    def start(self, first: bool) -> subprocess.Popen:
        args = ["resume", "r1", "--json"]
        if first:
            args = [
                "run", str(self.task), "--model", "sim:gpt-5", "--json", "--run-id", "r1",
                "--sim-policy", f"replay:{self.trajectory}", "--mcp-tools", self.mode,
            ]  # fmt: skip
        return subprocess.Popen(
            [sys.executable, "-m", "stayer.cli", *args],
            env=self.env,
            cwd=self.root,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )

    def kill_at(self, first: bool, label: str, phase: str) -> None:
        """Run (or resume) until the server stops in the call ``label`` at ``phase``,
        then SIGKILL the run and the server."""
        (self.where / "plan").write_text(f"{label} {phase}\n")
        kill_when_reached(self.start(first), self.where, label, phase)

    def finish(self) -> dict:
        (self.where / "plan").unlink()
        proc = self.start(False)
        out, err = proc.communicate(timeout=300)
        assert proc.returncode in (0, 1), err  # hello-file's verifier fails this work: 1
        assert "Traceback" not in err, err
        return json.loads(out)

    def lines(self, name: str) -> list[tuple[str, str]]:
        path = self.where / name
        text = path.read_text() if path.exists() else ""
        return [(a, b) for a, b in (line.split() for line in text.splitlines())]

    def unknown(self) -> set[str]:
        return unknown_labels(self.home / "runs" / "r1" / "trajectory.jsonl", CALLS)


@pytest.mark.parametrize(
    ("mode", "backend"), [("eager", "sqlite"), ("lazy", "sqlite"), ("eager", "postgres")]
)
def test_a_killed_mcp_call_is_sent_once_or_reported_unknown(mode, backend, tmp_path, request):
    db = request.getfixturevalue("pg_url") if backend == "postgres" else ""
    run = Run(tmp_path, mode, db)
    for n, (label, phase) in enumerate(KILLS):
        run.kill_at(n == 0, label, phase)
    doc = run.finish()
    assert doc["steps"] == len(CALLS) // 2 + 1
    counted = Counter(label for label, _ in run.lines("counter"))
    received: dict[str, list[str]] = {}
    for label, key in run.lines("received"):
        received.setdefault(label, []).append(key)
    # L1 (idempotent) was killed after counting: sent again with the same key, counted once.
    # L2 and L3 (not idempotent) were killed after and before counting: never sent again,
    # the agent told the outcome is unknown. L4 was not killed: exactly once.
    assert counted == Counter({"L1": 1, "L2": 1, "L4": 1}), counted
    assert run.unknown() == {"L2", "L3"}
    assert {label: len(keys) for label, keys in received.items()} == {
        "L1": 2, "L2": 1, "L3": 1, "L4": 1,
    }  # fmt: skip
    keys = [k for ks in received.values() for k in ks]
    assert all(k.startswith("stayer-") for k in keys), received
    assert len(set(received["L1"])) == 1 and len(set(keys)) == len(CALLS), received
    # The run says it too: one outcome_unknown record per such call, in its journal, its
    # result, its ledger's tool calls and `stayer report`.
    store = open_store(run.home, db)
    try:
        records = [e.data for e in store.events("r1") if e.kind == "outcome_unknown"]
    finally:
        store.close()
    assert sorted((r["call_id"], r["tool"], r["idempotency_key"]) for r in records) == [
        ("c2", "t__count_once", received["L2"][0]),
        ("c3", "t__count_once", received["L3"][0]),
    ]
    assert doc["outcome_unknown"] == records
    in_ledger = {
        (e["step"], c["id"]) for e in doc["ledger"] for c in e["tool_calls"]
        if c.get("outcome") == "unknown"
    }  # fmt: skip
    assert in_ledger == {(r["step"], r["call_id"]) for r in records}
    shown = subprocess.run(
        [sys.executable, "-m", "stayer.cli", "report", "r1", "--json"],
        env=run.env, capture_output=True, text=True, check=True,
    )  # fmt: skip
    report = json.loads(shown.stdout)
    assert report["totals"]["outcome_unknown"] == 2 and report["outcome_unknown"] == records

"""Fault injection: a 40-step run killed with SIGKILL at random instants, then resumed.

Each of ``KILLS`` runs is started through the real command line and killed at an instant
drawn uniformly over the uninterrupted run's duration (measured from the moment the run is
in the journal), so kills land mid model call (``--sim-latency``), mid tool call, mid write
and between steps alike. After ``stayer resume`` every run must match the uninterrupted run:
status, reward, steps, final workspace content and per-step usage (apart from
``lost_in_flight`` entries), and the journal must hold each completed model call once.
Runs on SQLite and on PostgreSQL. Set ``STAYER_FAULT_SEED`` to replay a sequence of kills.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
import uuid
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from pg_server import database_fixture

from stayer.journal import open_store
from stayer.sandbox.locate import locate_bwrap

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "hello-file"
KILLS = 30
WORKERS = 4
RUN_ARGS = [
    "--model",
    "sim:claude-sonnet-4-5",
    "--max-steps",
    "50",
    "--json",
    "--sim-policy",
    "synthetic:steps=40,obs_tokens=60,out_tokens=30",
    "--sim-latency",
    "0.05",
]

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(locate_bwrap() is None, reason="bubblewrap not installed"),
]


pg_url = database_fixture()


def tree(path: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(path)): p.read_bytes() for p in sorted(path.rglob("*")) if p.is_file()
    }


def usage_by_step(doc: dict) -> list[tuple[int, dict]]:
    return [(e["step"], e["usage"]) for e in doc["ledger"] if e.get("kind") != "lost_in_flight"]


class Harness:
    def __init__(self, home: Path, db: str) -> None:
        self.home, self.db = home, db
        # The example with room for 40 steps on a loaded machine: the task's agent time
        # limit is enforced, and this suite is about kills, not time limits.
        self.task = home.parent / "task"
        shutil.copytree(EXAMPLE, self.task)
        toml = self.task / "task.toml"
        toml.write_text(
            toml.read_text().replace("[agent]\ntimeout_sec = 60.0", "[agent]\ntimeout_sec = 3600.0")
        )
        assert "3600.0" in toml.read_text()
        self.env = {k: v for k, v in os.environ.items() if not k.endswith("_API_KEY")}
        self.env.update(STAYER_HOME=str(home), STAYER_DB=db)

    def start(self, run_id: str, capture: bool = False) -> tuple[subprocess.Popen, float]:
        """Start ``stayer run``; returns it and the time its run appeared in the journal."""
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "stayer.cli",
                "run",
                str(self.task),
                *RUN_ARGS,
                "--run-id",
                run_id,
            ],
            env=self.env,
            cwd=self.home.parent,
            stdout=subprocess.PIPE if capture else subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            store = open_store(self.home, self.db, create=False)
            try:
                if store is not None and store.run(run_id) is not None:
                    return proc, time.monotonic()
            finally:
                if store is not None:
                    store.close()
            if proc.poll() is not None:
                raise AssertionError(f"run {run_id} exited before it was journaled")
            time.sleep(0.01)
        raise AssertionError(f"run {run_id} never appeared in the journal")

    def resume(self, run_id: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-m", "stayer.cli", "resume", run_id, "--json"],
            env=self.env,
            cwd=self.home.parent,
            capture_output=True,
            text=True,
            timeout=300,
        )

    def events(self, run_id: str) -> list:
        store = open_store(self.home, self.db)
        try:
            return store.events(run_id)
        finally:
            store.close()


def kill_and_resume(h: Harness, run_id: str, delay: float) -> dict:
    proc, registered = h.start(run_id)
    time.sleep(max(0.0, registered + delay - time.monotonic()))
    if proc.poll() is None:
        proc.send_signal(signal.SIGKILL)
    proc.wait()
    r = h.resume(run_id)
    assert "Traceback" not in r.stderr, r.stderr
    if "already finished" in r.stderr:  # the kill came after the run finished: its result
        assert r.returncode == 0, r.stderr
    else:
        assert r.returncode in (0, 1, 3), r.stderr
    return {"id": run_id, "delay": delay, "doc": json.loads(r.stdout), "rc": r.returncode}


@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
def test_sigkill_at_random_instants_then_resume(backend, tmp_path, request):
    db = request.getfixturevalue("pg_url") if backend == "postgres" else ""
    h = Harness(tmp_path / "home", db)
    seed = int(os.environ.get("STAYER_FAULT_SEED") or random.randrange(1 << 30))
    rng = random.Random(seed)
    tag = uuid.uuid4().hex[:6]

    base_id = f"base-{tag}"
    proc, registered = h.start(base_id, capture=True)
    out, _ = proc.communicate(timeout=300)
    duration = time.monotonic() - registered
    base = json.loads(out)
    assert base["steps"] == 41
    base_tree = tree(h.home / "runs" / base_id / "workspace")

    delays = [rng.uniform(0, duration * 1.05) for _ in range(KILLS)]
    with ThreadPoolExecutor(WORKERS) as pool:
        outcomes = list(
            pool.map(
                lambda a: kill_and_resume(h, *a), [(f"k{i}-{tag}", d) for i, d in enumerate(delays)]
            )
        )

    kinds = Counter()
    for o in outcomes:
        doc, where = o["doc"], f"seed {seed}, run {o['id']} killed after {o['delay']:.2f}s"
        assert (doc["status"], doc["reward"], doc["steps"]) == (
            base["status"],
            base["reward"],
            base["steps"],
        ), where
        assert usage_by_step(doc) == usage_by_step(base), where
        assert tree(h.home / "runs" / o["id"] / "workspace") == base_tree, where
        events = h.events(o["id"])
        finished = [e.data["n"] for e in events if e.kind == "model_finished"]
        assert finished == list(range(len(finished))) and len(finished) == base["steps"], where
        started = Counter(e.data["n"] for e in events if e.kind == "model_started")
        lost = [e for e in doc["ledger"] if e.get("kind") == "lost_in_flight"]
        # Every attempt that was started and never finished is in the ledger, once.
        assert sum(started.values()) - len(finished) == len(lost), where
        kinds[
            "after finish" if o["rc"] == 2 else "mid model call" if lost else "between calls"
        ] += 1
    print(f"\n{backend}: {KILLS} kills (seed {seed}) over a {duration:.1f}s run: {dict(kinds)}")
    assert kinds["mid model call"] >= 1 and kinds["between calls"] >= 1, (seed, kinds)

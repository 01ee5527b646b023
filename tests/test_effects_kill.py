"""Side effects that happen once, under kill -9: the property test of issue 39.

A run of six side-effecting calls, two per step, of three kinds: ``counter_idem``
(idempotent, passes its key on), ``counter_once`` (additive) and ``bash`` in a task that
allows the network (not restorable), each running tests/fixtures/effects/counter.py, which
appends to a counter file outside the workspace. The run is killed with SIGKILL at points
the counter itself signals (it stops before or after counting and waits to be killed), and
resumed with ``stayer resume``, three times per run, then resumed to its end. Every call
must be counted exactly once, or be reported to the agent as of unknown outcome and counted
at most once; the outcome of each call is known in advance and checked exactly. Runs
through the real command line (tests/fixtures/effects/driver.py adds the counting tools),
on SQLite and on PostgreSQL (STAYER_TEST_PG).
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

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = Path(__file__).resolve().parent / "fixtures" / "effects"
DRIVER, COUNTER = FIXTURES / "driver.py", FIXTURES / "counter.py"

#: (label, tool) of the run's calls, two per step: each kind comes first in a reply once
#: and second once (a second call is killed while the first's result is in no event yet).
CALLS = [
    ("L1", "counter_idem"),
    ("L2", "counter_once"),
    ("L3", "counter_once"),
    ("L4", "bash"),
    ("L5", "bash"),
    ("L6", "counter_idem"),
]
KILLS_PER_RUN = 3
UNKNOWN = "the outcome of this call is unknown"

pg_url = database_fixture()


def arguments(label: str, tool: str, where: Path) -> str:
    if tool == "bash":
        return json.dumps({"command": f"{sys.executable} {COUNTER} {where} {label} - once"})
    return json.dumps({"label": label})


class Chain:
    """One run, its kills and resumes, in its own STAYER_HOME-independent state dir."""

    def __init__(self, root: Path, name: str, task: Path, home: Path, db: str) -> None:
        self.name, self.task, self.home = name, task, home
        self.where = root / name
        self.where.mkdir()
        self.env = {k: v for k, v in os.environ.items() if not k.endswith("_API_KEY")}
        self.env.update(
            STAYER_HOME=str(home),
            STAYER_DB=db,
            STAYER_TEST_EFFECTS=str(self.where),
            PYTHONPATH=os.pathsep.join([str(ROOT), str(FIXTURES)]),
        )
        self.trajectory = self.where / "trajectory.jsonl"
        lines = []
        for s in range(0, len(CALLS), 2):
            calls = [
                {"id": f"c{i + 1}", "name": tool, "arguments": arguments(label, tool, self.where)}
                for i, (label, tool) in enumerate(CALLS[s : s + 2], s)
            ]
            lines.append(json.dumps({"role": "assistant", "content": "", "tool_calls": calls}))
        self.trajectory.write_text("\n".join(lines) + "\n")

    def start(self, *args: str) -> subprocess.Popen:
        return subprocess.Popen(
            [sys.executable, str(DRIVER), *args],
            env=self.env,
            cwd=self.home.parent,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )

    def command(self, first: bool) -> list[str]:
        if not first:
            return ["resume", self.name, "--json"]
        return [
            "run",
            str(self.task),
            "--model",
            "sim:gpt-5",
            "--json",
            "--sim-policy",
            f"replay:{self.trajectory}",
            "--run-id",
            self.name,
        ]

    def kill_at(self, first: bool, label: str, phase: str) -> None:
        """Run (or resume) until the counter stops at ``label``/``phase``, then kill -9
        the run and the stopped counter."""
        (self.where / "plan").write_text(f"{label} {phase}\n")
        kill_when_reached(self.start(*self.command(first)), self.where, label, phase, self.name)

    def finish(self) -> dict:
        (self.where / "plan").unlink(missing_ok=True)
        proc = self.start(*self.command(False))
        out, err = proc.communicate(timeout=300)
        assert proc.returncode in (0, 1), err  # hello-file's verifier fails this work: 1
        assert "Traceback" not in err, err
        return json.loads(out)

    def counted(self) -> Counter:
        counter = self.where / "counter"
        lines = counter.read_text().splitlines() if counter.exists() else []
        return Counter(line.split()[0] for line in lines)

    def unknown(self) -> set[str]:
        """Labels whose tool result told the agent the outcome is unknown."""
        return unknown_labels(self.home / "runs" / self.name / "trajectory.jsonl", CALLS)


def unknown_labels(trajectory: Path, calls: list[tuple[str, str]]) -> set[str]:
    """Labels of ``calls`` (call ``c1`` first) whose tool result in ``trajectory`` told
    the agent the outcome is unknown."""
    ids = {f"c{i + 1}": label for i, (label, _) in enumerate(calls)}
    out = set()
    for line in trajectory.read_text().splitlines():
        rec = json.loads(line)
        if rec["role"] == "tool" and UNKNOWN in rec["content"]:
            out.add(ids[rec["tool_call_id"]])
    return out


def kill_when_reached(
    proc: subprocess.Popen, where: Path, label: str, phase: str, name: str = "run"
) -> None:
    """Wait until the side effect stops at ``label``/``phase`` (it says so in
    ``where/reached``), then kill -9 ``proc`` and the stopped process."""
    reached = where / "reached"
    deadline = time.monotonic() + 300
    try:
        while not reached.exists():
            if proc.poll() is not None:
                _, err = proc.communicate()
                raise AssertionError(f"{name}: ended before {label} {phase}: {err}")
            assert time.monotonic() < deadline, f"{name}: {label} {phase} not reached"
            time.sleep(0.02)
    finally:
        proc.kill()  # SIGKILL
        proc.wait()
    pid, at, stopped = reached.read_text().split()
    assert (at, stopped) == (label, phase)
    # The stopped process holds the run's output pipes open: killed before reading them.
    os.kill(int(pid), signal.SIGKILL)
    proc.communicate()
    reached.unlink()


def plans(runs: int, seed: int) -> list[list[tuple[int, str]]]:
    """Per run, ``KILLS_PER_RUN`` kill points (call index, phase) in call order."""
    rng = random.Random(seed)
    out = []
    for _ in range(runs):
        points = sorted(rng.sample(range(len(CALLS)), KILLS_PER_RUN))
        out.append([(i, rng.choice(["before", "after"])) for i in points])
    return out


def make_task(root: Path) -> Path:
    task = root / "task"
    shutil.copytree(ROOT / "examples" / "hello-file", task)
    toml = task / "task.toml"
    text = toml.read_text().replace("timeout_sec = 60.0", "timeout_sec = 3600.0")
    toml.write_text(text + '\n[environment]\nallow_internet = true\nsandbox = "local"\n')
    return task


def run_chain(chain: Chain, plan: list[tuple[int, str]]) -> dict:
    for n, (i, phase) in enumerate(plan):
        chain.kill_at(n == 0, CALLS[i][0], phase)
    doc = chain.finish()
    return {"chain": chain, "plan": plan, "doc": doc}


def check(outcome: dict, where: str) -> Counter:
    """Assert the exact outcome of every call of one run; returns what happened by kind."""
    chain, plan = outcome["chain"], outcome["plan"]
    counted, unknown = chain.counted(), chain.unknown()
    killed = {CALLS[i][0]: (CALLS[i][1], phase) for i, phase in plan}
    seen: Counter = Counter()
    for label, tool in CALLS:
        # The property: never a silent duplicate; unknown only with at most one count.
        assert counted[label] <= 1, f"{where}: {label} ({tool}) counted {counted[label]} times"
        if label in unknown:
            assert counted[label] <= 1, where
        else:
            assert counted[label] == 1, f"{where}: {label} counted {counted[label]} times"
        # What the rules say must happen, exactly.
        if label not in killed:
            assert label not in unknown, f"{where}: {label} said unknown, not killed"
            seen["not killed: exactly once"] += 1
            continue
        _, phase = killed[label]
        if tool == "counter_idem":
            assert label not in unknown, f"{where}: idempotent {label} not re-sent"
            seen[f"idempotent, killed {phase}: re-sent, exactly once"] += 1
        else:
            assert label in unknown, f"{where}: {label} ({tool}) killed {phase}, not unknown"
            assert counted[label] == (phase == "after"), where
            seen[f"{tool}, killed {phase}: unknown, counted {counted[label]}"] += 1
    assert outcome["doc"]["steps"] == len(CALLS) // 2 + 1, where
    return seen


def property_run(
    tmp_path: Path, db: str, todo: list[list[tuple[int, str]]], workers: int, label: str
) -> Counter:
    home = tmp_path / "home"
    home.mkdir()
    # Created before the runs start together: two processes creating one SQLite database
    # at once can find it locked (a race of its own, not this test's subject).
    open_store(home, db).close()
    task = make_task(tmp_path)
    runs = len(todo)
    # Run ids of this call only: the module's tests share one PostgreSQL database.
    tag = uuid.uuid4().hex[:8]
    chains = [Chain(tmp_path, f"e{n}-{tag}", task, home, db) for n in range(runs)]
    with ThreadPoolExecutor(workers) as pool:
        outcomes = list(pool.map(run_chain, chains, todo))
    total: Counter = Counter()
    for n, o in enumerate(outcomes):
        total += check(o, f"{label}, run e{n}, kills {o['plan']}")
    kills = sum(len(p) for p in todo)
    print(f"\n{label}: {kills} kills over {runs} runs:")
    for what, n in sorted(total.items()):
        print(f"  {n:3d} {what}")
    assert kills == runs * KILLS_PER_RUN
    return total


@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
def test_a_killed_side_effecting_call_is_never_repeated_silently(backend, tmp_path, request):
    """Three kills of one run: the quick form of the property test below. An additive
    call killed after counting, a bash call killed before, an idempotent one after."""
    db = request.getfixturevalue("pg_url") if backend == "postgres" else ""
    property_run(tmp_path, db, [[(1, "after"), (3, "before"), (5, "after")]], 1, backend)


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
def test_fifty_kills_during_side_effecting_calls(backend, tmp_path, request):
    """Issue 39's property: 51 kills (17 runs × 3), each resumed; 0 silent duplicates.
    ``STAYER_FAULT_SEED`` draws other kill points."""
    db = request.getfixturevalue("pg_url") if backend == "postgres" else ""
    seed = int(os.environ.get("STAYER_FAULT_SEED") or 39)
    todo = plans(17, seed)
    # every kind of call is killed at both points, first and second in its reply
    assert {(CALLS[i][1], phase) for p in todo for i, phase in p} == {
        (tool, phase) for _, tool in CALLS for phase in ("before", "after")
    }
    property_run(tmp_path, db, todo, 2, f"{backend} (seed {seed})")

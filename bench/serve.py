"""The runtime under load: runs/min, API latency, event delivery lag, streams that resume.

    python bench/serve.py [--runs 200] [--workers 2] [--concurrency 8] [--latency 0.2]
                          [--postgres URL] [--json]

One ``stayer serve --workers 0`` (the API) and ``--workers`` separate ``stayer worker``
processes with ``--concurrency`` slots each share one journal (SQLite in a temporary
``STAYER_HOME``, or the PostgreSQL database ``--postgres`` names: give it an empty one).
Two tenants submit ``--runs`` runs of ``examples/fix-median`` on ``sim:claude-sonnet-4-5``
with ``--latency`` seconds per model call (the oracle solves it in a few steps, each tool
call in the real bwrap sandbox, and the verifier runs). While they run:

* a poller times ``GET /v1/runs/{id}`` on random submitted runs (API latency);
* ``--followers`` clients follow runs' event streams live; each event's delivery lag is the
  time it reached the client minus the time the worker journaled it (its ``at``: the same
  machine's clock);
* ``--reconnects`` clients each drop their stream after a few events and reconnect with
  ``Last-Event-ID``, and their events are compared, once the run ended, with one full read
  of the stream: lost and repeated events are counted (both must be 0).

Runs/min is measured from the first submission to the last final status. Targets (issue
15): p99 API < 50 ms and p99 event lag < 250 ms on this machine.

The journal under that load (issue 20): ``bench/journal.py``'s workload (``--journal-steps``
steps with ``--journal-obs-tokens``-token observations), stayer's journal beside LangGraph's
SqliteSaver, is timed in separate processes in rounds, first with the service idle (its
processes up, no runs), then over and over while the load runs. With ``--postgres`` the
journal writes into the database the workers share; with SQLite into a file of its own
(SQLite serialises writers per file, so sharing one would time the lock, not the journal).
Each side's figure is its journaling time per step (measured inside the journal and inside
the saver), min and median over the rounds.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any

from _stdout import json_only  # bench/: --json prints one document on stdout

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from stayer.runtime.client import TERMINAL, Client, SseEvent  # noqa: E402


def pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))], 3)


def summary(values: list[float]) -> dict[str, Any]:
    return {
        "n": len(values),
        "min": round(min(values), 3) if values else None,
        "p50": pct(values, 0.5),
        "p99": pct(values, 0.99),
        "max": pct(values, 1.0),
        "median": round(statistics.median(values), 3) if values else None,
    }


def stayer(env: dict[str, str], *args: str, log: Path | None = None) -> subprocess.Popen[bytes]:
    out = log.open("wb") if log else subprocess.DEVNULL
    return subprocess.Popen(
        [sys.executable, "-m", "stayer.cli", *args], env=env, stdout=out, stderr=subprocess.STDOUT
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=200)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--latency", type=float, default=0.2)
    ap.add_argument("--followers", type=int, default=20)
    ap.add_argument("--reconnects", type=int, default=20)
    ap.add_argument(
        "--postgres", default="", help="postgresql://… of an empty database (default: SQLite)"
    )
    ap.add_argument(
        "--journal-steps",
        type=int,
        default=40,
        help="steps of the journal workload timed idle and under load (0: not timed)",
    )
    ap.add_argument("--journal-obs-tokens", type=int, default=5000)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    emit = json_only(args.json)

    work = Path(tempfile.mkdtemp(prefix="stayer-bench-serve-"))
    tasks = work / "tasks"
    shutil.copytree(ROOT / "examples" / "fix-median", tasks / "fix-median", symlinks=True)
    env = {**os.environ, "STAYER_HOME": str(work / "home"), "PYTHONPATH": str(ROOT)}
    env.pop("STAYER_DB", None)
    if args.postgres:
        env["STAYER_DB"] = args.postgres
    procs: list[subprocess.Popen[bytes]] = []
    try:
        keys = []
        for tenant in ("team-a", "team-b"):
            out = subprocess.run(
                [sys.executable, "-m", "stayer.cli", "tenants", "create", tenant, "--json"],
                env=env,
                capture_output=True,
                text=True,
                check=True,
            )
            keys.append(json.loads(out.stdout)["api_key"])
        port = _free_port()
        procs.append(
            stayer(
                env,
                "serve",
                "--port",
                str(port),
                "--workers",
                "0",
                "--tasks-dir",
                str(tasks),
                log=work / "serve.log",
            )
        )
        base = f"http://127.0.0.1:{port}"
        _wait_healthy(base)
        for i in range(args.workers):
            procs.append(
                stayer(
                    env,
                    "worker",
                    "--concurrency",
                    str(args.concurrency),
                    "--tasks-dir",
                    str(tasks),
                    log=work / f"worker-{i}.log",
                )
            )
        journal = JournalRounds(args, work)
        idle = journal.idle()
        result = run_load(base, keys, args, beside=journal.until)
        result["journal"] = journal.summary(idle)
        result.update(
            {
                "backend": "postgres" if args.postgres else "sqlite",
                "workers": args.workers,
                "concurrency": args.concurrency,
                "sim_latency_s": args.latency,
                "load_before_and_after": result.pop("load"),
                "cores": os.cpu_count(),
            }
        )
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            try:
                p.wait(timeout=60)
            except subprocess.TimeoutExpired:
                p.kill()
        shutil.rmtree(work, ignore_errors=True)
    if args.json:
        emit(result)
    else:
        for k, v in result.items():
            print(f"{k:>24}: {v}")


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait_healthy(base: str) -> None:
    import httpx

    for _ in range(600):
        try:
            if httpx.get(f"{base}/healthz", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise SystemExit("stayer serve did not start")


class JournalRounds:
    """``bench/journal.py`` runs, one process each, idle and beside the load."""

    def __init__(self, args: argparse.Namespace, work: Path) -> None:
        self.args, self.work = args, work
        self.loaded: list[dict[str, Any]] = []

    def round(self) -> dict[str, Any] | None:
        """stayer's journal in the shared store beside SqliteSaver, then (with PostgreSQL)
        stayer's journal in SQLite alone, the store SqliteSaver is measured in."""
        if not self.args.journal_steps:
            return None
        argv = [sys.executable, str(ROOT / "bench" / "journal.py"), "--json", "--repeat", "1"]
        argv += ["--steps", str(self.args.journal_steps)]
        argv += ["--obs-tokens", str(self.args.journal_obs_tokens)]
        out = self._run([*argv, "--store", self.args.postgres] if self.args.postgres else argv)
        if self.args.postgres:
            out["stayer_sqlite"] = self._run([*argv, "--no-langgraph"])["stayer"]
        return out

    def _run(self, argv: list[str]) -> dict[str, Any]:
        r = subprocess.run(argv, capture_output=True, text=True, cwd=self.work)
        if r.returncode != 0:
            raise SystemExit(f"bench/journal.py failed: {r.stderr.strip()[-500:]}")
        return json.loads(r.stdout)

    def idle(self, rounds: int = 3) -> list[dict[str, Any]]:
        return [r for _ in range(rounds) if (r := self.round()) is not None]

    def until(self, done: threading.Event) -> None:
        while not done.is_set() and (r := self.round()) is not None:
            self.loaded.append(r)

    def summary(self, idle: list[dict[str, Any]]) -> dict[str, Any] | None:
        if not self.args.journal_steps:
            return None

        def side(rounds: list[dict[str, Any]], name: str) -> dict[str, Any]:
            ms = [r[name]["journal_s_per_step"] * 1000 for r in rounds if r.get(name)]
            return summary(ms)

        out: dict[str, Any] = {
            "steps": self.args.journal_steps,
            "obs_tokens": self.args.journal_obs_tokens,
            "store": "postgres" if self.args.postgres else "sqlite (own file)",
        }
        for when, rounds in (("idle", idle), ("under_load", self.loaded)):
            ours, theirs = side(rounds, "stayer"), side(rounds, "langgraph")
            out[when] = {
                "rounds": len(rounds),
                "stayer_ms_per_step": ours,
                "stayer_sqlite_ms_per_step": side(rounds, "stayer_sqlite")
                if self.args.postgres
                else ours,
                "langgraph_sqlitesaver_ms_per_step": theirs,
                "langgraph_over_stayer_median": (
                    round(theirs["p50"] / ours["p50"], 1)
                    if ours.get("p50") and theirs.get("p50")
                    else None
                ),
            }
        return out


def run_load(
    base: str,
    keys: list[str],
    args: argparse.Namespace,
    beside: Callable[[threading.Event], None] | None = None,
) -> dict[str, Any]:
    """Submit the runs and measure; ``beside(done)`` runs in a thread meanwhile, until
    ``done`` is set."""
    load_before = os.getloadavg()
    clients = [Client(base, k) for k in keys]
    submitted: list[tuple[int, str]] = []
    lock = threading.Lock()
    done = threading.Event()
    get_ms: list[float] = []
    lag_ms: list[float] = []
    problems = {"lost": 0, "repeated": 0, "out_of_order": 0}

    def poll() -> None:
        rng = random.Random(1)
        with Client(base, keys[0]) as c0, Client(base, keys[1]) as c1:
            mine = (c0, c1)
            while not done.is_set():
                with lock:
                    if not submitted:
                        time.sleep(0.01)
                        continue
                    who, run_id = rng.choice(submitted)
                t0 = time.perf_counter()
                mine[who].run(run_id)
                get_ms.append((time.perf_counter() - t0) * 1000)
                time.sleep(0.005)

    def follow(who: int, run_id: str) -> None:
        with Client(base, keys[who]) as c:
            last = -1
            for event in c.events(run_id):
                received = time.time()
                at = event.data.get("at")
                if at:
                    lag_ms.append((received - datetime.fromisoformat(at).timestamp()) * 1000)
                if int(event.id) <= last:
                    problems["out_of_order"] += 1
                last = int(event.id)

    def reconnecting(who: int, run_id: str, seed: int) -> None:
        rng = random.Random(seed)
        got: list[SseEvent] = []
        with Client(base, keys[who]) as c:
            last: str | None = None
            while True:
                n, ended = rng.randint(1, 4), True
                for event in c.events(run_id, last):
                    got.append(event)
                    last = event.id
                    n -= 1
                    if n == 0:
                        ended = False
                        break  # drop the connection mid-stream
                if ended:
                    break
            full = list(c.events(run_id))
        ids = [int(e.id) for e in got]
        want = [int(e.id) for e in full]
        problems["repeated"] += len(ids) - len(set(ids))
        problems["lost"] += len(set(want) - set(ids))
        problems["out_of_order"] += int(ids != sorted(ids))

    poller = threading.Thread(target=poll, daemon=True)
    poller.start()
    extra = threading.Thread(target=beside, args=(done,), daemon=True) if beside else None
    if extra is not None:
        extra.start()
    watchers: list[threading.Thread] = []
    started = time.perf_counter()
    for i in range(args.runs):
        who = i % 2
        run = clients[who].create_run(
            task="fix-median", model="sim:claude-sonnet-4-5", sim_latency=args.latency
        )
        with lock:
            submitted.append((who, run.id))
        if i < args.followers:
            watchers.append(threading.Thread(target=follow, args=(who, run.id), daemon=True))
        elif i < args.followers + args.reconnects:
            watchers.append(
                threading.Thread(target=reconnecting, args=(who, run.id, i), daemon=True)
            )
        else:
            continue
        watchers[-1].start()
    statuses: dict[str, int] = {}
    for who, run_id in submitted:
        final = clients[who].wait(run_id, poll_s=0.5)
        statuses[final.status] = statuses.get(final.status, 0) + 1
    wall = time.perf_counter() - started
    done.set()
    for t in watchers:
        t.join(timeout=120)
    poller.join(timeout=10)
    if extra is not None:
        extra.join()  # its round in progress ends on its own
    for c in clients:
        c.close()
    assert set(statuses) <= TERMINAL
    return {
        "runs": args.runs,
        "statuses": statuses,
        "wall_s": round(wall, 1),
        "runs_per_min": round(args.runs / wall * 60, 1),
        "api_get_run_ms": summary(get_ms),
        "event_lag_ms": summary(lag_ms),
        "stream_reconnects": {"clients": args.reconnects, **problems},
        "load": [load_before, os.getloadavg()],
    }


if __name__ == "__main__":
    main()

"""The hosted runtime under faults: what a crash, a stall, a database restart or a drain
costs in runs, money and connections (issue 34).

    python bench/faults.py [--runs 48] [--steps 16] [--latency 0.25] [--lease-ttl 3]
                           [--concurrency 4] [--json]

Starts a throwaway PostgreSQL server (``tests/pg_server.py``) on loopback, then on its
empty database, all at once, ``stayer serve --workers 0`` and three ``stayer worker``
processes (the first in a UTS namespace of its own: another host name, as a worker on
another machine looks), then submits ``--runs`` runs of ``examples/hello-file`` on
``sim:claude-sonnet-4-5`` (the synthetic policy: ``--steps`` steps and a submit, each in
the bwrap sandbox; every run ends ``failed`` when nothing goes wrong) for one tenant with
a budget, each run with its own cap held from it. While they run, bursts of 60 clients
read the API every few seconds and the database's connections are sampled, and, in turn:

* the "other host" worker is SIGKILLed (a replacement starts);
* a worker is SIGSTOPped for ``--stall`` seconds (past its lease) and then continued;
* PostgreSQL is restarted (immediate stop, start on the same port), a burst meanwhile;
* a worker is sent SIGTERM with ``--drain-timeout`` (a replacement starts).

Reported: runs lost (not finished) or failed by a fault (any end but the uninterrupted
one: ``failed`` at ``--steps`` + 1 steps), holds leaked (the tenant's held budget once
every run ended), model calls paid twice (a call the journal holds as answered that was
issued again) and calls billed but not on the ledger (journal calls against the ledger),
API answers by status (503 while the database is away is expected; 500 never), the most
database connections (in all, and per process: ``application_name``), workers that died, and
the drained worker's exit code and time. ``--json`` prints exactly one JSON document.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from decimal import Decimal
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

import httpx  # noqa: E402
from _stdout import json_only  # noqa: E402  (bench/: --json prints one document)

TERMINAL = {"succeeded", "failed", "budget_exhausted", "cancelled", "error"}
SIM = "sim:claude-sonnet-4-5"
HANG_S = 300.0  # the bench gives up on a condition after this long


def log(msg: str) -> None:
    print(f"[faults {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def get_json(c: httpx.Client, path: str) -> Any:
    """GET ``path``, waiting out 503s (the database restarting)."""
    deadline = time.monotonic() + HANG_S
    while True:
        r = c.get(path)
        if r.status_code != 503 or time.monotonic() > deadline:
            r.raise_for_status()
            return r.json()
        time.sleep(0.5)


def until(what: str, done: Any, limit: float = HANG_S) -> Any:
    deadline = time.monotonic() + limit
    while True:
        value = done()
        if value:
            return value
        if time.monotonic() > deadline:
            raise SystemExit(f"bench/faults.py: {what}: not within {limit:.0f} s")
        time.sleep(0.1)


class Bench:
    def __init__(self, args: argparse.Namespace, work: Path) -> None:
        self.args, self.work = args, work
        self.tasks = work / "tasks"
        shutil.copytree(ROOT / "examples" / "hello-file", self.tasks / "hello-file", symlinks=True)
        self.pg_dir = work / "pg"
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.statuses: Counter[int] = Counter()
        self.connections: dict[str, int] = {}
        self.connections_total = 0
        self.stop = threading.Event()
        self.events: list[dict[str, Any]] = []

    # --- processes --------------------------------------------------------------------

    def env(self, app: str) -> dict[str, str]:
        env = {
            **os.environ,
            "STAYER_HOME": str(self.work / "home"),
            "STAYER_DB": self.db_url,
            "PYTHONPATH": str(ROOT),
            "PYTHONUNBUFFERED": "1",
            "PGAPPNAME": app,  # libpq's application_name: connections counted per kind
        }
        return env

    def spawn(self, name: str, args: list[str], *, other_host: bool = False) -> None:
        argv = [sys.executable, "-m", "stayer.cli", *args]
        if other_host:  # its own host name: nothing of it is provably dead from here
            argv = [
                "unshare",
                "--uts",
                "--",
                "sh",
                "-c",
                'hostname stayer-other-host && exec "$@"',
                "sh",
                *argv,
            ]
        out = (self.work / f"{name}.log").open("wb")
        self.procs[name] = subprocess.Popen(
            argv, env=self.env(name), stdout=out, stderr=subprocess.STDOUT
        )

    def worker(self, name: str, *, other_host: bool = False) -> None:
        self.spawn(
            name,
            [
                "worker",
                "--tasks-dir",
                str(self.tasks),
                "--concurrency",
                str(self.args.concurrency),
                "--lease-ttl",
                str(self.args.lease_ttl),
                "--drain-timeout",
                str(self.args.drain_timeout),
            ],
            other_host=other_host,
        )

    def cli(self, *args: str) -> dict[str, Any]:
        r = subprocess.run(
            [sys.executable, "-m", "stayer.cli", *args, "--json"],
            env=self.env("stayer-cli"),
            capture_output=True,
            text=True,
            timeout=120,
        )
        if r.returncode != 0:
            raise SystemExit(f"stayer {' '.join(args)}: {r.stderr.strip()[-400:]}")
        doc: dict[str, Any] = json.loads(r.stdout)
        return doc

    # --- observers --------------------------------------------------------------------

    def sample_connections(self) -> None:
        import psycopg

        while not self.stop.is_set():
            try:
                with psycopg.connect(self.db_url, autocommit=True, connect_timeout=3) as conn:
                    while not self.stop.is_set():
                        rows = conn.execute(
                            "SELECT application_name, count(*) FROM pg_stat_activity "
                            "WHERE datname = current_database() AND pid <> pg_backend_pid() "
                            "GROUP BY application_name"
                        ).fetchall()
                        total = 0
                        for app, n in rows:
                            self.connections[app] = max(self.connections.get(app, 0), int(n))
                            total += int(n)
                        self.connections_total = max(self.connections_total, total)
                        time.sleep(0.25)
            except psycopg.Error:
                time.sleep(0.25)  # the database is restarting

    def bursts(self, base: str, key: str) -> None:
        while not self.stop.wait(self.args.burst_every):
            self.burst(base, key)

    def burst(self, base: str, key: str) -> None:
        """60 clients at once, three requests each."""

        def client() -> None:
            with httpx.Client(
                base_url=base, headers={"Authorization": f"Bearer {key}"}, timeout=60
            ) as c:
                for path in ("/v1/runs", "/healthz", "/v1/runs?limit=5"):
                    try:
                        self.statuses[c.get(path).status_code] += 1
                    except httpx.HTTPError:
                        self.statuses[0] += 1

        threads = [threading.Thread(target=client) for _ in range(60)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()

    # --- the run ------------------------------------------------------------------------

    def main(self) -> dict[str, Any]:
        from pg_server import _fresh_database, start

        args = self.args
        self.pg_url = start(self.pg_dir)
        self.pg_port = int(self.pg_url.split(":")[2].split("/")[0])
        self.db_url = _fresh_database(self.pg_url)
        port = free_port()
        base = f"http://127.0.0.1:{port}"
        # Everything at once on the empty database.
        self.spawn(
            "serve",
            ["serve", "--port", str(port), "--workers", "0", "--tasks-dir", str(self.tasks)],
        )
        self.worker("worker1", other_host=True)
        self.worker("worker2")
        self.worker("worker3")
        started = self.statuses_during_start(base)
        tenant = self.cli("tenants", "create", "faults", "--max-cost", "100")
        key = self.key = tenant["api_key"]
        self.base = base
        threading.Thread(target=self.sample_connections, daemon=True).start()
        body = {
            "task": "hello-file",
            "model": SIM,
            "sim_policy": f"synthetic:steps={args.steps},obs_tokens=200,out_tokens=30",
            "max_steps": args.steps + 10,
            "sim_latency": args.latency,
            "max_cost": "0.5",
        }
        t0 = time.monotonic()
        with httpx.Client(
            base_url=base, headers={"Authorization": f"Bearer {key}"}, timeout=60
        ) as c:
            ids = [c.post("/v1/runs", json=body).json()["id"] for _ in range(args.runs)]
            threading.Thread(target=self.bursts, args=(base, key), daemon=True).start()
            self.faults(c, ids)
            log("waiting for every run to end")
            deadline = time.monotonic() + HANG_S
            runs: list[dict[str, Any]] = []
            while time.monotonic() < deadline:
                runs = [get_json(c, f"/v1/runs/{i}") for i in ids]
                if all(r.get("status") in TERMINAL for r in runs):
                    break
                time.sleep(1.0)
            elapsed = time.monotonic() - t0
            ledgers: dict[str, list[dict[str, Any]]] = {}
            unreadable = []
            for i in ids:
                try:
                    ledgers[i] = get_json(c, f"/v1/runs/{i}/ledger")["ledger"]
                except httpx.HTTPStatusError as e:  # a journal the fault damaged
                    unreadable.append({"id": i, "answer": e.response.text[:300]})
        self.stop.set()
        account = [t for t in self.cli("tenants", "list")["tenants"] if t["tenant"] == "faults"][0]
        calls = self.journal_calls(ids, ledgers)
        by_status = Counter(r.get("status") for r in runs)
        failed_by_fault = [
            r["id"]
            for r in runs
            if r.get("status") in TERMINAL
            and (r["status"] != "failed" or r["steps"] != args.steps + 1)
        ]
        lost = [r["id"] for r in runs if r.get("status") not in TERMINAL]
        dead = {
            n: p.returncode
            for n, p in self.procs.items()
            if p.poll() is not None and n not in ("worker1", "worker3")
        }
        return {
            "runs": args.runs,
            "steps_per_run": args.steps + 1,
            "runs_by_status": dict(by_status),
            "runs_lost": len(lost),
            "runs_failed_by_fault": len(failed_by_fault),
            "failed_runs": [
                {k: r.get(k) for k in ("id", "status", "steps", "error")}
                for r in runs
                if r["id"] in failed_by_fault
            ][:5],
            "journals_unreadable": len(unreadable),
            "unreadable": unreadable[:3],
            "holds_leaked_usd": account["reserved_usd"],
            "tenant_spent_usd": account["spent_usd"],
            "runs_cost_usd": str(sum((Decimal(r.get("cost_usd", "0")) for r in runs), Decimal(0))),
            **calls,
            "api_answers": {str(k): v for k, v in sorted(self.statuses.items())},
            "api_500s": sum(v for k, v in self.statuses.items() if k >= 500 and k != 503),
            "start_together": started,
            "max_db_connections": self.connections_total,
            "max_db_connections_by_process": dict(sorted(self.connections.items())),
            "pool_per_process": int(os.environ.get("STAYER_DB_POOL", "10")),
            "processes_died": dead,
            "faults": self.events,
            "seconds": round(elapsed, 1),
            "lease_ttl_s": args.lease_ttl,
            "drain_timeout_s": args.drain_timeout,
            "sim_latency_s": args.latency,
            "load": os.getloadavg()[0],
            "cores": os.cpu_count(),
        }

    def statuses_during_start(self, base: str) -> dict[str, Any]:
        """The API's first answers while the workers create their tables beside it."""
        answers: Counter[int] = Counter()

        def up() -> bool:
            try:
                r = httpx.get(f"{base}/healthz", timeout=5)
            except httpx.HTTPError:
                return False
            answers[r.status_code] += 1
            return r.status_code == 200

        until("stayer serve answers", up)
        for _ in range(3):
            with httpx.Client(base_url=base, timeout=60) as c:
                answers[c.get("/v1/runs").status_code] += 1  # 401: no key, but the store read
        # Each worker prints its banner once its tables are open.
        for name in ("worker1", "worker2", "worker3"):
            until(
                f"{name} starts",
                lambda n=name: (
                    self.procs[n].poll() is not None
                    or "slot(s)" in (self.work / f"{n}.log").read_text(errors="replace")
                ),
            )
        died = {n: p.returncode for n, p in self.procs.items() if p.poll() is not None}
        return {"workers": 3, "died": died, "api_answers": dict(answers)}

    def faults(self, c: httpx.Client, ids: list[str]) -> None:
        args = self.args

        def steps_done() -> int:
            return sum(run["steps"] for run in get_json(c, "/v1/runs?limit=200")["data"])

        def progress(more: int = 20) -> None:
            start = steps_done()
            until("the runs go on", lambda: steps_done() >= start + more)

        def note(what: str, **more: Any) -> None:
            self.events.append({"fault": what, "at_steps": steps_done(), **more})
            log(what)

        until("the runs are under way", lambda: steps_done() >= 2 * args.concurrency)
        note("SIGKILL worker1 (other host)")
        self.procs["worker1"].kill()
        self.procs["worker1"].wait()
        self.worker("worker4")
        progress()

        note("SIGSTOP worker2", seconds=args.stall)
        self.procs["worker2"].send_signal(signal.SIGSTOP)
        time.sleep(args.stall)  # the stall is the fault: past its lease
        self.procs["worker2"].send_signal(signal.SIGCONT)
        progress()

        from pg_server import start, stop

        note("PostgreSQL restart")
        t = time.monotonic()
        stop(self.pg_dir)
        burst = threading.Thread(target=self.burst, args=(self.base, self.key))
        burst.start()  # clients while it is away
        start(self.pg_dir, port=self.pg_port)
        self.events[-1]["down_s"] = round(time.monotonic() - t, 2)
        burst.join()
        progress()

        note("SIGTERM worker3 (drain)")
        t = time.monotonic()
        self.procs["worker3"].send_signal(signal.SIGTERM)
        try:
            code = self.procs["worker3"].wait(timeout=args.drain_timeout + 60)
        except subprocess.TimeoutExpired:
            code = None
        self.events[-1].update(exit_code=code, exit_s=round(time.monotonic() - t, 2))
        self.worker("worker5")

    def journal_calls(
        self, ids: list[str], ledgers: dict[str, list[dict[str, Any]]]
    ) -> dict[str, Any]:
        """Model calls as the journal holds them, against the ledger."""
        import psycopg

        issued = answered_twice = answered = lost = resumed = 0
        with psycopg.connect(self.db_url, autocommit=True) as conn:
            for run_id in ids:
                rows = conn.execute(
                    "SELECT kind, data FROM stayer_events WHERE run_id = %s AND kind IN "
                    "('model_started', 'model_finished', 'model_lost', 'resumed')",
                    (run_id,),
                ).fetchall()
                finished: Counter[tuple[str, int]] = Counter()
                for kind, data in rows:
                    d = json.loads(data)
                    if kind == "resumed":
                        resumed += 1
                        continue
                    who = (d.get("agent") or "main", int(d["n"]))
                    if kind == "model_started":
                        issued += 1
                    elif kind == "model_finished":
                        finished[who] += 1
                    else:
                        lost += 1
                answered += len(finished)
                answered_twice += sum(n - 1 for n in finished.values())
        on_ledger = sum(
            1 for entries in ledgers.values() for e in entries if e.get("kind") != "lost_in_flight"
        )
        lost_on_ledger = sum(
            1 for entries in ledgers.values() for e in entries if e.get("kind") == "lost_in_flight"
        )
        return {
            "resumes": resumed,
            "calls_issued": issued,
            "calls_answered": answered,
            "calls_paid_twice": answered_twice,
            "calls_lost_in_flight": lost,
            "calls_lost_in_flight_on_ledger": lost_on_ledger,
            "ledger_steps": on_ledger,
            "calls_billed_not_on_ledger": issued - answered_twice - answered - lost,
        }

    def close(self) -> None:
        from pg_server import stop

        self.stop.set()
        for p in self.procs.values():
            if p.poll() is None:
                p.send_signal(signal.SIGCONT)
                p.terminate()
        for p in self.procs.values():
            try:
                p.wait(timeout=60)
            except subprocess.TimeoutExpired:
                p.kill()
        stop(self.pg_dir)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=48)
    ap.add_argument("--steps", type=int, default=16)
    ap.add_argument("--latency", type=float, default=0.25)
    ap.add_argument("--concurrency", type=int, default=4)
    ap.add_argument("--lease-ttl", type=float, default=3.0)
    ap.add_argument("--drain-timeout", type=float, default=8.0)
    ap.add_argument("--stall", type=float, default=10.0, help="seconds worker2 is stopped")
    ap.add_argument("--burst-every", type=float, default=6.0)
    ap.add_argument("--keep", action="store_true", help="keep the work directory (logs)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    emit = json_only(args.json)
    work = Path(tempfile.mkdtemp(prefix="stayer-bench-faults-"))
    os.chmod(work, 0o755)  # the PostgreSQL server's user reaches its directory under it
    bench = Bench(args, work)
    try:
        result = bench.main()
    finally:
        bench.close()
        if args.keep:
            log(f"logs in {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)
    if args.json:
        emit(result)
    else:
        for k, v in result.items():
            print(f"{k:>32}: {v}")


if __name__ == "__main__":
    main()

"""Live ``stayer serve`` / ``stayer worker`` processes for the runtime tests.

Each process is a real subprocess on a free loopback port with its own ``STAYER_HOME``
(and ``STAYER_DB`` when the test runs on PostgreSQL). Waits are bounded only to turn a
hang into a failure; nothing asserts on how long anything took.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from stayer.runtime.client import iter_sse

ROOT = Path(__file__).resolve().parent.parent
HANG_S = 240.0  # a wait longer than this is a hang, not slowness


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def copy_tasks(dest: Path, *names: str) -> Path:
    dest.mkdir(parents=True, exist_ok=True)
    for name in names:
        shutil.copytree(ROOT / "examples" / name, dest / name, symlinks=True)
    return dest


@dataclass
class Env:
    home: Path
    db_url: str = ""

    def vars(self) -> dict[str, str]:
        env = {
            **os.environ,
            "STAYER_HOME": str(self.home),
            "PYTHONPATH": str(ROOT),
            "PYTHONUNBUFFERED": "1",
        }
        env.pop("STAYER_DB", None)
        if self.db_url:
            env["STAYER_DB"] = self.db_url
        return env

    def cli(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        r = subprocess.run(
            [sys.executable, "-m", "stayer.cli", *args],
            env=self.vars(),
            capture_output=True,
            text=True,
            timeout=HANG_S,
        )
        if check and r.returncode != 0:
            raise AssertionError(
                f"stayer {' '.join(args)} exited {r.returncode}: {r.stderr[-2000:]}"
            )
        return r

    def tenant(self, name: str, *extra: str) -> dict[str, Any]:
        return json.loads(self.cli("tenants", "create", name, *extra, "--json").stdout)


@dataclass
class Process:
    proc: subprocess.Popen[bytes]
    log: Path

    def kill(self, sig: int = signal.SIGTERM) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def output(self) -> str:
        return self.log.read_text(errors="replace")[-4000:]


def spawn(env: Env, args: list[str], log: Path) -> Process:
    out = log.open("wb")
    proc = subprocess.Popen(
        [sys.executable, "-m", "stayer.cli", *args],
        env=env.vars(),
        stdout=out,
        stderr=subprocess.STDOUT,
    )
    return Process(proc, log)


@dataclass
class Server:
    env: Env
    process: Process
    url: str
    keys: dict[str, str] = field(default_factory=dict)

    def client(self, key: str | None) -> httpx.Client:
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        return httpx.Client(base_url=self.url, headers=headers, timeout=60.0)


def start_server(env: Env, tasks_dir: Path, *extra: str) -> Server:
    port = free_port()
    args = [
        "serve",
        "--port",
        str(port),
        "--tasks-dir",
        str(tasks_dir),
        "--allow-private-webhooks",
        *extra,
    ]
    process = spawn(env, args, env.home.parent / f"serve-{port}.log")
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + HANG_S
    while True:
        if process.proc.poll() is not None:
            raise AssertionError(
                f"stayer serve exited {process.proc.returncode}: {process.output()}"
            )
        try:
            if httpx.get(f"{url}/healthz", timeout=5.0).status_code == 200:
                return Server(env, process, url)
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline:
            process.kill(signal.SIGKILL)
            raise AssertionError(f"stayer serve did not start: {process.output()}")
        time.sleep(0.1)


def wait_for(client: httpx.Client, run_id: str, done: Any) -> dict[str, Any]:
    """Poll the run until ``done(run)`` holds; the run's last state."""
    deadline = time.monotonic() + HANG_S
    while True:
        run = client.get(f"/v1/runs/{run_id}").json()
        if done(run):
            return run
        if time.monotonic() > deadline:
            raise AssertionError(f"run {run_id} stuck: {run}")
        time.sleep(0.05)


def finished(run: dict[str, Any]) -> bool:
    return run["status"] in ("succeeded", "failed", "budget_exhausted", "cancelled", "error")


def read_events(
    client: httpx.Client, run_id: str, last_event_id: str | None = None
) -> Iterator[dict[str, Any]]:
    """The run's SSE stream, parsed: one dict per event (``id``, ``event``, ``data``)."""
    headers = {"Last-Event-ID": last_event_id} if last_event_id is not None else {}
    with client.stream(
        "GET", f"/v1/runs/{run_id}/events", headers=headers, timeout=HANG_S
    ) as response:
        assert response.status_code == 200, response.read()
        yield from iter_sse(response.iter_lines())


def start_listening(
    argv: list[str], env: dict[str, str] | None = None, sink: list[str] | None = None
) -> tuple[subprocess.Popen[str], str]:
    """``stayer ARGV`` (``sim serve``, ``gateway``) started, and its URL, read from the line
    it prints on stderr once its socket listens. What it writes after that line is read on
    (into ``sink``, when given), so a chatty server never blocks on a full pipe."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "stayer.cli", *argv],
        stderr=subprocess.PIPE,
        text=True,
        env={**(os.environ if env is None else env), "COLUMNS": "300"},
    )
    assert proc.stderr is not None
    line = proc.stderr.readline()
    assert " on http://" in line, line + proc.stderr.read()
    rest = proc.stderr

    def drain() -> None:
        for later in rest:
            if sink is not None:
                sink.append(later)

    threading.Thread(target=drain, daemon=True).start()
    return proc, line.split(" on ", 1)[1].split()[0]


@contextlib.contextmanager
def listening(argv: list[str], env: dict[str, str] | None = None) -> Iterator[str]:
    """``start_listening`` for a block: its URL, the process stopped at the end."""
    proc, url = start_listening(argv, env)
    try:
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=60)

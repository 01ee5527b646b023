"""What the sandbox tests share: running a coroutine, skipping without bwrap, finding host
processes by a marker in their command line."""

from __future__ import annotations

import asyncio
import os
import time
import uuid
from pathlib import Path

import pytest

from stayer.errors import ConfigError
from stayer.sandbox.bwrap import check_bwrap

try:
    check_bwrap()
    NO_BWRAP = ""
except ConfigError as e:  # pragma: no cover - depends on the machine
    NO_BWRAP = str(e)

needs_bwrap = pytest.mark.skipif(bool(NO_BWRAP), reason=f"bwrap unavailable: {NO_BWRAP}")


def run(coro):
    return asyncio.run(coro)


def marker() -> str:
    """A unique, valid ``sleep`` argument (about 1000 s) to find a process by later."""
    return f"1000.{uuid.uuid4().int % 10**6:06d}"


def procs_with(mark: str) -> list[int]:
    """Host pids whose command line contains ``mark`` (zombies excluded)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            cmd = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ")
            state = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if mark.encode() in cmd and state != "Z":
            found.append(int(entry))
    return found


def wait_gone(mark: str, within: float = 2.0) -> list[int]:
    """Pids still carrying ``mark`` after ``within`` seconds (empty: all gone)."""
    deadline = time.monotonic() + within
    while (left := procs_with(mark)) and time.monotonic() < deadline:
        time.sleep(0.05)
    return left


def count_forks(up_to: int) -> str:
    """A command that forks up to ``up_to`` children, all alive at once (each waits for the
    parent to exit), and prints how many it got: what a process limit allows."""
    return f"""python3 - <<'EOF'
import os
r, w = os.pipe()
n = 0
try:
    while n < {up_to}:
        if os.fork() == 0:
            os.close(w)
            os.read(r, 1)
            os._exit(0)
        n += 1
except OSError:
    pass
print(n)
EOF"""

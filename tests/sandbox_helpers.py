"""What the sandbox tests share: running a coroutine, skipping without bwrap, finding host
processes by a marker in their command line."""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import os
import platform
import time
import uuid
from collections.abc import Iterator
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


def wait_gone(mark: str, within: float = 120.0) -> list[int]:
    """Pids still carrying ``mark`` after ``within`` seconds (empty: all gone). Returns as
    soon as none is left: ``within`` bounds a failure's wait, not a success's (a killed
    process on a busy machine may take a while to be reaped)."""
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


# add_key and keyctl by machine; KEY_SPEC_USER_KEYRING and KEYCTL_UNLINK.
_KEY_CALLS = {"x86_64": (248, 250), "aarch64": (217, 219)}
_USER_KEYRING, _UNLINK = -4, 9
# Run as ``python3 - KEYCTL NAME``: looks for the key NAME in the user keyring and reads
# it; prints what it got, or "no key".
KEY_READER = """import ctypes, sys
libc = ctypes.CDLL(None, use_errno=True)
keyctl = int(sys.argv[1])
key = libc.syscall(keyctl, 10, -4, b"user", sys.argv[2].encode(), 0)
buf = ctypes.create_string_buffer(64)
n = libc.syscall(keyctl, 11, key, buf, 64) if key > 0 else -1
print(buf.value.decode() if n > 0 else "no key")
"""


@contextlib.contextmanager
def host_key() -> Iterator[tuple[str, int]]:
    """A key with a unique name (and secret) in this user's keyring, removed after:
    ``(name, keyctl's system call number)`` for :data:`KEY_READER`."""
    calls = _KEY_CALLS.get(platform.machine())
    if calls is None:
        pytest.skip(f"no system call numbers here for {platform.machine()}")
    add_key, keyctl = calls
    libc = ctypes.CDLL(None, use_errno=True)
    name, secret = f"stayer-test-{uuid.uuid4().hex}", uuid.uuid4().hex
    key = libc.syscall(add_key, b"user", name.encode(), secret.encode(), 32, _USER_KEYRING)
    assert key > 0, os.strerror(ctypes.get_errno())
    try:
        yield name, keyctl
    finally:
        libc.syscall(keyctl, _UNLINK, key, _USER_KEYRING)

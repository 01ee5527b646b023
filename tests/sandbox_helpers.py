"""What the sandbox tests share: running a coroutine, skipping without bwrap, finding host
processes by a marker in their command line."""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import os
import platform
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from stayer.errors import ConfigError
from stayer.sandbox.base import Sandbox
from stayer.sandbox.bwrap import check_bwrap

try:
    check_bwrap()
    NO_BWRAP = ""
except ConfigError as e:  # pragma: no cover - depends on the machine
    NO_BWRAP = str(e)

needs_bwrap = pytest.mark.skipif(bool(NO_BWRAP), reason=f"bwrap unavailable: {NO_BWRAP}")


def run(coro):
    return asyncio.run(coro)


def cancel_once_running(sb: Sandbox, mark: str) -> None:
    """Start ``echo up; sleep MARK`` in ``sb`` and cancel it once the sleep runs: the
    cancellation reaches the caller."""

    async def cancel() -> None:
        task = asyncio.ensure_future(sb.exec(f"echo up; sleep {mark}", timeout=600))
        while not procs_with(mark):
            await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    run(cancel())


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


def _until(done: Callable[[], bool], within: float) -> bool:
    """Whether ``done()`` holds within ``within`` seconds. Returns as soon as it does:
    ``within`` bounds a failure's wait, not a success's (on a busy machine a killed
    process may take a while to be reaped, a thread a while to get its turn)."""
    deadline = time.monotonic() + within
    while not done():
        if time.monotonic() > deadline:
            return done()
        time.sleep(0.05)
    return True


def wait_gone(mark: str, within: float = 120.0) -> list[int]:
    """Pids still carrying ``mark`` after ``within`` seconds (empty: all gone)."""
    _until(lambda: not procs_with(mark), within)
    return procs_with(mark)


def dead(pid: int) -> bool:
    """Whether process ``pid`` has exited (gone, or a zombie not reaped yet)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:  # gone, perhaps between two looks
        return True
    return stat.rsplit(")", 1)[1].split()[0] in ("Z", "X")


def wait_dead(pid: int, within: float = 120.0) -> bool:
    """Whether process ``pid`` has exited within ``within`` seconds."""
    return _until(lambda: dead(pid), within)


def gone_within(path: Path, within: float = 120.0) -> bool:
    """Whether ``path`` is gone within ``within`` seconds (removed by another thread)."""
    return _until(lambda: not path.exists(), within)


def not_blocked(thread: threading.Thread, where: set[str], within: float = 120.0) -> bool:
    """Whether ``thread`` ends, rather than being found in code of one of the files
    ``where`` (those that take a lock it holds: once there, it waits for good). Whichever
    comes first is seen, however slowly it runs; ``within`` bounds only a wait that sees
    neither."""

    def entered() -> bool:
        frame = sys._current_frames().get(thread.ident or -1)
        while frame is not None:
            if frame.f_code.co_filename in where:
                return True
            frame = frame.f_back
        return False

    return _until(lambda: not thread.is_alive() or entered(), within) and not thread.is_alive()


# Run by dropped_holding_locks in a Python of its own: argv = tests dir, workspace, "1" for
# a persistent sandbox. A thread that blocks holds the lock for good: os._exit then.
_DROP_HOLDING_LOCKS = """
import gc, os, sys, threading
from concurrent.futures import thread as futures_thread
from pathlib import Path
sys.path.insert(0, sys.argv[1])
from sandbox_helpers import not_blocked, run, wait_dead
from stayer.sandbox import bwrap, etc_copy

sb = bwrap.BwrapSandbox(Path(sys.argv[2]), persistent=sys.argv[3] == "1")
assert run(sb.exec("true")).exit_code == 0
kept = sb._kept_box
pid = kept._live.proc.pid if sb.persistent else kept._next.result(timeout=120).proc.pid
owner = [sb]
del sb, kept

def drop():
    with futures_thread._global_shutdown_lock, bwrap._ETC_COPIES._lock:
        owner.clear()
        gc.collect()

dropper = threading.Thread(target=drop, daemon=True)
dropper.start()
if not not_blocked(dropper, {futures_thread.__file__, etc_copy.__file__}):
    print("the finaliser waited for a lock its thread held", flush=True)
    os._exit(1)
print("ok" if wait_dead(pid) else "the sandbox outlived its owner", flush=True)
"""


def dropped_holding_locks(ws: Path, *, persistent: bool) -> str:
    """What happens when a sandbox of ``ws`` that has run a command (so that it keeps one
    running, or started ahead) is dropped by a thread holding the locks its finaliser must
    not take: the executors' shutdown lock and the lock of the /etc copies. A finaliser
    runs wherever the garbage collector does, in such a thread too; one that took either
    waited there for good (as one did, hanging a run of the suite). "ok", or what went
    wrong; in a Python of its own, which a blocked thread cannot hang."""
    proc = subprocess.run(
        [sys.executable, "-c", _DROP_HOLDING_LOCKS, str(Path(__file__).parent), str(ws)]
        + ["1" if persistent else "0"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    return proc.stdout.strip() or proc.stderr[-2000:]


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

"""Snapshot stores with the shared watch's daemon (``stayer.workspace.watchd``) up for the
test, and gone after it."""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

from stayer.workspace.snapshot import FileSnapshotStore


def daemon_pid(root: Path) -> int | None:
    """The pid of the watch daemon of the store at ``root``, if one ever started."""
    try:
        return int((root / "watch" / "watchd.lock").read_text())
    except (OSError, ValueError):
        return None


def store_with_daemon(root: Path) -> FileSnapshotStore:
    """A store whose daemon is up (started by the store, waited for here)."""
    store = FileSnapshotStore(root, shared_watch=True)
    assert store._shared is not None
    deadline = time.monotonic() + 30
    while store._shared._connect() is None:
        assert time.monotonic() < deadline, "the watch daemon did not start"
        store._shared._spawned_at = -1e9  # (a start that lost a race may be retried)
        time.sleep(0.02)
    return store


@contextlib.contextmanager
def daemon_stopped_after(root: Path) -> Iterator[Path]:
    """Kill the store's daemon (if it started) when the block ends."""
    try:
        yield root
    finally:
        pid = daemon_pid(root)
        if pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)

"""What the journal's and the budget's SQLite databases share: one write transaction, and
files only their owner can read (the tenants' webhook secrets are in them)."""

from __future__ import annotations

import contextlib
import os
import sqlite3
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any


@contextmanager
def immediate(conn: sqlite3.Connection) -> Iterator[sqlite3.Cursor]:
    """``BEGIN IMMEDIATE`` takes the write lock up front, so a read-then-write (a lease
    claim, a budget reservation) cannot interleave with another process's."""
    cur = conn.cursor()
    cur.execute("BEGIN IMMEDIATE")
    try:
        yield cur
    except BaseException:
        conn.rollback()
        raise
    else:
        conn.commit()
    finally:
        cur.close()


def private_dir(path: Path) -> None:
    """``path``, a directory of stayer's own (never one a user named: that may be
    ``/tmp``), as one only its owner can enter: made 0700, or, if it is there and ours,
    with group and other access taken away."""
    path.mkdir(parents=True, exist_ok=True, mode=0o700)
    _owner_only(path)


def _owner_only(path: Path) -> None:
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return
    if st.st_uid == os.getuid() and st.st_mode & 0o077:
        os.chmod(path, stat.S_IMODE(st.st_mode) & ~0o077)


def connect_private(path: Path, **kwargs: Any) -> sqlite3.Connection:
    """``sqlite3.connect(path)`` to a database only its owner can read: its directory is
    made 0700 if it is new (one that exists is left as it is: it may be shared), the file
    0600 before SQLite opens it (SQLite gives its ``-wal`` and ``-shm`` files the
    database's mode), and files there already (made by an older stayer) lose group and
    other access."""
    if str(path) in ("", ":memory:"):
        return sqlite3.connect(path, **kwargs)  # no file
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    # Only a new file: closing any descriptor of a database drops every POSIX lock this
    # process holds on it, its other connections' included (SQLite's own are safe).
    with contextlib.suppress(FileExistsError):
        os.close(os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600))
    for suffix in ("", "-wal", "-shm", "-journal"):
        _owner_only(path.with_name(path.name + suffix))
    return sqlite3.connect(path, **kwargs)

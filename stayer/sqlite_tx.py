"""One SQLite write transaction, shared by the journal and the cross-process budget."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager


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

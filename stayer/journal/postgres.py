"""PostgreSQL store (``STAYER_DB=postgresql://…``): runs, events and blobs in one database
that several processes and machines share, through one bounded pool of connections per
process (``stayer.pgpool``), which outlives the server's restarts.

Blobs live in a table and are inserted in the same transaction as the events that refer to
them. Leases use the database's clock, so machines with skewed clocks agree on expiry;
``claim_next`` locks candidate rows with ``FOR UPDATE SKIP LOCKED``, so concurrent workers
each get a different run without waiting on one another. Needs ``psycopg`` 3 (the
``postgres`` extra).
"""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from stayer.journal.snapshot import BlobSnapshots
from stayer.journal.sql import SqlStore, schema
from stayer.journal.store import JournalError, StoreUnavailable
from stayer.workspace.snapshot import SnapshotStore


class _DuplicateOfRaised(logging.Filter):
    """Drops psycopg's warning that ending a pipeline failed too (``error ignored
    terminating …``): it comes with the exception already raised, which the journal reports
    in one line; printed by logging's last resort, it was a second line of the same error."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith("error ignored terminating")


def quiet_duplicate_warnings(logger: logging.Logger) -> None:
    """Add :class:`_DuplicateOfRaised` to ``logger``, once."""
    if not any(isinstance(f, _DuplicateOfRaised) for f in logger.filters):
        logger.addFilter(_DuplicateOfRaised())


# Serialises schema creation across processes that open a fresh database at once.
_DDL_LOCK = 0x5741_5945_52  # "STAYER"-ish; any constant shared by all stayer processes


def _redact(url: str) -> str:
    return re.sub(r"//([^:/@]+):[^@]*@", r"//\1:***@", url)


class _Cursor:
    """A psycopg cursor that accepts the ``?`` placeholders the shared SQL is written in."""

    def __init__(self, cur: Any) -> None:
        self.cur = cur

    @property
    def rowcount(self) -> int:
        return int(self.cur.rowcount)

    def execute(self, sql: str, params: Sequence[Any] = ()) -> _Cursor:
        self.cur.execute(sql.replace("?", "%s"), tuple(params))
        return self

    def executemany(self, sql: str, rows: Iterable[Sequence[Any]]) -> None:
        self.cur.executemany(sql.replace("?", "%s"), list(rows))

    def fetchone(self) -> tuple[Any, ...] | None:
        row: tuple[Any, ...] | None = self.cur.fetchone()
        return row

    def fetchall(self) -> list[tuple[Any, ...]]:
        return list(self.cur.fetchall())


class PostgresStore(SqlStore):
    NOW = "extract(epoch from clock_timestamp())::double precision"
    LOCK_ROW = " FOR UPDATE"
    LOCK_ROW_SKIP = " FOR UPDATE SKIP LOCKED"

    def __init__(self, url: str) -> None:
        self.location = _redact(url)
        try:
            import psycopg
            import psycopg_pool  # noqa: F401
        except ImportError:
            raise JournalError(
                "STAYER_DB: PostgreSQL needs psycopg 3 and psycopg_pool; install them with "
                "pip install 'stayer[postgres]'"
            ) from None
        from stayer import pgpool

        quiet_duplicate_warnings(logging.getLogger("psycopg"))
        self._url = url
        # The connection this thread's open transaction uses: a nested one joins it.
        self._held = threading.local()
        self._pool: Any = None
        cannot = f"STAYER_DB {self.location}: cannot open the journal database"
        try:
            self._pool = pgpool.acquire(url)
            self.create_tables(schema("BYTEA"), check_version=True)
        except StoreUnavailable as e:
            self.close()
            raise StoreUnavailable(f"{cannot} ({pgpool.first_line(e.__cause__ or e)})") from None
        except psycopg.Error as e:
            self.close()
            error = StoreUnavailable if pgpool.unavailable(e) else JournalError
            raise error(f"{cannot} ({pgpool.first_line(e)})") from None

    def _lock_ddl(self, cur: Any) -> None:
        cur.execute("SELECT pg_advisory_xact_lock(?)", (_DDL_LOCK,))

    @contextmanager
    def _connection(self) -> Iterator[Any]:
        conn = getattr(self._held, "conn", None)
        if conn is not None:
            yield conn
            return
        from stayer.pgpool import borrowed

        with borrowed(self._pool, f"STAYER_DB {self.location}") as conn:
            self._held.conn = conn
            try:
                yield conn
            finally:
                self._held.conn = None

    @contextmanager
    def _tx(self, *, sync: bool = True) -> Iterator[_Cursor]:
        with self._connection() as conn, conn.transaction(), conn.cursor() as cur:
            if not sync:  # committed for every client at once; flushed to disk shortly after
                cur.execute("SET LOCAL synchronous_commit TO OFF")
            yield _Cursor(cur)

    def _read(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        with self._connection() as conn, conn.cursor() as cur:
            cur.execute(sql.replace("?", "%s"), tuple(params))
            return list(cur.fetchall())

    def snapshots(self) -> SnapshotStore:
        # In the database: a run may be resumed on another machine.
        return BlobSnapshots(self.put_blobs, self.get_blob)

    def close(self) -> None:
        if self._pool is not None:
            from stayer import pgpool

            self._pool = None
            pgpool.release(self._url)

"""One bounded pool of PostgreSQL connections per database and process.

Every store of a process that names one database (the journal, the runtime's tables, the
tenants' budgets, in every API thread and worker slot) borrows connections from one
``psycopg_pool.ConnectionPool`` of at most ``STAYER_DB_POOL`` (default 10) connections,
each for one transaction. A connection the server dropped (a restart) is checked and
replaced when next borrowed, so a process outlives its database's restarts. An operation
that finds no usable connection raises ``StoreUnavailable`` (the API answers 503).

A transaction whose process stops between two statements (SIGSTOP, a frozen VM) is ended
by the server after ``idle_transaction_limit`` seconds (a worker's lease TTL), so its row
locks never outlive its leases: another worker can take its runs over.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from stayer.errors import StoreUnavailable

#: Seconds an operation waits for a connection (the database restarting, or all busy).
WAIT_S = 5.0

_pools: dict[str, tuple[Any, int]] = {}
_lock = threading.Lock()
_idle_transaction_s = 30.0


def limit_idle_transactions(seconds: float) -> None:
    """End (server side) a transaction left idle ``seconds``, in the connections of pools
    opened from now on: a worker calls it with its lease TTL before opening its stores."""
    global _idle_transaction_s
    _idle_transaction_s = seconds


def _configure(conn: Any) -> None:
    ms = max(1, round(_idle_transaction_s * 1000))
    conn.execute(f"SET idle_in_transaction_session_timeout = {ms}")


def pool_size() -> int:
    text = os.environ.get("STAYER_DB_POOL", "10")
    try:
        size = int(text)
    except ValueError:
        size = 0
    if size < 1:
        from stayer.errors import ConfigError

        raise ConfigError(f"STAYER_DB_POOL: {text!r} is not a positive number of connections")
    return size


def acquire(url: str) -> Any:
    """The process's pool for ``url`` (opened on first use); give it back with ``release``."""
    import psycopg
    from psycopg_pool import ConnectionPool

    with _lock:
        pool, users = _pools.get(url, (None, 0))
        if pool is None:
            # One connection first: a wrong address or password fails at once, in one line
            # (the pool would retry it in the background until its wait ran out).
            psycopg.connect(url, connect_timeout=10).close()
            # Its retries are the worker's and the API's to report (once, not per attempt).
            logging.getLogger("psycopg.pool").setLevel(logging.ERROR)
            pool = ConnectionPool(
                url,
                min_size=1,
                max_size=pool_size(),
                kwargs={"autocommit": True, "connect_timeout": 10},
                configure=_configure,
                check=ConnectionPool.check_connection,
                timeout=WAIT_S,
                open=True,
                name="stayer",
            )
        _pools[url] = (pool, users + 1)
        return pool


def release(url: str) -> None:
    """One user fewer of ``url``'s pool; the last one closes it."""
    with _lock:
        pool, users = _pools.get(url, (None, 0))
        if pool is None:
            return
        if users > 1:
            _pools[url] = (pool, users - 1)
            return
        del _pools[url]
    pool.close()


def unavailable(e: BaseException) -> bool:
    """Whether ``e`` says the database cannot be reached now (rather than a bad query)."""
    import psycopg
    from psycopg_pool import PoolTimeout

    return isinstance(e, (psycopg.OperationalError, psycopg.InterfaceError, PoolTimeout))


def first_line(e: BaseException) -> str:
    return (str(e).strip().splitlines() or [type(e).__name__])[0]


@contextmanager
def borrowed(pool: Any, where: str) -> Iterator[Any]:
    """A connection of ``pool`` for one unit of work; a lost database is StoreUnavailable,
    and so is a pool already given back (a store closed while a run still held it)."""
    if pool is None:
        raise StoreUnavailable(f"{where}: this process closed its connections; try again")
    try:
        with pool.connection() as conn:
            yield conn
    except Exception as e:
        if unavailable(e):
            raise StoreUnavailable(
                f"{where}: the database is unavailable ({first_line(e)}); try again shortly"
            ) from e
        raise

"""The process-wide PostgreSQL pool: a process stopped inside a transaction (SIGSTOP, as a
frozen worker looks) does not keep its row locks past ``limit_idle_transactions``, so the
runs it held can be claimed by another worker (``FOR UPDATE SKIP LOCKED`` skips a locked
row for as long as it stays locked)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest
from pg_server import database_fixture

pg_url = database_fixture()

HANG_S = 240.0  # a wait longer than this is a hang, not slowness

LOCKER = textwrap.dedent(
    """
    import os, signal, sys
    from stayer import pgpool

    pgpool.limit_idle_transactions(float(sys.argv[2]))
    pool = pgpool.acquire(sys.argv[1])
    with pool.connection() as conn, conn.transaction():
        conn.execute("SELECT id FROM stalled_rows WHERE id = 1 FOR UPDATE")
        print("locked", flush=True)
        os.kill(os.getpid(), signal.SIGSTOP)  # frozen between two statements
        conn.execute("SELECT 1")
    """
)


def claim(url: str) -> int | None:
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn, conn.transaction():
        row = conn.execute("SELECT id FROM stalled_rows FOR UPDATE SKIP LOCKED").fetchone()
        return None if row is None else int(row[0])


def test_a_process_stopped_in_a_transaction_loses_its_locks(pg_url: str) -> None:
    import psycopg

    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute("CREATE TABLE stalled_rows (id INT PRIMARY KEY)")
        conn.execute("INSERT INTO stalled_rows VALUES (1)")
    locker = subprocess.Popen(
        [sys.executable, "-c", LOCKER, pg_url, "1"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert locker.stdout is not None
        assert locker.stdout.readline().strip() == "locked", locker.stderr
        deadline = time.monotonic() + HANG_S
        while (got := claim(pg_url)) is None:
            assert time.monotonic() < deadline, "the stopped process still holds its lock"
            time.sleep(0.2)
        assert got == 1
        # Woken, the stopped process finds its transaction ended, not carried on.
        os.kill(locker.pid, signal.SIGCONT)
        _, err = locker.communicate(timeout=HANG_S)
        assert locker.returncode != 0
        assert "idle-in-transaction" in err or "terminating connection" in err, err
    finally:
        if locker.poll() is None:
            os.kill(locker.pid, signal.SIGCONT)
            locker.kill()
            locker.wait()


@pytest.mark.parametrize("seconds", [0.5, 30.0])
def test_the_limit_is_set_on_every_connection_of_a_new_pool(pg_url: str, seconds: float) -> None:
    from stayer import pgpool

    pgpool.limit_idle_transactions(seconds)
    try:
        pool = pgpool.acquire(pg_url)
        try:
            with pool.connection() as conn:
                row = conn.execute("SHOW idle_in_transaction_session_timeout").fetchone()
        finally:
            pgpool.release(pg_url)
    finally:
        pgpool.limit_idle_transactions(30.0)
    assert row is not None
    assert row[0] == ("500ms" if seconds < 1 else "30s")

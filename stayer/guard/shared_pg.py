"""Budgets shared by processes on several machines: ``stayer.guard.budget``'s accounting
in PostgreSQL (the database ``STAYER_DB`` names).

Each operation is one transaction that first takes a transaction-scoped advisory lock, so
every read-modify-write of the budget tables is serialised across all clients: two workers
reserving against one tenant's cap cannot both see the same headroom. Amounts are decimal
strings added in Python (exact), as in the SQLite store.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from decimal import Decimal
from typing import Any

from stayer.errors import ConfigError
from stayer.guard.budget import ACCOUNT_COLUMNS, Account, BudgetStore, Rows, account_of, account_row

_LOCK = 0x5354_4255_4447  # "STBUDG": one lock for all budget transactions

_SCHEMA = (
    """CREATE TABLE IF NOT EXISTS budget_accounts (
        name TEXT PRIMARY KEY, cap TEXT, spent TEXT NOT NULL, reserved TEXT NOT NULL,
        parent TEXT, parent_hold BIGINT, closed INTEGER NOT NULL, overrun TEXT NOT NULL)""",
    """CREATE TABLE IF NOT EXISTS budget_holds (
        id BIGSERIAL PRIMARY KEY, budget TEXT NOT NULL, amount TEXT NOT NULL)""",
)


class PostgresBudgetStore(BudgetStore):
    """Connections are borrowed per transaction from the process's pool for the database
    (``stayer.pgpool``); a database that is away is ``StoreUnavailable``."""

    def __init__(self, url: str) -> None:
        try:
            import psycopg
            import psycopg_pool  # noqa: F401
        except ImportError:
            raise ConfigError(
                "STAYER_DB: PostgreSQL needs psycopg 3 and psycopg_pool; "
                "pip install 'stayer[postgres]'"
            ) from None
        from stayer import pgpool
        from stayer.errors import StoreUnavailable

        self._url = url
        self._pool: Any = None
        try:
            self._pool = pgpool.acquire(url)
            with self.transaction() as rows:
                for ddl in _SCHEMA:
                    rows.cur.execute(ddl)
        except StoreUnavailable:
            self.close_connection()
            raise
        except psycopg.Error as e:
            self.close_connection()
            error = StoreUnavailable if pgpool.unavailable(e) else ConfigError
            raise error(
                f"STAYER_DB: cannot open the budget tables ({pgpool.first_line(e)})"
            ) from None

    @contextmanager
    def transaction(self) -> Iterator[_PgRows]:
        from stayer.pgpool import borrowed

        with (
            borrowed(self._pool, "STAYER_DB (budgets)") as conn,
            conn.transaction(),
            conn.cursor() as cur,
        ):
            cur.execute("SELECT pg_advisory_xact_lock(%s)", (_LOCK,))
            yield _PgRows(cur)

    def close_connection(self) -> None:
        if self._pool is not None:
            from stayer import pgpool

            self._pool = None
            pgpool.release(self._url)


class _PgRows(Rows):
    def __init__(self, cur: Any) -> None:
        self.cur = cur

    def get(self, name: str) -> Account | None:
        self.cur.execute(f"SELECT {ACCOUNT_COLUMNS} FROM budget_accounts WHERE name = %s", (name,))
        row = self.cur.fetchone()
        return None if row is None else account_of(row)

    def put(self, a: Account) -> None:
        self.cur.execute(
            "INSERT INTO budget_accounts VALUES (%s, %s, %s, %s, %s, %s, %s, %s) ON CONFLICT (name) DO UPDATE SET "
            "cap = excluded.cap, spent = excluded.spent, reserved = excluded.reserved, parent = excluded.parent, "
            "parent_hold = excluded.parent_hold, closed = excluded.closed, overrun = excluded.overrun",
            account_row(a),
        )

    def hold(self, name: str, amount: Decimal) -> int:
        self.cur.execute(
            "INSERT INTO budget_holds (budget, amount) VALUES (%s, %s) RETURNING id",
            (name, str(amount)),
        )
        return int(self.cur.fetchone()[0])

    def take(self, hold_id: int) -> tuple[str, Decimal] | None:
        self.cur.execute(
            "DELETE FROM budget_holds WHERE id = %s RETURNING budget, amount", (hold_id,)
        )
        row = self.cur.fetchone()
        return None if row is None else (row[0], Decimal(row[1]))

"""Budgets shared by several processes: the accounting of ``stayer.guard.budget`` in SQLite.

Each operation is one ``BEGIN IMMEDIATE`` transaction, which takes the database's write
lock before reading, so two processes reserving against one cap are serialised: the
second reads the first's reservation before deciding. Amounts are stored as decimal
strings and added in Python (exact), never as SQLite floats.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from decimal import Decimal
from pathlib import Path

from stayer.errors import ConfigError
from stayer.guard.budget import ACCOUNT_COLUMNS, Account, BudgetStore, Rows, account_of, account_row
from stayer.sqlite_tx import connect_private, immediate

_SCHEMA = (
    """CREATE TABLE IF NOT EXISTS budget_accounts (
        name TEXT PRIMARY KEY, cap TEXT, spent TEXT NOT NULL, reserved TEXT NOT NULL,
        parent TEXT, parent_hold INTEGER, closed INTEGER NOT NULL, overrun TEXT NOT NULL)""",
    """CREATE TABLE IF NOT EXISTS budget_holds (
        id INTEGER PRIMARY KEY AUTOINCREMENT, budget TEXT NOT NULL, amount TEXT NOT NULL)""",
)


class SqliteBudgetStore(BudgetStore):
    def __init__(self, path: Path | str) -> None:
        self.path = Path(path)
        try:
            # isolation_level=None: we issue BEGIN IMMEDIATE ourselves.
            self.conn = connect_private(
                self.path, isolation_level=None, timeout=60.0, check_same_thread=False
            )
            self.conn.execute("PRAGMA journal_mode=WAL")
            with self.transaction() as rows:
                for ddl in _SCHEMA:
                    rows.cur.execute(ddl)
        except (sqlite3.Error, OSError) as e:
            raise ConfigError(f"{self.path}: cannot open the budget database ({e})") from None

    @contextmanager
    def transaction(self) -> Iterator[_SqlRows]:
        with immediate(self.conn) as cur:
            yield _SqlRows(cur)

    def close_connection(self) -> None:
        self.conn.close()


class _SqlRows(Rows):
    def __init__(self, cur: sqlite3.Cursor) -> None:
        self.cur = cur

    def get(self, name: str) -> Account | None:
        row = self.cur.execute(
            f"SELECT {ACCOUNT_COLUMNS} FROM budget_accounts WHERE name = ?", (name,)
        ).fetchone()
        return None if row is None else account_of(row)

    def put(self, a: Account) -> None:
        self.cur.execute(
            "INSERT OR REPLACE INTO budget_accounts VALUES (?, ?, ?, ?, ?, ?, ?, ?)", account_row(a)
        )

    def hold(self, name: str, amount: Decimal) -> int:
        self.cur.execute(
            "INSERT INTO budget_holds (budget, amount) VALUES (?, ?)", (name, str(amount))
        )
        hold_id = self.cur.lastrowid
        assert hold_id is not None
        return hold_id

    def take(self, hold_id: int) -> tuple[str, Decimal] | None:
        row = self.cur.execute(
            "SELECT budget, amount FROM budget_holds WHERE id = ?", (hold_id,)
        ).fetchone()
        if row is None:
            return None
        self.cur.execute("DELETE FROM budget_holds WHERE id = ?", (hold_id,))
        return row[0], Decimal(row[1])

"""Tenants' dollar budgets: one reserved budget per tenant over all of its runs.

A tenant's budget is an account in a shared ``BudgetStore`` (SQLite beside the journal, or
PostgreSQL with ``STAYER_DB``), so every worker on every machine reserves against the same
cap. Before a run starts, its worker holds the run's own cap in the tenant's account (the
same no-overshoot reservation a run makes before each model call); when the run ends the
hold is settled at what the run really spent. The run's cap is therefore carved from the
tenant's: the sum of running caps never exceeds what the tenant has left, and no call of
any run can push the tenant past its cap. A run that does not fit waits as ``paused``
(``budget_reached``) until other runs settle and free room for it, or the cap is raised; a
waiting run holds only what it has spent.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import replace
from decimal import Decimal
from pathlib import Path

from stayer.errors import ConfigError
from stayer.guard.budget import Account, BudgetStore


def account_name(tenant: str) -> str:
    return f"tenant:{tenant}"


def key_account_name(key_hash: str) -> str:
    """A gateway key's budget account, named by the key's SHA-256 (never the key)."""
    return f"key:{key_hash[:32]}"


def open_budget_store(home: Path, url: str | None = None) -> BudgetStore:
    """The budget store beside the journal that ``STAYER_DB`` (or ``url``) names."""
    url = os.environ.get("STAYER_DB") if url is None else url
    if url:
        from stayer.guard.shared_pg import PostgresBudgetStore

        return PostgresBudgetStore(url)
    from stayer.guard.shared import SqliteBudgetStore

    return SqliteBudgetStore(Path(home) / "budgets.db")


class TenantBudgets:
    def __init__(self, store: BudgetStore) -> None:
        self.store = store

    def set_cap(self, tenant: str, cap: Decimal | None) -> Account:
        """Create or change the tenant's cap (None: unlimited, still accounted). Lowering
        it below what is spent and held is refused: that money is already committed."""
        return self._set(account_name(tenant), cap, f"--max-cost {cap}", f"tenant {tenant!r}")

    def set_key_cap(self, tenant: str, key_hash: str, cap: Decimal | None) -> Account:
        """The same for the tenant's key: what calls through ``stayer gateway`` with it
        may spend (the tenant's cap still holds over them)."""
        name = key_account_name(key_hash)
        return self._set(name, cap, f"--key-max-cost {cap}", f"tenant {tenant!r}'s key")

    def key_account(self, key_hash: str) -> Account:
        return self._account(key_account_name(key_hash))

    def _set(self, name: str, cap: Decimal | None, flag: str, who: str) -> Account:
        with self.store.transaction() as rows:
            a = rows.get(name)
            if a is None:
                a = Account(name, cap)
            else:
                if cap is not None and cap < a.spent + a.reserved:
                    raise ConfigError(
                        f"{flag}: below what {who} has spent and holds "
                        f"(${a.spent + a.reserved}); give at least that"
                    )
                a = replace(a, cap=cap)
            rows.put(a)
            return a

    def account(self, tenant: str) -> Account:
        return self._account(account_name(tenant))

    def _account(self, name: str) -> Account:
        with self.store.transaction() as rows:
            a = rows.get(name)
            if a is None:
                a = Account(name, None)
                rows.put(a)
            return a

    def hold(self, tenant: str, amount: Decimal) -> int | None:
        """Reserve ``amount`` of the tenant's budget for a run; None when it does not fit."""
        self.account(tenant)
        return self.store.reserve(account_name(tenant), amount)

    def regrow(self, tenant: str, hold_id: int | None, amount: Decimal) -> int | None:
        """Replace a run's hold (or none) by one of ``amount``, in one transaction; the new
        hold's id, or None (and the old hold untouched) when the budget cannot hold it."""
        name = account_name(tenant)
        self.account(tenant)
        try:
            with self.store.transaction() as rows:
                a = rows.get(name)
                assert a is not None
                held = rows.take(hold_id) if hold_id is not None else None
                old = held[1] if held is not None else Decimal(0)
                if a.cap is not None and a.spent + a.reserved - old + amount > a.cap:
                    raise _NoRoom  # rolls the transaction back: the old hold stays
                rows.put(replace(a, reserved=a.reserved - old + amount))
                return rows.hold(name, amount)
        except _NoRoom:
            return None

    def is_open(self, hold_id: int) -> bool:
        """Whether the hold is still held (not settled)."""
        try:
            with self.store.transaction() as rows:
                raise _Peek(rows.take(hold_id) is not None)  # rolled back: nothing changes
        except _Peek as peek:
            return peek.found

    def settle(self, hold_id: int, spent: Decimal) -> None:
        # KeyError: settled already (a worker that died after settling, before recording it).
        with contextlib.suppress(KeyError):
            self.store.settle(hold_id, spent)


class _NoRoom(Exception):
    pass


class _Peek(Exception):
    def __init__(self, found: bool) -> None:
        self.found = found

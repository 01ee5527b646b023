"""Cost budgets that are reserved before a call and settled after it, and that nest.

Reserving a call's worst case first (``stayer.guard.reserve``) means the cap is never
overshot. Budgets form a tree: ``carve`` holds a slice of a budget for a sub-agent or the
wrap-up as one reservation in the parent; ``close`` settles it at what the child spent.
Every operation is one atomic transaction on a ``BudgetStore``: ``MemoryBudgetStore``
(a lock: tasks and threads of one process) or ``SqliteBudgetStore``
(``stayer.guard.shared``; ``BEGIN IMMEDIATE``: processes sharing the file). The
arithmetic is written once, here, against the few row operations a store provides.
"""

from __future__ import annotations

import threading
import uuid
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from decimal import Decimal
from typing import Any, Protocol

from stayer.errors import ConfigError
from stayer.money import ZERO


@dataclass(frozen=True)
class Reservation:
    amount: Decimal
    id: int = 0


@dataclass(frozen=True)
class Account:
    """One budget's row. ``cap`` None means unlimited (still accounted, for roll-up)."""

    name: str
    cap: Decimal | None
    spent: Decimal = ZERO
    reserved: Decimal = ZERO
    parent: str | None = None
    parent_hold: int | None = None  # the parent's reservation that funds this budget
    closed: bool = False
    overrun: Decimal = ZERO  # settled beyond a reservation: a broken worst-case estimate

    @property
    def available(self) -> Decimal | None:
        return None if self.cap is None else self.cap - self.spent - self.reserved


#: The columns of a stored account, in the order ``account_row`` writes them.
ACCOUNT_COLUMNS = "name, cap, spent, reserved, parent, parent_hold, closed, overrun"


def account_row(a: Account) -> tuple[object, ...]:
    """An account as a database row: amounts as decimal strings (exact), never floats."""
    cap = None if a.cap is None else str(a.cap)
    return (
        a.name,
        cap,
        str(a.spent),
        str(a.reserved),
        a.parent,
        a.parent_hold,
        int(a.closed),
        str(a.overrun),
    )


def account_of(row: tuple[Any, ...]) -> Account:
    n, cap, spent, reserved, parent, hold, closed, overrun = row
    return Account(
        n,
        None if cap is None else Decimal(cap),
        Decimal(spent),
        Decimal(reserved),
        parent,
        hold,
        bool(closed),
        Decimal(overrun),
    )


class Rows(Protocol):
    """What a store offers inside one transaction."""

    def get(self, name: str) -> Account | None: ...

    def put(self, account: Account) -> None: ...

    def hold(self, name: str, amount: Decimal) -> int:
        """Record a reservation; returns its id."""

    def take(self, hold_id: int) -> tuple[str, Decimal] | None:
        """Remove a reservation; (budget name, amount), or None if already gone."""


class BudgetStore(ABC):
    """Atomic budget accounting. Subclasses provide ``transaction``; the rules are here."""

    @abstractmethod
    @contextmanager
    def transaction(self) -> Iterator[Rows]: ...

    def open(self, name: str, cap: Decimal | None) -> Account:
        """The root budget ``name``, created with ``cap`` if new. Several processes opening
        the same name share it, so they must agree on the cap."""
        with self.transaction() as rows:
            a = rows.get(name)
            if a is None:
                a = Account(name, cap)
                rows.put(a)
            elif a.cap != cap:
                raise ConfigError(
                    f"budget {name!r}: already exists with cap {a.cap} (asked for {cap}); "
                    "use the same cap or another budget name"
                )
            return a

    def account(self, name: str) -> Account:
        with self.transaction() as rows:
            a = rows.get(name)
        if a is None:
            raise KeyError(name)
        return a

    def reserve(self, name: str, amount: Decimal) -> int | None:
        """Hold ``amount``; None (and nothing held) when that would exceed the cap."""
        with self.transaction() as rows:
            return reserve_in(rows, _open_account(rows, name), amount)

    def settle(self, hold_id: int, actual: Decimal) -> Decimal:
        """Replace a reservation by what was really spent; returns any overrun (> 0 only
        if the worst-case estimate was wrong — the spend happened, so it is recorded)."""
        with self.transaction() as rows:
            return settle_in(rows, hold_id, actual)

    def carve(self, parent: str, child: str, amount: Decimal | None) -> bool:
        """Create budget ``child`` funded by ``amount`` held in ``parent`` (None: unlimited,
        only under an unlimited parent). False when the parent cannot spare it."""
        with self.transaction() as rows:
            p = _open_account(rows, parent)
            if rows.get(child) is not None:
                raise ValueError(f"budget {child!r} already exists")
            if amount is None and p.cap is not None:
                raise ValueError(f"budget {parent!r} is capped: a slice of it needs an amount")
            hold = amount if amount is not None else ZERO
            if hold < 0 or (p.cap is not None and p.spent + p.reserved + hold > p.cap):
                return False
            rows.put(replace(p, reserved=p.reserved + hold))
            rows.put(Account(child, amount, parent=parent, parent_hold=rows.hold(parent, hold)))
            return True

    def close(self, name: str) -> Account:
        """Roll a carved budget up into its parent: the parent's hold becomes the child's
        spend plus whatever the child still holds (a call in flight stays paid for)."""
        with self.transaction() as rows:
            a = _open_account(rows, name)
            if a.parent_hold is not None:
                held = rows.take(a.parent_hold)
                if held is not None:
                    parent_name, amount = held
                    p = rows.get(parent_name)
                    assert p is not None
                    used = a.spent + a.reserved
                    rows.put(replace(p, reserved=p.reserved - amount, spent=p.spent + used))
            a = replace(a, closed=True)
            rows.put(a)
            return a


def reserve_in(rows: Rows, a: Account, amount: Decimal) -> int | None:
    """Inside a transaction: hold ``amount`` in ``a`` (as read in it); None when that
    would exceed the cap."""
    if amount < 0:
        raise ValueError(f"a reservation cannot be negative ({amount})")
    if a.cap is not None and a.spent + a.reserved + amount > a.cap:
        return None
    rows.put(replace(a, reserved=a.reserved + amount))
    return rows.hold(a.name, amount)


def settle_in(rows: Rows, hold_id: int, actual: Decimal) -> Decimal:
    """Inside a transaction: replace a reservation by what was spent; the overrun."""
    held = rows.take(hold_id)
    if held is None:
        raise KeyError(f"reservation {hold_id} is already settled")
    name, amount = held
    a = rows.get(name)
    assert a is not None
    overrun = max(actual - amount, ZERO)
    rows.put(
        replace(
            a, reserved=a.reserved - amount, spent=a.spent + actual, overrun=a.overrun + overrun
        )
    )
    return overrun


def _open_account(rows: Rows, name: str) -> Account:
    a = rows.get(name)
    if a is None:
        raise KeyError(f"no budget {name!r}")
    if a.closed:
        raise ValueError(f"budget {name!r} is closed")
    return a


class MemoryBudgetStore(BudgetStore):
    """In-process accounting. Each operation holds one lock for its whole read-modify-write,
    so no interleaving of asyncio tasks (or threads) can overdraw a budget."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._accounts: dict[str, Account] = {}
        self._holds: dict[int, tuple[str, Decimal]] = {}
        self._next = 1

    @contextmanager
    def transaction(self) -> Iterator[Rows]:
        with self._lock:
            yield _MemoryRows(self)


class _MemoryRows:
    def __init__(self, store: MemoryBudgetStore) -> None:
        self.s = store

    def get(self, name: str) -> Account | None:
        return self.s._accounts.get(name)

    def put(self, account: Account) -> None:
        self.s._accounts[account.name] = account

    def hold(self, name: str, amount: Decimal) -> int:
        hold_id, self.s._next = self.s._next, self.s._next + 1
        self.s._holds[hold_id] = (name, amount)
        return hold_id

    def take(self, hold_id: int) -> tuple[str, Decimal] | None:
        return self.s._holds.pop(hold_id, None)


class Budget:
    """A handle on one budget in a store. ``Budget(cap)`` is a fresh in-memory root."""

    def __init__(
        self,
        cap: Decimal | None = None,
        *,
        store: BudgetStore | None = None,
        name: str = "main",
        top_up: Callable[[Decimal | None], Decimal | None] | None = None,
    ) -> None:
        self.store = store or MemoryBudgetStore()
        self.name = name
        self.store.open(name, cap)
        # Where a larger cap may come from when this one is reached (a person raised it
        # while the run was paused): called with the current cap, returns the cap to use.
        self._top_up = top_up

    @classmethod
    def _attached(cls, store: BudgetStore, name: str) -> Budget:
        b = cls.__new__(cls)
        b.store, b.name, b._top_up = store, name, None
        return b

    def top_up(self) -> bool:
        """Raise the cap from ``top_up`` if it offers more; True if it did."""
        if self._top_up is None:
            return False
        cap = self._top_up(self.cap)
        if cap is None or (self.cap is not None and cap <= self.cap):
            return False
        self.raise_cap(cap)
        return True

    @property
    def state(self) -> Account:
        return self.store.account(self.name)

    @property
    def cap(self) -> Decimal | None:
        return self.state.cap

    @property
    def spent(self) -> Decimal:
        return self.state.spent

    @property
    def reserved(self) -> Decimal:
        return self.state.reserved

    @property
    def available(self) -> Decimal | None:
        return self.state.available

    def raise_cap(self, cap: Decimal) -> None:
        """A larger cap for this (root) budget: what is spent and held stays as it is."""
        with self.store.transaction() as rows:
            a = _open_account(rows, self.name)
            if a.cap is not None and cap < a.cap:
                raise ValueError(f"budget {self.name!r}: {cap} is below its cap {a.cap}")
            rows.put(replace(a, cap=cap))

    def reserve(self, amount: Decimal) -> Reservation | None:
        """Hold ``amount`` for a call; None when that would exceed the cap."""
        hold_id = self.store.reserve(self.name, amount)
        return None if hold_id is None else Reservation(amount, hold_id)

    def settle(self, r: Reservation, actual: Decimal) -> Decimal:
        """Returns the overrun beyond the reservation (0 unless an estimate was wrong)."""
        return self.store.settle(r.id, actual)

    def release(self, r: Reservation) -> None:
        self.store.settle(r.id, ZERO)

    def carve(self, amount: Decimal | None, label: str) -> Budget | None:
        """A slice of this budget for ``label`` (a sub-agent, the wrap-up); None when this
        budget cannot spare ``amount``. Unlimited budgets give unlimited slices when
        ``amount`` is None. The slice's name is ``label`` made unique in the store, which
        other processes may share."""
        if amount is None and self.cap is not None:
            amount = self.available
        name = f"{self.name}/{label}#{uuid.uuid4().hex[:12]}"
        if not self.store.carve(self.name, name, amount):
            return None
        return Budget._attached(self.store, name)

    def close(self) -> Account:
        """Fold this slice's spend into the parent and return the final account."""
        return self.store.close(self.name)

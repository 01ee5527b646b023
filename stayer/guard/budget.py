"""A cost budget that is reserved before a call and settled after it.

Checking spend after a call lets the call that crosses the cap through; reserving the
call's worst-case cost first (whole prompt billed at the dearest input rate, plus the full
``max_tokens`` of output) means the cap is never overshot. Reservation and settlement are
synchronous, so they are atomic across the asyncio tasks of one process.
"""

from __future__ import annotations

from dataclasses import dataclass
from decimal import Decimal


@dataclass
class Reservation:
    amount: Decimal


class Budget:
    def __init__(self, cap: Decimal | None) -> None:
        self.cap = cap
        self.spent = Decimal(0)
        self.reserved = Decimal(0)

    @property
    def available(self) -> Decimal | None:
        return None if self.cap is None else self.cap - self.spent - self.reserved

    def reserve(self, amount: Decimal) -> Reservation | None:
        """Hold ``amount`` for a call; None when that would exceed the cap."""
        if self.cap is not None and self.spent + self.reserved + amount > self.cap:
            return None
        self.reserved += amount
        return Reservation(amount)

    def settle(self, r: Reservation, actual: Decimal) -> None:
        self.reserved -= r.amount
        self.spent += actual

    def release(self, r: Reservation) -> None:
        self.reserved -= r.amount

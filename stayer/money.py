"""Money: US dollars as ``Decimal``, where an amount may be unknown (a call with no price
data). One unpriced call makes a total unknown, never 0: ``Usd``'s ``+`` keeps unknown
unknown, so sums need not say it each time.

JSON carries an amount as a decimal string and an unknown one as ``"unknown"``
(DESIGN.md); people see ``$0.012345`` (``format``).
"""

from __future__ import annotations

from collections.abc import Iterable
from decimal import Decimal

#: Prices are quoted per million tokens.
MTOK = Decimal(1_000_000)
ZERO = Decimal(0)

UNKNOWN = "unknown"


def plain(d: Decimal) -> str:
    """A Decimal as a plain (never scientific) string, trailing zeros dropped: how JSON
    carries an amount."""
    d = d.normalize()
    return format(d, "f") if d else "0"


def amount_json(amount: Decimal | None) -> str:
    """An amount's JSON form: plain, trailing zeros dropped; ``"unknown"`` for None. (A
    function as well as ``Usd.to_json``: an audit writes tens of thousands of amounts.)"""
    return UNKNOWN if amount is None else plain(amount)


class Usd:
    """An amount of US dollars; ``amount`` None: unknown. (A plain class, not a dataclass:
    the record codec writes it as its JSON text, ``to_json``.)"""

    __slots__ = ("amount",)
    amount: Decimal | None

    def __init__(self, amount: Decimal | None = Decimal(0)) -> None:
        object.__setattr__(self, "amount", amount)

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError("Usd is immutable")

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Usd) and self.amount == other.amount

    def __hash__(self) -> int:
        return hash(self.amount)

    def __repr__(self) -> str:
        return f"Usd(amount={self.amount!r})"

    @classmethod
    def parse(cls, text: str | Decimal | None) -> Usd:
        """From a JSON value: a decimal string (or a Decimal), or ``"unknown"`` / None."""
        if text is None or text == UNKNOWN:
            return cls(None)
        return cls(Decimal(text))

    @property
    def known(self) -> bool:
        return self.amount is not None

    def __add__(self, other: Usd | Decimal | None) -> Usd:
        """Unknown stays unknown: either side unknown makes the sum unknown."""
        more = other.amount if isinstance(other, Usd) else other
        if self.amount is None or more is None:
            return Usd(None)
        return Usd(self.amount + more)

    __radd__ = __add__

    def to_json(self) -> str:
        """A price's JSON form: plain, trailing zeros dropped (``Cost.to_json``)."""
        return amount_json(self.amount)

    def __str__(self) -> str:
        """A total's JSON form, as totals have always been written: the Decimal's own text."""
        return UNKNOWN if self.amount is None else str(self.amount)

    def format(self) -> str:
        """For people, one precision everywhere: ``$0.012345``, or ``unknown``."""
        return UNKNOWN if self.amount is None else f"${self.amount:,.6f}"


def usd_sum(amounts: Iterable[Usd | Decimal | None]) -> Usd:
    """The total of ``amounts``; unknown if any of them is."""
    total = Usd()
    for a in amounts:
        total += a
    return total


def usd_argument(value: Decimal | str | int | float | None, what: str) -> Decimal | None:
    """An amount handed to the Python API (``max_cost=``): exact, finite; None stays None.
    A float goes through its shortest text (``0.1`` is 0.1, not 0.1000000000000000055…)."""
    from decimal import InvalidOperation

    from stayer.errors import ConfigError

    if value is None:
        return None
    if isinstance(value, bool):
        raise ConfigError(f"{what}: expected an amount of USD, got {value!r}")
    try:
        amount = Decimal(str(value))
    except InvalidOperation:
        raise ConfigError(f"{what}: expected an amount of USD, got {value!r}") from None
    if not amount.is_finite():
        raise ConfigError(f"{what} {value!r}: not a finite number")
    return amount

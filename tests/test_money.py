"""Usd: sums keep an unknown amount unknown; JSON and people forms."""

from __future__ import annotations

from decimal import Decimal

from stayer.money import Usd, usd_sum
from stayer.pricing import Cost


def test_one_unknown_amount_makes_the_sum_unknown_whatever_its_place() -> None:
    known = [Usd.parse("0.25"), Decimal("0.5"), Usd(Decimal("0.125"))]
    assert usd_sum(known) == Usd(Decimal("0.875"))
    for i in range(len(known) + 1):
        amounts = [*known[:i], None, *known[i:]]
        assert not usd_sum(amounts).known
    assert (Usd.parse("unknown") + Decimal(1)).amount is None
    assert usd_sum([]) == Usd(Decimal(0))


def test_json_forms_round_trip_and_match_a_price() -> None:
    assert Usd.parse("unknown").to_json() == "unknown" == str(Usd(None))
    tiny = Decimal("0.0000001")
    assert Usd(tiny).to_json() == "0.0000001"  # never scientific
    assert Usd(Decimal("0.2500")).to_json() == "0.25"
    assert Usd.parse(Usd(tiny).to_json()) == Usd(tiny)
    cost = Cost(Decimal("0.0125"), Decimal("0.01"), Decimal("0.0025"), "m", "p", None)
    assert cost.to_json() == Usd(cost.total).to_json()
    # a total keeps Decimal's own text, as totals have always been written
    assert str(Usd.parse("0.10") + Decimal("0.20")) == "0.30"


def test_people_see_one_precision_and_unknown_as_such() -> None:
    assert Usd.parse("1234.5").format() == "$1,234.500000"
    assert Usd.parse(None).format() == "unknown"

"""Who spent what: the ledger's cost and usage rolled up per agent of the parent–child tree.

Ledger entries carry their agent's path (``main``, ``main/sub-1``, ``main/sub-1/sub-2``), so
the tree is in the paths themselves: an agent's parent is its path minus the last part.
Each ``AgentCost`` has the agent's own spend (``cost_usd``) and, with its descendants, the
``subtree_cost_usd`` that its budget paid for; an unpriced step makes both unknown.
"""

from __future__ import annotations

from collections.abc import Iterable
from decimal import Decimal
from typing import Any, Protocol

import msgspec
from msgspec import UNSET, UnsetType

from stayer.money import Usd, usd_sum
from stayer.pricing import Cost
from stayer.records import Record, from_json
from stayer.usage import Usage


class AgentCost(Record, kw_only=True):
    """One agent's row of a run's ``agents``."""

    agent: str
    parent: str | None
    steps: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    # Totals as the run's ``cost_usd`` is written (``Usd``'s text; "unknown" if unpriced).
    cost: str = msgspec.field(default="0", name="cost_usd")
    subtree_cost: str = msgspec.field(default="0", name="subtree_cost_usd")


class _Priced(Protocol):
    @property
    def cost(self) -> Usd | UnsetType: ...


class Spend(Protocol):
    """What attribution reads of a ledger entry (``stayer.ledger.LedgerEntry`` has it)."""

    @property
    def agent(self) -> str: ...
    @property
    def kind(self) -> str | UnsetType: ...
    @property
    def usage(self) -> Usage: ...
    @property
    def cost(self) -> Cost: ...
    @property
    def compaction(self) -> _Priced | None | UnsetType: ...


class _CompactionSpend(Record):
    cost: Usd | UnsetType = msgspec.field(default=UNSET, name="cost_usd")


class _EntrySpend(Record, kw_only=True):
    """A ledger entry's JSON, read for what attribution needs (a missing cost: unknown)."""

    agent: str = "main"
    kind: str | UnsetType = UNSET
    usage: Usage = msgspec.field(default_factory=Usage)
    cost: Cost = msgspec.field(default=Cost(None, None, None, ""), name="cost_usd")
    compaction: _CompactionSpend | None | UnsetType = UNSET


def per_agent(entries: Iterable[Spend | dict[str, Any]]) -> list[AgentCost]:
    """``entries``: ledger entries, or their JSON documents."""
    rows: dict[str, AgentCost] = {}
    spent: dict[str, Usd] = {}
    for entry in entries:
        e = from_json(entry, _EntrySpend) if isinstance(entry, dict) else entry
        row = rows.get(e.agent)
        if row is None:
            row = rows[e.agent] = AgentCost(
                agent=e.agent, parent=e.agent.rpartition("/")[0] or None
            )
        if e.kind != "lost_in_flight":
            row.steps += 1
        row.input_tokens += e.usage.input_tokens
        row.output_tokens += e.usage.output_tokens
        compaction = e.compaction.cost if e.compaction else UNSET
        # Each amount as the ledger's JSON writes it (trailing zeros dropped), so a row's
        # total reads as the sum of its entries' cost_usd.
        spent[e.agent] = (
            spent.get(e.agent, Usd())
            + Usd.parse(e.cost.to_json())
            + (Usd.parse(compaction.to_json()) if isinstance(compaction, Usd) else Decimal(0))
        )
    for path, row in rows.items():
        row.cost = str(spent[path])
        row.subtree_cost = str(
            usd_sum(
                c for other, c in spent.items() if other == path or other.startswith(path + "/")
            )
        )
    return sorted(rows.values(), key=lambda r: r.agent)

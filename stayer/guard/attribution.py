"""Who spent what: the ledger's cost and usage rolled up per agent of the parent–child tree.

Ledger entries carry their agent's path (``main``, ``main/sub-1``, ``main/sub-1/sub-2``), so
the tree is in the paths themselves: an agent's parent is its path minus the last part.
Each row has the agent's own spend (``cost_usd``) and, with its descendants, the
``subtree_cost_usd`` that its budget paid for.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from decimal import Decimal
from typing import Any


def per_agent(entries: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    rows: dict[str, dict[str, Any]] = {}
    for e in entries:
        path = e.get("agent", "main")
        row = rows.setdefault(
            path,
            {
                "agent": path,
                "parent": path.rpartition("/")[0] or None,
                "steps": 0,
                "input_tokens": 0,
                "output_tokens": 0,
                "cost": Decimal(0),
            },
        )
        if e.get("kind") != "lost_in_flight":
            row["steps"] += 1
        usage = e.get("usage", {})
        row["input_tokens"] += int(usage.get("input_tokens", 0))
        row["output_tokens"] += int(usage.get("output_tokens", 0))
        for cost in (e.get("cost_usd"), (e.get("compaction") or {}).get("cost_usd", "0")):
            row["cost"] = (
                None
                if row["cost"] is None or cost in (None, "unknown")
                else row["cost"] + Decimal(cost)
            )
    out = []
    for path, row in sorted(rows.items()):
        subtree: Decimal | None = Decimal(0)
        for other, r in rows.items():
            if other == path or other.startswith(path + "/"):
                subtree = None if subtree is None or r["cost"] is None else subtree + r["cost"]
        cost = row.pop("cost")
        row["cost_usd"] = "unknown" if cost is None else str(cost)
        row["subtree_cost_usd"] = "unknown" if subtree is None else str(subtree)
        out.append(row)
    return out

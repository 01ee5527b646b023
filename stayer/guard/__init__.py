"""Spend that never overshoots a cap, and runs that end with a summary instead of nothing.

* ``budget`` — budgets reserved before a call and settled after it; nesting (slices for
  sub-agents and the wrap-up); atomic in-process (``MemoryBudgetStore``) and across
  processes (``shared.SqliteBudgetStore``);
* ``reserve`` — a call's worst-case cost;
* ``breakers`` — limits with soft thresholds, and behaviour breakers (tool errors, loops,
  no progress, cost anomalies);
* ``guard`` — the object the loop asks before and after each step; ``wrapup`` — the
  wrap-up instruction and the summary built from the trajectory;
* ``attribution`` — cost per agent of the parent–child tree.
"""

from stayer.guard.breakers import GuardConfig, Trip
from stayer.guard.budget import Budget, BudgetStore, MemoryBudgetStore, Reservation
from stayer.guard.guard import Guard
from stayer.guard.shared import SqliteBudgetStore

__all__ = [
    "Budget",
    "BudgetStore",
    "Guard",
    "GuardConfig",
    "MemoryBudgetStore",
    "Reservation",
    "SqliteBudgetStore",
    "Trip",
]

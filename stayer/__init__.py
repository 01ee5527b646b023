"""stayer: a harness and runtime for long-horizon LLM agents that finish the job within budget.

The public Python API is the names in ``__all__``; everything else may change. Before 1.0,
these may change too, but only with a note in the changelog: ``meter`` and ``Budget`` (the
library door to the metering engine), ``Session``, ``BudgetExceeded``. They are imported
when first used, so ``import stayer`` stays light.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from stayer._version import __version__

if TYPE_CHECKING:
    from stayer.errors import BudgetExceeded as BudgetExceeded
    from stayer.sdk import Budget as Budget
    from stayer.sdk import Session as Session
    from stayer.sdk import meter as meter

__all__ = ["Budget", "BudgetExceeded", "Session", "__version__", "meter"]

_LAZY = {
    "Budget": "stayer.sdk",
    "Session": "stayer.sdk",
    "meter": "stayer.sdk",
    "BudgetExceeded": "stayer.errors",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'stayer' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)

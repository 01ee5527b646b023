"""stayer: a harness and runtime for long-horizon LLM agents that finish the job within budget.

The public Python API is the names in ``__all__``; everything else may change. Before 1.0,
these may change too, but only with a note in the changelog: ``meter``, ``Budget``,
``Session`` (the library door to the metering engine), ``run_task``/``eval`` (``stayer
run``/``eval`` from code) and their results, ``Agent`` (the loop; its constructor is being
reworked), the errors. They are imported when first used, so ``import stayer`` stays light.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from stayer._version import __version__

if TYPE_CHECKING:
    from stayer.agent import Agent as Agent
    from stayer.errors import BudgetExceeded as BudgetExceeded
    from stayer.errors import ConfigError as ConfigError
    from stayer.eval.engine import EvalOutcome as EvalOutcome
    from stayer.eval.engine import evaluate as eval  # noqa: A004
    from stayer.library import RunOutcome as RunOutcome
    from stayer.library import run_task as run_task
    from stayer.sdk import Budget as Budget
    from stayer.sdk import Session as Session
    from stayer.sdk import meter as meter

__all__ = [
    "Agent",
    "Budget",
    "BudgetExceeded",
    "ConfigError",
    "EvalOutcome",
    "RunOutcome",
    "Session",
    "__version__",
    "eval",
    "meter",
    "run_task",
]

_LAZY = {
    "Agent": "stayer.agent",
    "ConfigError": "stayer.errors",
    "EvalOutcome": "stayer.eval.engine",
    "RunOutcome": "stayer.library",
    "run_task": "stayer.library",
    "Budget": "stayer.sdk",
    "Session": "stayer.sdk",
    "meter": "stayer.sdk",
    "BudgetExceeded": "stayer.errors",
}


def __getattr__(name: str) -> Any:
    if name == "eval":  # the package stayer.eval, callable: stayer.eval.engine.evaluate
        return importlib.import_module("stayer.eval")
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'stayer' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)

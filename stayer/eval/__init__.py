"""Evaluation: suites of tasks × configurations × epochs, verified and summarised.

``stayer.eval(suite, models=[…], …)`` is ``stayer.eval.engine.evaluate``: the package
itself is callable, since ``stayer.eval`` names both this package and that function.
"""

from __future__ import annotations

import sys
import types
from typing import Any


class _CallableModule(types.ModuleType):
    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        from stayer.eval.engine import evaluate

        return evaluate(*args, **kwargs)


sys.modules[__name__].__class__ = _CallableModule

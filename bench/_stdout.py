"""``--json``: a bench script's stdout is exactly one JSON document.

``json_only(True)`` points file descriptor 1 at stderr for the rest of the process (so
tables, progress and child processes' output all go there) and returns ``emit``, which
writes the one document to the real stdout. ``json_only(False)`` changes nothing and its
``emit`` writes nothing: the script prints its tables as usual.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable
from typing import Any


def json_only(enabled: bool) -> Callable[[Any], None]:
    if not enabled:
        return lambda doc: None
    sys.stdout.flush()
    real = os.dup(1)
    os.dup2(2, 1)  # print() and children alike now write to stderr

    def emit(doc: Any) -> None:
        sys.stdout.flush()
        with os.fdopen(real, "w", closefd=True) as out:
            out.write(json.dumps(doc, indent=2, default=str) + "\n")

    return emit

"""The provider simulator these examples talk to: ``$STAYER_SIM_URL`` when set, else
``stayer sim serve`` started here (stopped at exit). Offline: it prices and caches like
the real APIs, and answers ``echo: <the last user text>``."""

from __future__ import annotations

import atexit
import os
import subprocess
import sys
from collections.abc import Awaitable
from decimal import Decimal

import stayer


def sim_url() -> str:
    if os.environ.get("STAYER_SIM_URL"):
        return os.environ["STAYER_SIM_URL"]
    proc = subprocess.Popen(
        [sys.executable, "-m", "stayer.cli", "sim", "serve", "--port", "0"],
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "COLUMNS": "300"},
    )
    atexit.register(proc.terminate)
    assert proc.stderr is not None
    line = proc.stderr.readline()  # "… on http://127.0.0.1:PORT …" once it listens
    return line.split(" on ", 1)[1].split()[0]


def check(session: stayer.Session, budget: stayer.Budget) -> None:
    """Print the cost, and check it against the session's ledger (``stayer report``)."""
    ledger = session.ledger
    cost = sum((Decimal(e["cost_usd"]) for e in ledger), Decimal(0))
    print(f"session {session.id}: {len(ledger)} calls, cost ${budget.spent}")
    assert ledger and all(e["complete"] for e in ledger), ledger
    assert cost == budget.spent == Decimal(session.report()["totals"]["cost_usd"]) > 0


async def refused(run: Awaitable[object]) -> None:
    """Check that ``run`` stops with ``BudgetExceeded`` (nothing sent) and say so."""
    try:
        await run
    except stayer.BudgetExceeded as e:
        print(f"refused: {e}")
    else:
        raise AssertionError("a run over its budget was sent")

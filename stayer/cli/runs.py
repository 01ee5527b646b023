"""``stayer runs``: the runs in the journal, newest first."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.table import Table
from rich.text import Text

from stayer.cli.common import JsonFlag, app, bad_input, console, emit_json
from stayer.errors import ConfigError


@app.command()
def runs(
    limit: Annotated[int, typer.Option("--limit", help="Show at most this many runs.")] = 50,
    json_out: JsonFlag = False,
) -> None:
    """List runs: id, task, model, status, steps, cost, started, updated."""
    from stayer.eval.trial import stayer_home
    from stayer.journal import open_store
    from stayer.journal.lease import run_status
    from stayer.settings import ListSettings, check_flags

    try:
        check_flags(ListSettings, {"limit": limit})
        store = open_store(stayer_home(), create=False)
        rows = [] if store is None else store.runs(limit)
    except ConfigError as e:
        bad_input(str(e))
    docs = [{**r.to_dict(), "status": run_status(r)} for r in rows]
    if json_out:
        emit_json({"store": store.location if store else None, "runs": docs})
        return
    out = console()
    if not docs:
        out.print("no runs yet", highlight=False)
        return
    t = Table("id", "task", "model", "status", "steps", "cost (USD)", "started", "updated")
    for d in docs:
        t.add_row(*(Text(str(v)) for v in (
            d["id"], d["task"], d["model"], d["status"], d["steps"], d["cost_usd"],
            d["started"][:19].replace("T", " "), d["updated"][:19].replace("T", " "),
        )))
    out.print(t)

"""``stayer runs``: the runs in the journal, newest first."""

from __future__ import annotations

from typing import Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from stayer.cli.common import EXIT_BAD_INPUT, JsonFlag, app, bad_input, emit_json, stderr
from stayer.errors import ConfigError


@app.command()
def runs(
    limit: Annotated[int, typer.Option("--limit", help="Show at most this many runs.")] = 50,
    json_out: JsonFlag = False,
) -> None:
    """List runs: id, task, model, status, steps, cost, started, updated.

    Each listed run's journal is read through: a corrupt one is listed as ``corrupt``, its
    one-line error goes to stderr, and the command exits 2."""
    from stayer.eval.trial import stayer_home
    from stayer.journal import JournalCorrupt, load_log, open_store
    from stayer.journal.lease import run_status

    if limit < 1:
        bad_input(f"--limit {limit}: must be at least 1")
    try:
        store = open_store(stayer_home(), create=False)
        rows = [] if store is None else store.runs(limit)
        docs: list[dict[str, Any]] = []
        corrupt: list[str] = []
        for r in rows:
            status = run_status(r)
            try:
                load_log(store, r.id)  # type: ignore[arg-type]  (rows exist only with a store)
            except JournalCorrupt as e:
                status = "corrupt"
                corrupt.append(str(e))
            docs.append({**r.to_dict(), "status": status})
    except ConfigError as e:
        bad_input(str(e))
    _show(docs, store.location if store else None, json_out)
    if corrupt:
        err = stderr()
        for line in corrupt:
            err.print(f"[bold red]error:[/] {escape(line)}", highlight=False, soft_wrap=True)
        raise typer.Exit(EXIT_BAD_INPUT)


def _show(docs: list[dict[str, Any]], location: str | None, json_out: bool) -> None:
    if json_out:
        emit_json({"store": location, "runs": docs})
        return
    console = Console()
    if not docs:
        console.print("no runs yet", highlight=False)
        return
    t = Table("id", "task", "model", "status", "steps", "cost (USD)", "started", "updated")
    for d in docs:
        t.add_row(
            d["id"], d["task"], d["model"], d["status"], str(d["steps"]), d["cost_usd"],
            d["started"][:19].replace("T", " "), d["updated"][:19].replace("T", " "),
        )
    console.print(t)

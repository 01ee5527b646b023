"""``stayer runs``: the runs in the journal, newest first."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any

import typer

from stayer.cli.common import (
    EXIT_BAD_INPUT,
    JsonFlag,
    app,
    bad_input,
    emit_json,
    error_line,
    parse_since,
    usd,
)
from stayer.errors import ConfigError
from stayer.journal.lease import SHOWN_STATUSES

if TYPE_CHECKING:
    from rich.console import Console

# What a run's row says (``run_status``), and ``corrupt``: a journal that cannot be read.
STATUSES = (*SHOWN_STATUSES, "corrupt")
# Dropped first to last when the terminal is too narrow: the id is what people copy, so it
# is never cut.
DROPPABLE = ("updated", "steps", "started", "task", "model", "cost (USD)")


@app.command()
def runs(
    limit: Annotated[int, typer.Option("--limit", help="Show at most this many runs.")] = 50,
    status: Annotated[
        str | None,
        typer.Option("--status", help=f"Only runs with this status: {', '.join(STATUSES)}."),
    ] = None,
    task: Annotated[
        str | None, typer.Option("--task", help="Only runs whose task name contains this text.")
    ] = None,
    model: Annotated[
        str | None, typer.Option("--model", help="Only runs whose model contains this text.")
    ] = None,
    since: Annotated[
        str | None,
        typer.Option("--since", help="Only runs started on or after this UTC date (YYYY-MM-DD)."),
    ] = None,
    json_out: JsonFlag = False,
) -> None:
    """List runs, newest first: id, task, model, status, steps, cost, started, updated.

    Looks in $STAYER_HOME (default ./.stayer) or the database STAYER_DB names, and says which.

    \b
    Example:  stayer runs --status failed --since 2026-01-01
    """
    from stayer.journal.backends import open_store, stayer_home
    from stayer.journal.lease import run_status

    if not 1 <= limit <= 1_000_000:
        # ListSettings (pydantic) says why; a limit in its bounds does not pay for the import.
        from stayer.settings import ListSettings, check_flags

        try:
            check_flags(ListSettings, {"limit": limit})
        except ConfigError as e:
            bad_input(str(e))
    if status is not None and status not in STATUSES:
        bad_input(f"--status {status!r}: expected one of {', '.join(STATUSES)}")
    since_ts = parse_since(since)
    try:
        store = open_store(stayer_home(), create=False)
        rows = [] if store is None else store.runs(None)
    except ConfigError as e:
        bad_input(str(e))
    where = store.location if store else str(stayer_home().absolute() / "stayer.db")
    docs = [{**r.to_dict(), "status": run_status(r)} for r in rows]
    total = len(docs)
    docs = [d for d in docs if matches(d, status, task, model, since_ts)][:limit]
    corrupt = mark_corrupt(store, docs)
    if json_out:
        emit_json({"store": store.location if store else None, "runs": docs})
    else:
        show(
            docs,
            total,
            store is not None,
            where,
            (("status", status), ("task", task), ("model", model), ("since", since)),
        )
    if corrupt:
        for line in corrupt:
            error_line(line)
        raise typer.Exit(EXIT_BAD_INPUT)


def mark_corrupt(store: Any, docs: list[dict[str, Any]]) -> list[str]:
    """Read each listed run's journal through: a damaged one is listed as ``corrupt``; its
    one-line error is returned, to be said after the listing (the command then exits 2)."""
    from stayer.journal import JournalCorrupt, load_log

    errors = []
    for d in docs:
        try:
            load_log(store, d["id"])
        except JournalCorrupt as e:
            d["status"] = "corrupt"
            errors.append(str(e))
    return errors


def show(docs: list[dict[str, Any]], total: int, found: bool, where: str, filters: Any) -> None:
    from rich.console import Console
    from rich.markup import escape

    console = Console(emoji=False)
    if not found:
        console.print(
            f"no runs yet: no journal at {escape(where)} (set STAYER_HOME or STAYER_DB to look elsewhere)",
            highlight=False,
            soft_wrap=True,
        )
        return
    if docs:
        print_table(console, docs)
    said = ", ".join(f"{k} {v}" for k, v in filters if v)
    shown = f"{len(docs)} of {total} run(s)" + (f" matching {said}" if said else "")
    console.print(f"{escape(shown)} in {escape(where)}", highlight=False, soft_wrap=True)


def matches(
    doc: dict[str, Any],
    status: str | None,
    task: str | None,
    model: str | None,
    since_ts: float | None,
) -> bool:
    from datetime import datetime

    if status is not None and doc["status"] != status:
        return False
    if task is not None and task not in doc["task"]:
        return False
    if model is not None and model not in doc["model"]:
        return False
    return since_ts is None or datetime.fromisoformat(doc["started"]).timestamp() >= since_ts


def print_table(console: Console, docs: list[dict[str, Any]]) -> None:
    from rich.markup import escape
    from rich.table import Table

    cells = {
        "id": [d["id"] for d in docs],
        "task": [d["task"] for d in docs],
        "model": [d["model"] for d in docs],
        "status": [d["status"] for d in docs],
        "steps": [str(d["steps"]) for d in docs],
        "cost (USD)": [usd(d["cost_usd"]) for d in docs],
        "started": [d["started"][:19].replace("T", " ") for d in docs],
        "updated": [d["updated"][:19].replace("T", " ") for d in docs],
    }
    widths = {k: max(len(k), *(len(v) for v in vs)) for k, vs in cells.items()}
    columns = list(cells)
    for name in DROPPABLE:
        if sum(widths[c] + 3 for c in columns) + 1 <= console.width:
            break
        columns.remove(name)
    t = Table()
    for c in columns:
        t.add_column(c, no_wrap=True, min_width=widths[c] if c == "id" else None)
    for i in range(len(docs)):
        t.add_row(*(escape(cells[c][i]) for c in columns))
    console.print(t)

"""``stayer runs``: the runs in the journal, newest first."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any

import typer

from stayer.cli.common import (
    EXIT_BAD_INPUT,
    JsonFlag,
    bad_input,
    emit_json,
    error_line,
    parse_since,
    sub_app,
    usd,
)
from stayer.cli.options import DryRunOption, older_than_option, since_option
from stayer.errors import ConfigError
from stayer.journal.lease import SHOWN_STATUSES

if TYPE_CHECKING:
    from rich.console import Console

    from stayer.journal.store import RunListing

# What a run's row says (``run_status``), and ``corrupt``: a journal that cannot be read.
STATUSES = (*SHOWN_STATUSES, "corrupt")
StatusOption = Annotated[  # of `stayer runs` and `stayer runs prune`
    str | None,
    typer.Option("--status", help=f"Only runs with this status: {', '.join(STATUSES)}."),
]
# Dropped first to last when the terminal is too narrow: the id is what people copy, so it
# is never cut.
DROPPABLE = ("updated", "steps", "started", "task", "model", "cost (USD)")


RUNS_HELP = """List runs, newest first: id, task, model, status, steps, cost, started, updated.

    Looks in $STAYER_HOME (default ./.stayer) or the database STAYER_DB names, and says which.
    `stayer runs prune` deletes runs.

    \b
    Example:  stayer runs --status failed --since 2026-01-01
    """
# A group that lists when no command follows: ``stayer runs`` and ``stayer runs prune``.
runs_app = sub_app("runs", RUNS_HELP, no_args_is_help=False, invoke_without_command=True)


@runs_app.callback()
def runs(
    ctx: typer.Context,
    limit: Annotated[int, typer.Option("--limit", help="Show at most this many runs.")] = 50,
    status: StatusOption = None,
    task: Annotated[
        str | None, typer.Option("--task", help="Only runs whose task name contains this text.")
    ] = None,
    model: Annotated[
        str | None, typer.Option("--model", help="Only runs whose model contains this text.")
    ] = None,
    since: Annotated[str | None, since_option("runs started")] = None,
    json_out: JsonFlag = False,
) -> None:
    """The runs in the journal (RUNS_HELP is the help text)."""
    if ctx.invoked_subcommand is not None:
        return
    from stayer.journal.backends import open_store, stayer_home
    from stayer.journal.lease import run_status
    from stayer.records import to_json

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
    docs = [r.listing(run_status(r)) for r in rows]
    total = len(docs)
    docs = [d for d in docs if matches(d, status, task, model, since_ts)][:limit]
    corrupt = mark_corrupt(store, docs)
    if json_out:
        emit_json({"store": store.location if store else None, "runs": to_json(docs)})
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


def mark_corrupt(store: Any, docs: list[RunListing]) -> list[str]:
    """Read each listed run's journal through: a damaged one is listed as ``corrupt``; its
    one-line error is returned, to be said after the listing (the command then exits 2)."""
    from stayer.journal import JournalCorrupt, load_log

    errors = []
    for d in docs:
        try:
            load_log(store, d.id)
        except JournalCorrupt as e:
            d.status = "corrupt"
            errors.append(str(e))
    return errors


def show(docs: list[RunListing], total: int, found: bool, where: str, filters: Any) -> None:
    from stayer.cli.common import console as make_console
    from stayer.tables import say

    console = make_console()
    if not found:
        say(
            console,
            f"no runs yet: no journal at {where} (set STAYER_HOME or STAYER_DB to look elsewhere)",
        )
        return
    if docs:
        print_table(console, docs)
    said = ", ".join(f"{k} {v}" for k, v in filters if v)
    shown = f"{len(docs)} of {total} run(s)" + (f" matching {said}" if said else "")
    say(console, f"{shown} in {where}")


def matches(
    doc: RunListing,
    status: str | None,
    task: str | None,
    model: str | None,
    since_ts: float | None,
) -> bool:
    from datetime import datetime

    if status is not None and doc.status != status:
        return False
    if task is not None and task not in doc.task:
        return False
    if model is not None and model not in doc.model:
        return False
    return since_ts is None or datetime.fromisoformat(doc.started).timestamp() >= since_ts


def print_table(console: Console, docs: list[RunListing]) -> None:
    from stayer import tables
    from stayer.tables import Col, FitTable

    drop = {name: len(DROPPABLE) - i for i, name in enumerate(DROPPABLE)}
    t = FitTable(
        Col("id", whole=True),
        Col("task", drop=drop["task"]),
        Col("model", drop=drop["model"]),
        Col("status"),
        Col("steps", number=True, drop=drop["steps"]),
        Col("cost (USD)", number=True, drop=drop["cost (USD)"]),
        Col("started", number=True, drop=drop["started"]),
        Col("updated", number=True, drop=drop["updated"]),
    )
    for d in docs:
        t.add_row(
            d.id,
            d.task,
            d.model,
            d.status,
            str(d.steps),
            usd(d.cost),
            d.started[:19].replace("T", " "),
            d.updated[:19].replace("T", " "),
        )
    tables.print_table(console, t)


@runs_app.command("prune")
def prune(
    older_than: Annotated[str | None, older_than_option("Runs not updated")] = None,
    status: StatusOption = None,
    keep: Annotated[
        int | None,
        typer.Option("--keep", metavar="N", help="Never the N most recently started runs."),
    ] = None,
    dry_run: DryRunOption = False,
    json_out: JsonFlag = False,
) -> None:
    """Delete runs: their journal (run row and events), the blobs no other run refers to,
    and their directory under $STAYER_HOME/runs. A run that is running is never deleted;
    workspace snapshots are kept. The selectors combine: a run is deleted when it matches
    every one given.

    \b
    Example:  stayer runs prune --older-than 30d --status failed --keep 20 --dry-run
    """
    import time
    from datetime import datetime

    from stayer.cli.images import parse_duration
    from stayer.journal.backends import open_store, stayer_home
    from stayer.journal.lease import run_status

    if older_than is None and status is None and keep is None:
        bad_input("runs prune: say which runs with --older-than, --status or --keep")
    if status is not None and status not in STATUSES:
        bad_input(f"--status {status!r}: expected one of {', '.join(STATUSES)}")
    if status == "running":
        bad_input("--status running: a running run is never deleted")
    if keep is not None and keep < 0:
        bad_input(f"--keep {keep}: expected a number of runs, 0 or more")
    age = None if older_than is None else parse_duration(older_than, "--older-than")
    home = stayer_home()
    try:
        store = open_store(home, create=False)
        rows = [] if store is None else store.runs(None)  # newest first
    except ConfigError as e:
        bad_input(str(e))
    now = time.time()
    chosen = []
    for i, row in enumerate(rows):
        shown = run_status(row)
        if status == "corrupt" and shown != "running" and _is_corrupt(store, row.id):
            shown = "corrupt"
        if shown == "running" or (keep is not None and i < keep):
            continue
        if status is not None and shown != status:
            continue
        if age is not None and now - datetime.fromisoformat(row.updated).timestamp() < age:
            continue
        chosen.append(row)
    done = store.delete_runs([r.id for r in chosen], dry_run=dry_run) if store else None
    deleted = [] if done is None else done.runs
    dirs = [home / "runs" / r for r in deleted if (home / "runs" / r).is_dir()]
    if not dry_run and dirs:
        from stayer.run import delete_run_dir  # the run's workspace lives apart, linked

        for d in dirs:
            if d.is_symlink():
                d.unlink()
            else:
                delete_run_dir(d)
    events, blobs = (done.events, done.blobs) if done else (0, [])
    blob_bytes = done.blob_bytes if done else 0
    if json_out:
        emit_json(
            {
                "store": store.location if store else None,
                "dry_run": dry_run,
                "deleted": deleted,
                "events": events,
                "blobs": len(blobs),
                "blob_bytes": blob_bytes,
                "run_dirs": [str(d) for d in dirs],
                "kept": len(rows) - len(deleted),
            }
        )
        return
    from stayer.cli.common import console
    from stayer.tables import say

    out = console()
    verb = "would delete" if dry_run else "deleted"
    by_id = {r.id: r for r in chosen}
    for run_id in deleted:
        r = by_id[run_id]
        say(out, f"{verb} {run_id} ({run_status(r)}, started {r.started[:19].replace('T', ' ')})")
    say(
        out,
        f"{verb} {len(deleted)} run(s): {events:,} journal events, {len(blobs):,} blobs no "
        f"other run refers to ({blob_bytes:,} bytes), {len(dirs)} run directories; "
        f"kept {len(rows) - len(deleted)} run(s) in {store.location if store else home}",
    )


def _is_corrupt(store: Any, run_id: str) -> bool:
    """Whether the run's journal is damaged before its last write (as `stayer runs` marks)."""
    from stayer.journal import JournalCorrupt, load_log

    try:
        load_log(store, run_id)
    except JournalCorrupt:
        return True
    return False

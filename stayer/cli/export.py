"""``stayer export``: a run in another system's format."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from stayer.cli.common import JsonFlag, bad_input, emit_json, sub_app
from stayer.cli.options import RunIdArgument

export_app = sub_app("export", "Write a run in another system's format.")


@export_app.command("a2a")
def a2a(
    run_id: RunIdArgument,
    out: Annotated[
        str | None, typer.Option("--out", help="Write the tasks to this file instead of stdout.")
    ] = None,
    json_out: JsonFlag = False,
) -> None:
    """The run's threads as Google A2A v0.3 Task objects (one per agent; a team's share a
    contextId): a JSON array, on stdout or in --out.

    \b
    Example:  stayer export a2a 20260101-120000-a1b2c3 --out tasks.json
    """
    from stayer.journal.backends import open_store, stayer_home
    from stayer.journal.lease import run_status
    from stayer.journal.log import load_log
    from stayer.records import to_json
    from stayer.teams.a2a import a2a_tasks

    store = open_store(stayer_home(), create=False)
    try:
        row = None if store is None else store.run(run_id)
        if store is None or row is None:
            where = store.location if store else stayer_home()
            bad_input(f"run {run_id}: no such run in {where}; `stayer runs` lists the runs there")
        tasks = to_json(a2a_tasks(load_log(store, run_id), run_status(row)))
    finally:
        if store is not None:
            store.close()
    if out is None:
        emit_json(tasks)
        return
    import json  # here: every command's start-up imports this module

    target = Path(out)
    tmp = target.with_name(target.name + ".tmp")
    try:
        tmp.write_text(json.dumps(tasks, indent=2))
        tmp.replace(target)
    except OSError as e:
        bad_input(f"--out {out}: cannot write it ({e.strerror or e})")
    if json_out:
        emit_json({"run_id": run_id, "out": str(target), "tasks": len(tasks)})

"""``stayer resume``: continue a run that was killed, without paying again for its model calls."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.text import Text

from stayer.cli.common import (
    EXIT_BAD_INPUT,
    JsonFlag,
    app,
    bad_input,
    console,
    emit_json,
    error_line,
    stderr,
)
from stayer.cli.run import finish, step_printer, summary_table, traced
from stayer.errors import ConfigError


@app.command()
def resume(
    run_id: Annotated[str, typer.Argument(help="Id of the run to continue (see `stayer runs`).")],
    json_out: JsonFlag = False,
) -> None:
    """Continue an interrupted run from its journal: same result as if it had never stopped."""
    from stayer.eval.resume import prepare_resume
    from stayer.journal import RunFinished

    err = stderr()
    try:
        prepared, journal = prepare_resume(run_id)
    except RunFinished as e:
        # Its result, as `stayer run` printed it, after the one-line explanation.
        error_line(str(e))
        if json_out:
            emit_json(e.result)
        else:
            summary_table(e.result, console())
        raise typer.Exit(EXIT_BAD_INPUT) from None
    except ConfigError as e:
        bad_input(str(e))
    err.print(
        Text.assemble(
            ("stayer resume", "bold"),
            f" {prepared.task.name} · {prepared.config.model} · run {prepared.run_id} · "
            f"{len(journal.log.steps)} step(s) journaled",
        )
    )
    finish(lambda: traced(prepared, step_printer(err), None, journal), json_out, prepared.run_id)

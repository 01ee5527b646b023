"""``stayer resume``: continue a run that was killed, without paying again for its model calls."""

from __future__ import annotations

import typer

from stayer.cli.common import EXIT_OK, JsonFlag, app, bad_input, console, emit_json, stderr
from stayer.cli.options import RunIdArgument
from stayer.cli.run import finish, sandbox_line, step_printer, summary_table, traced
from stayer.errors import ConfigError


@app.command()
def resume(
    run_id: RunIdArgument,
    json_out: JsonFlag = False,
) -> None:
    """Continue an interrupted run from its journal: same result as if it had never stopped.

    A run that already finished is not run again: its result is printed (exit 0).

    \b
    Example:  stayer resume 20260101-120000-a1b2c3
    """
    from rich.text import Text

    from stayer.eval.resume import prepare_resume
    from stayer.journal import RunFinished

    err = stderr()
    try:
        prepared, journal = prepare_resume(run_id)
    except RunFinished as e:
        # Not an error: there is nothing left to do. Its result, as `stayer run` printed it.
        err.print(Text(f"{e}; its result:"), highlight=False, soft_wrap=True)
        if json_out:
            emit_json(e.result.to_json())
        else:
            summary_table(e.result, console())
        raise typer.Exit(EXIT_OK) from None
    except ConfigError as e:
        bad_input(str(e))
    err.print(
        Text.assemble(
            ("stayer resume", "bold"),
            f" {prepared.task.name} · {prepared.config.model} · run {prepared.run_id} · "
            f"{len(journal.log.steps)} step(s) journaled",
        )
    )
    err.print(Text(sandbox_line(prepared, "as the run began")))
    finish(
        lambda: traced(prepared, step_printer(err, journal.lost), None, journal),
        json_out,
        prepared.run_id,
    )

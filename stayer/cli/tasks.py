"""``stayer tasks``: check a task suite before trusting it; import Terminal-Bench tasks."""

from __future__ import annotations

from typing import Annotated

import typer

from stayer.cli.common import (
    EXIT_FAILED,
    EXIT_OK,
    JsonFlag,
    bad_input,
    console,
    emit_json,
    stderr,
    sub_app,
)
from stayer.cli.eval import report_problems
from stayer.cli.options import SuiteArgument
from stayer.errors import ConfigError

tasks_app = sub_app("tasks", "Check task suites; import Terminal-Bench tasks.")


@tasks_app.command("check")
def check(
    suite: SuiteArgument,
    reruns: Annotated[
        int,
        typer.Option("--reruns", help="Extra verifications of the oracle's workspace (flakiness)."),
    ] = 3,
    concurrency: Annotated[int, typer.Option("--concurrency", help="Tasks checked at once.")] = 4,
    probes: Annotated[
        bool,
        typer.Option(
            "--probes/--no-probes", help="Run the reward-hack probes (one verification each)."
        ),
    ] = True,
    json_out: JsonFlag = False,
) -> None:
    """Check every task of a suite before trusting it.

    Per task: the oracle passes, doing nothing fails, verdicts are stable, the oracle leaves
    time to spare, the agent cannot see tests or solution, the task can run here, and no
    scripted cheat (reward-hack probe) makes the verifier pay. Tasks whose tests require
    what the instruction never states are flagged underspecified (a warning).

    \b
    Example:  stayer tasks check examples
    """
    import asyncio

    from rich.markup import escape
    from rich.text import Text

    from stayer.eval.checks import SuiteCheck, TaskCheck, check_suite
    from stayer.records import to_json
    from stayer.sandbox.bwrap import check_bwrap
    from stayer.settings import CheckSettings, check_flags

    try:
        check_flags(CheckSettings, {"reruns": reruns, "concurrency": concurrency})
    except ConfigError as e:
        bad_input(str(e))
    err = stderr()

    def done(c: TaskCheck) -> None:
        verdict = (
            ("ok", "green") if c.ok else (", ".join(sorted({p.kind for p in c.problems})), "red")
        )
        warning = ("; underspecified", "yellow") if "underspecified" in c.flags else ""
        err.print(Text.assemble(f"checked {c.name}: ", verdict, warning))

    try:
        check_bwrap()  # the checks mount tests and solution, which only bwrap can
        checks = asyncio.run(
            check_suite(suite, reruns=reruns, concurrency=concurrency, probes=probes, on_done=done)
        )
    except ConfigError as e:
        bad_input(str(e))
    if json_out:
        checked = SuiteCheck(
            suite=suite, ok=all(c.ok for c in checks), tasks=[c.report() for c in checks]
        )
        emit_json(to_json(checked))
    from stayer.tables import Col, FitTable, print_table

    table = FitTable(
        Col("task"),
        Col("verdict"),
        Col("oracle s", number=True, drop=2),
        Col("tests s", number=True, drop=1),
        Col("problems"),
        title=escape(f"stayer tasks check · {suite}"),
    )
    for c in checks:
        table.add_row(
            c.name,
            Text("ok", style="green") if c.ok else Text("problem", style="red"),
            "–" if c.oracle_s is None else f"{c.oracle_s:.2f}",
            "–" if c.verify_s is None else f"{c.verify_s:.2f}",
            Text("\n").join(
                [Text.assemble((p.kind, "bold"), f": {p.detail}") for p in c.problems]
                + (
                    [Text.assemble(("underspecified", "bold yellow"), ": " + "; ".join(c.unstated))]
                    if c.unstated
                    else []
                )
            ),
        )
    print_table(console(stderr=json_out), table)
    raise typer.Exit(EXIT_OK if all(c.ok for c in checks) else EXIT_FAILED)


@tasks_app.command("import-tb")
def import_tb_command(
    src: Annotated[
        str, typer.Argument(help="A Terminal-Bench task (task.yaml) or a directory of them.")
    ],
    dest: Annotated[
        str, typer.Argument(help="Suite directory to write the Harbor-layout tasks into.")
    ],
    sandbox: Annotated[
        str | None,
        typer.Option(
            "--sandbox",
            help="Run the tasks in their image: docker or bwrap-image, built on first run.",
        ),
    ] = None,
    json_out: JsonFlag = False,
) -> None:
    """Convert Terminal-Bench tasks (task.yaml, solution.sh, run-tests.sh, tests/) to the Harbor layout.

    The Dockerfile is kept in environment/: the tasks run in their image, which their
    first run builds (cached; docker where a daemon answers, else bwrap-image). With
    --sandbox they name that kind in task.toml, checked now.

    \b
    Example:  stayer tasks import-tb terminal-bench/tasks suites/tb --sandbox bwrap-image
    """
    from rich.text import Text

    from stayer.eval.import_tb import Imported, import_tb
    from stayer.eval.suite import ProblemsError
    from stayer.records import to_json

    try:
        imported = import_tb(src, dest, sandbox=sandbox)
    except ProblemsError as e:
        report_problems(e.problems)
    except ConfigError as e:
        bad_input(str(e))
    if json_out:
        emit_json(to_json(Imported(imported=[t.report() for t in imported])))
    out = console(stderr=json_out)
    for t in imported:
        out.print(Text(f"imported {t.source} → {t.dest}"))
        for note in t.notes:
            out.print(Text(f"  note: {note}"))

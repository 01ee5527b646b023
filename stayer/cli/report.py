"""``stayer report``: one run's per-step ledger and totals, from its journal."""

from __future__ import annotations

from typing import Annotated, Any

import typer

from stayer.cli.common import JsonFlag, app, bad_input, emit_json, step_notes, usd
from stayer.errors import ConfigError


@app.command()
def report(
    run_id: Annotated[
        str | None,
        typer.Argument(
            metavar="RUN_ID", help="Id of the run (see `stayer runs`).", show_default=False
        ),
    ] = None,
    last: Annotated[
        bool, typer.Option("--last", help="The most recently started run (no RUN_ID).")
    ] = False,
    follow: Annotated[
        bool,
        typer.Option(
            "--follow",
            "-f",
            help="Print each step as it is journaled, until the run ends (any process may be running it).",
        ),
    ] = False,
    json_out: JsonFlag = False,
) -> None:
    """Per-step ledger (model, tokens, cache, cost, cache breaks, compactions) and totals of
    one run, finished or not.

    \b
    Example:  stayer report 20260101-120000-a1b2c3
              stayer report --last
    """
    from stayer.journal.backends import open_store, stayer_home
    from stayer.journal.run_report import run_report
    from stayer.money import Usd
    from stayer.records import to_json

    if run_id is None and not last:
        bad_input("report: name the run: a RUN_ID (see `stayer runs`) or --last")
    if run_id is not None and last:
        bad_input(f"--last: the most recent run, or RUN_ID {run_id!r}: not both")
    try:
        store = open_store(stayer_home(), create=False)
        if run_id is None:
            newest = [] if store is None else store.runs(1)
            if not newest:
                where = store.location if store else stayer_home()
                bad_input(f"--last: no runs in {where}")
            run_id = newest[0].id
        row = None if store is None else store.run(run_id)
        if store is None or row is None:
            where = store.location if store else stayer_home()
            bad_input(f"run {run_id}: no such run in {where}; `stayer runs` lists the runs there")
        doc = run_report(store, row)
    except ConfigError as e:
        bad_input(str(e))
    if follow and not json_out:
        raise typer.Exit(follow_run(store, run_id))
    if json_out:
        emit_json(to_json(doc))
        return
    from stayer.cli.common import console as make_console
    from stayer.tables import Col, FitTable, print_table, say

    console = make_console()
    say(
        console,
        (f"run {doc.run_id}", "bold"),
        f" · {doc.task} · {doc.model} · {doc.status}",
    )
    # Left out at a narrow terminal, first to last: tools, cache write, cache %, notes.
    t = FitTable(
        Col("step"),
        Col("model"),
        Col("input", number=True),
        Col("cache read", number=True),
        Col("cache write", number=True, drop=3),
        Col("output", number=True),
        Col("cache %", number=True, drop=2),
        Col("cost (USD)", number=True),
        Col("tools", drop=4),
        Col("notes", drop=1),
    )
    for entry in doc.ledger:
        u = entry.usage
        t.add_row(
            str(entry.step) if entry.agent == "main" else f"{entry.agent} {entry.step}",
            entry.model or "—",
            f"{u.input_tokens:,}",
            f"{u.cache_read_tokens:,}",
            f"{u.cache_write_tokens:,}",
            f"{u.output_tokens:,}",
            f"{entry.cache_hit_ratio * 100:.1f}",
            Usd(entry.cost.total).format() + (" (est.)" if entry.lost else ""),
            "lost in flight" if entry.lost else ",".join(c.name for c in entry.tool_calls) or "-",
            "; ".join(step_notes(to_json(entry))),
        )
    tot = doc.totals
    u = tot.usage
    t.add_section()
    t.add_row(
        "total",
        "",
        f"{u.input_tokens:,}",
        f"{u.cache_read_tokens:,}",
        f"{u.cache_write_tokens:,}",
        f"{u.output_tokens:,}",
        "",
        usd(tot.cost),
        f"{tot.tool_calls} tool calls",
        "",
    )
    print_table(console, t)
    if doc.messages:
        m = FitTable(
            Col("message"),
            Col("from"),
            Col("to"),
            Col("kind", drop=1),
            Col("tokens", number=True),
            Col("read cost (USD)", number=True),
            Col("says", drop=2),
        )
        for msg in doc.messages:
            said = msg.content.strip().splitlines()[0][:60] if msg.content.strip() else ""
            m.add_row(
                msg.id,
                msg.sender,
                msg.to,
                msg.kind,
                f"{msg.tokens:,}",
                usd(msg.read_cost) if msg.read_cost is not None else "unread",
                said,
            )
        print_table(console, m)
    j = doc.journal
    say(
        console,
        f"{tot.model_calls} model calls ({tot.lost_in_flight} lost in flight, "
        f"{usd(tot.lost_in_flight_cost)}) · "
        + (f"{tot.outcome_unknown} outcome(s) unknown · " if tot.outcome_unknown else "")
        + f"{j.events} events · "
        f"{j.resumes} resume(s) · {j.blob_bytes:,} blob bytes · {j.store}",
    )


def follow_run(store: Any, run_id: str, poll_s: float = 0.5) -> int:
    """Tail the run's journal: a line per step (and per call lost in flight, and per tool
    call whose outcome is unknown) as it is written, then the final status; the exit code follows it (as ``stayer run``'s)."""
    import time
    from decimal import Decimal

    from rich.console import Console
    from rich.markup import escape
    from rich.text import Text

    from stayer.cli.run import exit_code, step_line
    from stayer.ledger import LedgerEntry, LostCall, OutcomeUnknown, RunReport
    from stayer.money import Usd
    from stayer.records import from_json

    out = Console(emoji=False)
    seen = 0
    total: Decimal | None = Decimal(0)
    try:
        while True:
            events = store.events(run_id)
            for ev in events[seen:]:
                if ev.kind == "step":
                    entry = from_json(ev.data["entry"], LedgerEntry)
                elif ev.kind == "model_lost":
                    entry = from_json(ev.data, LostCall).entry()
                elif ev.kind == "outcome_unknown":
                    u = from_json(ev.data, OutcomeUnknown)
                    line = (
                        f"step {u.step}: {u.tool} call {u.call_id}: outcome unknown, not sent again"
                    )
                    out.print(escape(line), highlight=False, soft_wrap=True)
                    continue
                elif ev.kind == "run_finished":
                    result = RunReport.read(store.get_blob(ev.data["result"]))
                    out.print(
                        Text.assemble(
                            ("finished: ", "bold"),
                            f"{result.status} · {result.stop_reason or '—'} · {usd(result.cost_usd)}",
                        )
                    )
                    return exit_code(result.status)
                else:
                    continue
                total = (Usd(total) + entry.cost.total).amount
                width = out.width if out.is_terminal else None
                line = step_line(entry, total, width)
                out.print(escape(line), highlight=False, soft_wrap=True)
            seen = len(events)
            time.sleep(poll_s)
    except KeyboardInterrupt:
        return 130

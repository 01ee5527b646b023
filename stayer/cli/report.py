"""``stayer report``: one run's per-step ledger and totals, from its journal."""

from __future__ import annotations

from decimal import Decimal
from typing import Annotated

import typer
from rich.table import Table
from rich.text import Text

from stayer.cli.common import JsonFlag, app, bad_input, console, emit_json
from stayer.errors import ConfigError


@app.command()
def report(
    run_id: Annotated[str, typer.Argument(help="Id of the run (see `stayer runs`).")],
    json_out: JsonFlag = False,
) -> None:
    """Per-step ledger (tokens, cache, cost) and totals of one run, finished or not."""
    from stayer.eval.trial import stayer_home
    from stayer.journal import open_store
    from stayer.journal.report import run_report

    try:
        store = open_store(stayer_home(), create=False)
        row = None if store is None else store.run(run_id)
        if store is None or row is None:
            where = store.location if store else stayer_home()
            bad_input(f"run {run_id}: no such run in {where}; `stayer runs` lists the runs there")
        doc = run_report(store, row)
    except ConfigError as e:
        bad_input(str(e))
    if json_out:
        emit_json(doc)
        return
    out = console()
    t = Table(
        "step", "input", "cache read", "cache write", "output", "cache %", "cost (USD)", "tools",
        title=Text(f"run {doc['run_id']} · {doc['task']} · {doc['model']} · {doc['status']}"),
    )
    for e in doc["ledger"]:
        u = e["usage"]
        lost = e.get("kind") == "lost_in_flight"
        cost = e["cost_usd"] if e["cost_usd"] == "unknown" else f"{Decimal(e['cost_usd']):.6f}"
        t.add_row(
            str(e["step"]), f"{u['input_tokens']:,}", f"{u['cache_read_tokens']:,}",
            f"{u['cache_write_tokens']:,}", f"{u['output_tokens']:,}", f"{e['cache_hit_ratio'] * 100:.1f}",
            cost + (" (est.)" if lost else ""),
            Text("lost in flight" if lost else ",".join(c["name"] for c in e["tool_calls"]) or "-"),
        )
    tot = doc["totals"]
    u = tot["usage"]
    t.add_section()
    t.add_row(
        "total", f"{u['input_tokens']:,}", f"{u['cache_read_tokens']:,}", f"{u['cache_write_tokens']:,}",
        f"{u['output_tokens']:,}", "", tot["cost_usd"], f"{tot['tool_calls']} tool calls",
    )
    out.print(t)
    j = doc["journal"]
    out.print(Text(
        f"{tot['model_calls']} model calls ({tot['lost_in_flight']} lost in flight, ${tot['lost_in_flight_cost_usd']}) · "
        f"{j['events']} events · {j['resumes']} resume(s) · {j['blob_bytes']:,} blob bytes · {j['store']}"
    ))

"""``stayer whatif``: a recorded trajectory's cost under another model, policy or limit."""

from __future__ import annotations

from decimal import Decimal
from typing import TYPE_CHECKING, Annotated

import typer

from stayer.cli.common import JsonFlag, app, bad_input, console, emit_json
from stayer.cli.options import MaxContextOption, PoliciesOption
from stayer.errors import ConfigError

if TYPE_CHECKING:
    from rich.console import Console

    from stayer.whatif import Replay, WhatIf


@app.command()
def whatif(
    trace: Annotated[
        str,
        typer.Argument(
            help="A stayer run id or directory, a SWE-agent .traj, or a mini-swe-agent .traj.json."
        ),
    ],
    model: Annotated[
        str | None,
        typer.Option(
            "--model",
            "-m",
            help="Model whose caching rules and prices apply (sim:ID or ID; default: the recorded one).",
        ),
    ] = None,
    policy: PoliciesOption = "auto",
    max_context: MaxContextOption = None,
    json_out: JsonFlag = False,
) -> None:
    """Replay a trajectory (actions and observations fixed) through context policies; an estimate.

    Shows what the recording cost, its replay under the recorded model and policy (the
    replay's own error), and each policy's difference from that replay.

    \b
    Example:  stayer whatif 20260101-120000-a1b2c3 --model sim:claude-haiku-4-5 --policy auto,mask:5
    """
    import asyncio

    from stayer.context.layout import Context
    from stayer.context.policies import make_policy
    from stayer.journal.backends import stayer_home
    from stayer.models.caching import provider_of
    from stayer.models.registry import known_sim_model
    from stayer.pricing import PriceBook
    from stayer.records import to_json
    from stayer.settings import RunFlags, check_flags
    from stayer.tokens import Counters
    from stayer.whatif import compare, load_trace

    model_id = None if model is None else model.split(":", 1)[1] if ":" in model else model
    policies = [p.strip() for p in (policy or "").split(",") if p.strip()]
    try:
        check_flags(RunFlags, {"max_context": max_context})
        prices = PriceBook.load()
        if model_id is not None:
            known_sim_model(model_id, prices)
        if not policies:
            raise ConfigError(f"--policy {policy!r}: name at least one policy")
        for p in policies:
            make_policy(p)
        loaded = load_trace(trace, stayer_home())
        target = model_id or loaded.recorded.model
        if max_context is not None and target is not None:
            counter = Counters().for_model(provider_of(target), target)
            pinned = Context(loaded.system, loaded.tools, loaded.instruction, counter).tokens
            if max_context <= pinned:
                raise ConfigError(
                    f"--max-context {max_context}: below the trace's pinned prefix of {pinned:,} tokens"
                )
        compared = asyncio.run(
            compare(
                loaded,
                [(model_id, p) for p in policies],
                prices=prices,
                max_context=max_context,
            )
        )
    except ConfigError as e:
        bad_input(str(e))
    if json_out:
        # The first scenario's figures stay at the top level, where earlier versions put them.
        emit_json({**to_json(compared.scenarios[0]), **to_json(compared)})
        return
    comparison_table(compared, console())


def comparison_table(doc: WhatIf, console: Console) -> None:
    """Recorded, the baseline replay, and every scenario, in one table."""
    from rich.markup import escape

    from stayer.tables import Col, FitTable, print_table

    recorded, baseline = doc.recorded, doc.baseline
    t = FitTable(
        Col(""),
        Col("model"),
        Col("policy"),
        Col("USD", number=True),
        Col("Δ USD", number=True),
        Col("calls", number=True, drop=2),
        Col("cache hit", number=True, drop=3),
        Col("peak ctx", number=True, drop=4),
        Col("compactions", number=True, drop=5),
        title=f"what-if (estimate): {escape(recorded.source)}",
    )

    def row(label: str, r: Replay, delta: str | None) -> None:
        t.add_row(
            label,
            r.model,
            r.policy,
            _money(r.cost_usd),
            _money(delta, signed=True),
            str(r.requests),
            f"{r.cache_hit_ratio:.1%}",
            f"{r.peak_context_tokens:,}",
            str(r.compactions),
        )

    t.add_row(
        "recorded",
        recorded.model or "?",
        recorded.policy,
        _money(recorded.cost_usd),
        "",
        "?" if recorded.requests is None else str(recorded.requests),
        "",
        "",
        "",
    )
    if baseline is not None:
        row("replay", baseline, doc.replay_error_usd)
    for r in doc.scenarios:
        row("what-if", r, r.delta_usd if isinstance(r.delta_usd, str) else None)
    print_table(console, t)
    if baseline is None:
        console.print(
            f"[yellow]{escape(doc.baseline_error or '')}[/]; Δ not shown", highlight=False
        )
    for note in doc.notes:
        console.print(f"[bold yellow]note:[/] {escape(note)}", highlight=False)
    own = (
        "its Δ is its difference from the recorded cost, of which the notes above explain "
        "what they can"
        if doc.notes
        else "its Δ is the replay's own error against the recorded cost"
    )
    console.print(
        f"replay: the recording re-simulated under its own model and policy; {own}. "
        "A what-if's Δ is against that replay.",
        highlight=False,
    )


def _money(amount: str | None, *, signed: bool = False) -> str:
    if amount is None or amount == "unknown":
        return "–" if amount is None else "unknown"
    return f"{Decimal(amount):{'+' if signed else ''}.6f}"

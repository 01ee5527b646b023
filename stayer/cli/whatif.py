"""``stayer whatif``: a recorded trajectory's cost under another model, policy or limit."""

from __future__ import annotations

import asyncio
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from stayer.cli.common import JsonFlag, app, bad_input, emit_json
from stayer.errors import ConfigError


@app.command()
def whatif(
    trace: Annotated[str, typer.Argument(help="A stayer run id or directory, a SWE-agent .traj, or a mini-swe-agent .traj.json.")],
    model: Annotated[str, typer.Option("--model", "-m", help="Model whose caching rules and prices apply (sim:ID or ID).")],
    policy: Annotated[str, typer.Option("--policy", help="auto | none | mask[:W] | summarize[:TOKENS] | textbook[:TOKENS]")] = "auto",
    max_context: Annotated[int | None, typer.Option("--max-context", help="Hard limit on prompt tokens.")] = None,
    json_out: JsonFlag = False,
) -> None:
    """Replay a trajectory (actions and observations fixed) through a context policy; an estimate."""
    from stayer.context.layout import Context
    from stayer.context.policies import make_policy
    from stayer.context.whatif import load_trace, replay
    from stayer.eval.trial import stayer_home
    from stayer.models.caching import provider_of
    from stayer.pricing import PriceBook
    from stayer.tokens import MessageCounter, TiktokenCounter

    model_id = model.split(":", 1)[1] if ":" in model else model
    try:
        provider_of(model_id)
        context_policy = make_policy(policy)
        loaded = load_trace(trace, stayer_home())
        counter = MessageCounter(TiktokenCounter())
        if max_context is not None:
            pinned = Context(loaded.system, loaded.tools, loaded.instruction, counter).tokens
            if max_context <= pinned:
                raise ConfigError(f"--max-context {max_context}: below the trace's pinned prefix of {pinned:,} tokens")
        result = asyncio.run(
            replay(loaded, model_id, context_policy, prices=PriceBook.load(), counter=counter, max_context=max_context)
        )
    except ConfigError as e:
        bad_input(str(e))
    if json_out:
        emit_json(result)
        return
    t = Table(title=f"what-if (estimate): {loaded.source}", show_header=False)
    u = result["usage"]
    for k, v in [
        ("model", result["model"]),
        ("policy", result["policy"]),
        ("requests", str(result["requests"])),
        ("cost (USD)", result["cost_usd"]),
        ("input tokens", f"{u['input_tokens']:,}"),
        ("cache hit ratio", f"{result['cache_hit_ratio']:.1%}"),
        ("peak context", f"{result['peak_context_tokens']:,}"),
        ("compactions", str(result["compactions"])),
    ]:
        t.add_row(k, v)
    Console().print(t)

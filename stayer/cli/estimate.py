"""``stayer estimate``: the cost equation, with ideal caching and with none."""

from __future__ import annotations

from typing import Annotated

import typer

from stayer.cli.common import JsonFlag, app, bad_input, console, emit_json, parse_decimal, stderr
from stayer.errors import ConfigError


@app.command()
def estimate(
    steps: Annotated[int, typer.Option("--steps", help="Agent steps (model calls).")],
    new_tokens: Annotated[int, typer.Option("--new-tokens", help="New input tokens per step.")],
    output_tokens: Annotated[int, typer.Option("--output-tokens", help="Output tokens per step.")],
    price_miss: Annotated[
        str | None, typer.Option("--price-miss", help="Uncached input price per million tokens.")
    ] = None,
    price_hit: Annotated[
        str | None, typer.Option("--price-hit", help="Cache read price per million tokens.")
    ] = None,
    price_out: Annotated[
        str | None, typer.Option("--price-out", help="Output price per million tokens.")
    ] = None,
    price_write: Annotated[
        str | None, typer.Option("--price-write", help="Cache write price per million tokens.")
    ] = None,
    model: Annotated[
        str | None, typer.Option("--model", help="Take prices from price data for this model id.")
    ] = None,
    json_out: JsonFlag = False,
) -> None:
    """The cost equation: per-step and total cost with ideal caching and with none.

    \b
    Example:  stayer estimate --steps 30 --new-tokens 20000 --output-tokens 2000 --model claude-sonnet-4-5
    """
    from stayer.estimate import estimate as run_estimate
    from stayer.estimate import rates_from_flags, render_estimate
    from stayer.pricing import PriceBook, Rates
    from stayer.records import to_json
    from stayer.settings import EstimateSettings, check_flags

    flags = {"--price-miss": price_miss, "--price-hit": price_hit, "--price-out": price_out}
    try:
        check_flags(
            EstimateSettings,
            {"steps": steps, "new_tokens": new_tokens, "output_tokens": output_tokens},
        )
        if model is not None:
            if any(v is not None for v in (*flags.values(), price_write)):
                bad_input("--model and --price-* flags: give one or the other")
            name = (
                model.split(":", 1)[1]
                if model.startswith(("sim:", "anthropic:", "openai:", "openai-chat:"))
                else model
            )
            book = PriceBook.load()
            if book.rates(name) is None:
                bad_input(
                    f"--model {model}: no price data for this model; give --price-miss/--price-hit/--price-out"
                )

            def rates(context_tokens: int) -> Rates:  # long-context tiers apply per step
                return book.rates(name, prompt_tokens=context_tokens)  # type: ignore[return-value]

        else:
            missing = [f for f, v in flags.items() if v is None]
            if missing:
                bad_input(
                    f"{', '.join(missing)}: required without --model (prices per million tokens)"
                )
            prices = {
                f.removeprefix("--").replace("-", "_"): parse_decimal(v, f)
                for f, v in flags.items()
            }
            prices["price_write"] = parse_decimal(price_write, "--price-write")
            p = check_flags(
                EstimateSettings,
                {
                    "steps": steps,
                    "new_tokens": new_tokens,
                    "output_tokens": output_tokens,
                    **prices,
                },
            )
            assert (
                p.price_miss is not None and p.price_hit is not None and p.price_out is not None
            )  # checked above
            flat = rates_from_flags(p.price_miss, p.price_hit, p.price_out, p.price_write)

            def rates(context_tokens: int) -> Rates:  # the same prices at every size
                return flat

    except ConfigError as e:
        bad_input(str(e))
    result = run_estimate(steps, new_tokens, output_tokens, rates)
    if json_out:
        emit_json(to_json(result))
        render_estimate(result, stderr())
    else:
        render_estimate(result, console())

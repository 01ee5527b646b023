"""The ``stayer`` command.

Contracts (DESIGN.md): every command takes ``--json`` and then prints exactly one JSON
document on stdout, with progress and logs on stderr. Exit codes: 0 ok, 1 the run or check
failed, 2 bad input (one line naming the file, field or flag), 3 budget exhausted.
"""

from __future__ import annotations

import asyncio
import json
import sys
from decimal import Decimal, InvalidOperation
from typing import Annotated, Any, NoReturn

import typer
from rich.console import Console
from rich.table import Table

from stayer.errors import ConfigError

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    help="Run long-horizon LLM agents that finish the job within budget.",
    pretty_exceptions_enable=False,
)

EXIT_OK, EXIT_FAILED, EXIT_BAD_INPUT, EXIT_BUDGET = 0, 1, 2, 3

JsonFlag = Annotated[bool, typer.Option("--json", help="Print one JSON document on stdout.")]


def _stderr() -> Console:
    return Console(stderr=True)


def _bad_input(message: str) -> NoReturn:
    _stderr().print(f"[bold red]error:[/] {message}", highlight=False, soft_wrap=True)
    raise typer.Exit(EXIT_BAD_INPUT)


def _decimal(value: str | None, flag: str) -> Decimal | None:
    if value is None:
        return None
    try:
        d = Decimal(value)
    except InvalidOperation:
        _bad_input(f"{flag} {value!r}: not a number")
    if not d.is_finite():
        _bad_input(f"{flag} {value!r}: not a finite number")
    return d


def _emit_json(doc: Any) -> None:
    sys.stdout.write(json.dumps(doc, indent=2) + "\n")


@app.command()
def run(
    task: Annotated[str, typer.Argument(help="Task directory (Harbor layout).")],
    model: Annotated[str, typer.Option("--model", "-m", help="PROVIDER:MODEL, e.g. sim:claude-sonnet-4-5.")],
    max_steps: Annotated[int, typer.Option("--max-steps", help="Model calls at most.")] = 50,
    max_cost: Annotated[str | None, typer.Option("--max-cost", help="Hard cap in USD; never overshot.")] = None,
    run_id: Annotated[str | None, typer.Option("--run-id", help="Id of this run (default: time + random).")] = None,
    base_url: Annotated[str | None, typer.Option("--base-url", help="OpenAI-compatible server for openai-chat: models.")] = None,
    sim_policy: Annotated[str | None, typer.Option("--sim-policy", help="oracle | synthetic:steps=N,obs_tokens=T,out_tokens=U | replay:PATH")] = None,
    sim_latency: Annotated[float, typer.Option("--sim-latency", help="Simulated seconds per model call.")] = 0.0,
    sandbox: Annotated[str, typer.Option("--sandbox", help="bwrap (default) or local (unsandboxed, only by name).")] = "bwrap",
    service_tier: Annotated[str | None, typer.Option("--service-tier", help="Provider service tier (flex, priority, fast…).")] = None,
    json_out: JsonFlag = False,
) -> None:
    """Run an agent on one task, verify the result, and report cost per step."""
    from stayer.eval.trial import RunConfig, execute, prepare

    config = RunConfig(
        task_dir=task,
        model=model,
        max_steps=max_steps,
        max_cost=_decimal(max_cost, "--max-cost"),
        run_id=run_id,
        base_url=base_url,
        sim_policy=sim_policy,
        sim_latency=sim_latency,
        sandbox=sandbox,
        service_tier=service_tier,
    )
    try:
        prepared = prepare(config)
    except ConfigError as e:
        _bad_input(str(e))
    err = _stderr()
    err.print(
        f"[bold]stayer run[/] {prepared.task.name} · {model} · run {prepared.run_id}", highlight=False
    )

    def progress(entry: Any) -> None:
        d = entry.to_dict()
        tools = ",".join(c["name"] for c in d["tool_calls"]) or "-"
        step_cost = d["cost_usd"] if d["cost_usd"] == "unknown" else f"{Decimal(d['cost_usd']):.6f}"
        err.print(
            f"step {d['step']:>3} │ ctx {d['context_tokens']:>9,} │ cache {d['cache_hit_ratio'] * 100:5.1f}% │ "
            f"${step_cost} │ total ${_running_total(entry)} │ {tools}",
            highlight=False,
            soft_wrap=True,
        )

    totals: list[Decimal | None] = [Decimal(0)]

    def _running_total(entry: Any) -> str:
        t = totals[0]
        totals[0] = None if t is None or entry.cost.total is None else t + entry.cost.total
        return "unknown" if totals[0] is None else f"{totals[0]:.6f}"

    try:
        doc = asyncio.run(execute(prepared, on_step=progress))
    except ConfigError as e:
        _bad_input(str(e))
    if json_out:
        _emit_json(doc)
    _summary_table(doc, Console(stderr=json_out))
    code = {"succeeded": EXIT_OK, "budget_exhausted": EXIT_BUDGET}.get(doc["status"], EXIT_FAILED)
    raise typer.Exit(code)


def _summary_table(doc: dict[str, Any], console: Console) -> None:
    t = Table(title=f"run {doc['run_id']} · {doc['task']} · {doc['model']}", show_header=False)
    u = doc["usage"]
    rows = [
        ("status", doc["status"]),
        ("reward", str(doc["reward"])),
        ("steps", str(doc["steps"])),
        ("input tokens", f"{u['input_tokens']:,}"),
        ("  cache read", f"{u['cache_read_tokens']:,}"),
        ("  cache write", f"{u['cache_write_tokens']:,}"),
        ("output tokens", f"{u['output_tokens']:,} (reasoning {u['reasoning_tokens']:,})"),
        ("cost (USD)", doc["cost_usd"]),
    ]
    if doc.get("error"):
        rows.append(("error", doc["error"]))
    for k, v in rows:
        t.add_row(k, v)
    console.print(t)


@app.command()
def estimate(
    steps: Annotated[int, typer.Option("--steps", help="Agent steps (model calls).")],
    new_tokens: Annotated[int, typer.Option("--new-tokens", help="New input tokens per step.")],
    output_tokens: Annotated[int, typer.Option("--output-tokens", help="Output tokens per step.")],
    price_miss: Annotated[str | None, typer.Option("--price-miss", help="Uncached input price per million tokens.")] = None,
    price_hit: Annotated[str | None, typer.Option("--price-hit", help="Cache read price per million tokens.")] = None,
    price_out: Annotated[str | None, typer.Option("--price-out", help="Output price per million tokens.")] = None,
    price_write: Annotated[str | None, typer.Option("--price-write", help="Cache write price per million tokens.")] = None,
    model: Annotated[str | None, typer.Option("--model", help="Take prices from price data for this model id.")] = None,
    json_out: JsonFlag = False,
) -> None:
    """The cost equation: per-step and total cost with ideal caching and with none."""
    from stayer.estimate import estimate as run_estimate
    from stayer.estimate import rates_from_flags, render_estimate
    from stayer.pricing import PriceBook, Rates

    for flag, v in (("--steps", steps), ("--new-tokens", new_tokens), ("--output-tokens", output_tokens)):
        if v < 0 or (flag == "--steps" and v < 1):
            _bad_input(f"{flag} {v}: must be {'at least 1' if flag == '--steps' else 'zero or more'}")
    flags = {"--price-miss": price_miss, "--price-hit": price_hit, "--price-out": price_out}
    try:
        if model is not None:
            if any(v is not None for v in (*flags.values(), price_write)):
                _bad_input("--model and --price-* flags: give one or the other")
            name = model.split(":", 1)[1] if model.startswith(("sim:", "anthropic:", "openai:", "openai-chat:")) else model
            book = PriceBook.load()
            if book.rates(name) is None:
                _bad_input(f"--model {model}: no price data for this model; give --price-miss/--price-hit/--price-out")

            def rates(context_tokens: int) -> Rates:  # long-context tiers apply per step
                return book.rates(name, prompt_tokens=context_tokens)  # type: ignore[return-value]

        else:
            missing = [f for f, v in flags.items() if v is None]
            if missing:
                _bad_input(f"{', '.join(missing)}: required without --model (prices per million tokens)")
            values = {f: _decimal(v, f) for f, v in flags.items()}
            write = _decimal(price_write, "--price-write")
            for f, v in (*values.items(), ("--price-write", write)):
                if v is not None and v < 0:
                    _bad_input(f"{f} {v}: prices cannot be negative")
            rates = rates_from_flags(values["--price-miss"], values["--price-hit"], values["--price-out"], write)
    except ConfigError as e:
        _bad_input(str(e))
    result = run_estimate(steps, new_tokens, output_tokens, rates)
    if json_out:
        _emit_json(result)
        render_estimate(result, Console(stderr=True))
    else:
        render_estimate(result, Console())


def main() -> None:  # pragma: no cover - console script entry point
    app()


if __name__ == "__main__":  # pragma: no cover
    main()

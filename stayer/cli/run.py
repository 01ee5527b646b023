"""``stayer run``: one task, one model, verified, with the cost of every step."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from decimal import Decimal
from typing import Annotated, Any, NoReturn

import typer
from rich.console import Console
from rich.table import Table
from rich.text import Text

from stayer.cli.common import (
    EXIT_BUDGET,
    EXIT_FAILED,
    EXIT_OK,
    JsonFlag,
    app,
    bad_input,
    console,
    emit_json,
    environment_error,
    is_store_error,
    parse_decimal,
    stderr,
)
from stayer.errors import ConfigError


@app.command()
def run(
    task: Annotated[str, typer.Argument(help="Task directory (Harbor layout).")],
    model: Annotated[str, typer.Option("--model", "-m", help="PROVIDER:MODEL, e.g. sim:claude-sonnet-4-5.")],
    max_steps: Annotated[int, typer.Option("--max-steps", help="Model calls at most.")] = 50,
    max_cost: Annotated[str | None, typer.Option("--max-cost", help="Hard cap in USD; never overshot.")] = None,
    run_id: Annotated[str | None, typer.Option("--run-id", help="Id of this run (default: time + random).")] = None,
    base_url: Annotated[str | None, typer.Option("--base-url", help="OpenAI-compatible server for openai-chat: and local: models.")] = None,
    sim_policy: Annotated[str | None, typer.Option("--sim-policy", help="oracle | synthetic:steps=N,obs_tokens=T,out_tokens=U | replay:PATH")] = None,
    sim_latency: Annotated[float, typer.Option("--sim-latency", help="Simulated seconds per model call.")] = 0.0,
    sandbox: Annotated[str, typer.Option("--sandbox", help="bwrap (default) or local (unsandboxed, only by name).")] = "bwrap",
    service_tier: Annotated[str | None, typer.Option("--service-tier", help="Provider service tier (flex, priority, fast…).")] = None,
    policy: Annotated[str, typer.Option("--policy", help="Context policy: auto | none | mask[:W] | summarize[:TOKENS].")] = "auto",
    max_context: Annotated[int | None, typer.Option("--max-context", help="Hard limit on prompt tokens; never exceeded.")] = None,
    config_file: Annotated[str | None, typer.Option("--config", help="stayer.toml: models by role, cascade, tiers, failover, sub-agents, breakers.")] = None,
    command_timeout: Annotated[float, typer.Option("--command-timeout", help="Seconds each sandboxed command may run (the whole process tree is killed).")] = 120.0,
    memory_mb: Annotated[int | None, typer.Option("--memory-mb", help="Memory per sandboxed process (default: task.toml's).")] = None,
    storage_mb: Annotated[int | None, typer.Option("--storage-mb", help="What /app and /tmp may hold (default: task.toml's).")] = None,
    max_processes: Annotated[int | None, typer.Option("--max-processes", help="Processes per sandboxed command.")] = None,
    otlp: Annotated[str | None, typer.Option("--otlp", help="Export OpenTelemetry spans to this OTLP endpoint (default: OTEL_EXPORTER_OTLP_ENDPOINT).")] = None,
    json_out: JsonFlag = False,
) -> None:
    """Run an agent on one task, verify the result, and report cost per step."""
    from stayer.eval.trial import RunConfig, prepare

    config = RunConfig(
        task_dir=task,
        model=model,
        max_steps=max_steps,
        max_cost=parse_decimal(max_cost, "--max-cost"),
        run_id=run_id,
        base_url=base_url,
        sim_policy=sim_policy,
        sim_latency=sim_latency,
        sandbox=sandbox,
        service_tier=service_tier,
        policy=policy,
        max_context=max_context,
        config_file=config_file,
        command_timeout=command_timeout,
        memory_mb=memory_mb,
        storage_mb=storage_mb,
        max_processes=max_processes,
    )
    try:
        prepared = prepare(config)
    except ConfigError as e:
        bad_input(str(e))
    err = stderr()
    err.print(Text.assemble(("stayer run", "bold"), f" {prepared.task.name} · {model} · run {prepared.run_id}"))

    finish(lambda: traced(prepared, step_printer(err), otlp), json_out, prepared.run_id)


async def traced(prepared: Any, on_step: Callable[[Any], None], otlp: str | None, journal: Any = None) -> dict[str, Any]:
    """Execute the run, inside an OpenTelemetry trace when one is configured (``--otlp`` or
    the OTLP environment); without one, OpenTelemetry is not even imported."""
    from stayer.eval.trial import execute
    from stayer.telemetry import tracing_configured

    if not tracing_configured(otlp):
        return await execute(prepared, on_step, journal=journal)
    from stayer.telemetry.tracing import execute_traced, provider

    tp = provider(otlp)
    try:
        return await execute_traced(prepared, on_step, tp, journal=journal)
    finally:
        tp.shutdown()  # flushes the batch


def finish(run: Callable[[], Any], json_out: bool, run_id: str) -> NoReturn:
    """Run the coroutine ``run()`` makes; print its result document; exit by its status.

    A full disk or a journal database gone mid-run stops the run where its journal says it
    was: one line saying so, exit 2, and ``stayer resume`` continues it."""
    try:
        doc = asyncio.run(run())
    except ConfigError as e:
        bad_input(str(e))
    except Exception as e:
        if not (isinstance(e, OSError) or is_store_error(e)):
            raise
        bad_input(f"run {run_id} stopped: {environment_error(e)}; once fixed, `stayer resume {run_id}` continues it")
    if json_out:
        emit_json(doc)
    summary_table(doc, console(stderr=json_out))
    raise typer.Exit(exit_code(doc["status"]))


def exit_code(status: str) -> int:
    return {"succeeded": EXIT_OK, "budget_exhausted": EXIT_BUDGET}.get(status, EXIT_FAILED)


def step_printer(err: Console) -> Callable[[Any], None]:
    """One progress line per step on ``err``, with the running total."""
    totals: list[Decimal | None] = [Decimal(0)]

    def _running_total(entry: Any) -> str:
        t = totals[0]
        totals[0] = None if t is None or entry.cost.total is None else t + entry.cost.total
        return "unknown" if totals[0] is None else f"{totals[0]:.6f}"

    def progress(entry: Any) -> None:
        d = entry.to_dict()
        tools = ",".join(c["name"] for c in d["tool_calls"]) or "-"
        step_cost = d["cost_usd"] if d["cost_usd"] == "unknown" else f"{Decimal(d['cost_usd']):.6f}"
        err.print(
            Text(
                f"step {d['step']:>3} │ ctx {d['context_tokens']:>9,} │ cache {d['cache_hit_ratio'] * 100:5.1f}% │ "
                f"${step_cost} │ total ${_running_total(entry)} │ {tools}"
            ),
            highlight=False,
            soft_wrap=True,
        )

    return progress


def summary_table(doc: dict[str, Any], console: Console) -> None:
    t = Table(title=Text(f"run {doc['run_id']} · {doc['task']} · {doc['model']}"), show_header=False)
    u = doc["usage"]
    rows = [
        ("status", doc["status"]),
        ("stop reason", doc.get("stop_reason") or "–"),
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
        t.add_row(k, Text(str(v)))
    console.print(t)

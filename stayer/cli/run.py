"""``stayer run``: one task, one model, verified, with the cost of every step."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from decimal import Decimal
from typing import TYPE_CHECKING, Annotated, Any, NoReturn

import typer

from stayer.choices import (
    DEFAULT_COMMAND_TIMEOUT_S,
    DEFAULT_MAX_STEPS,
    DEFAULT_MCP_TOOLS,
    DEFAULT_POLICY,
    POLICY_HELP,
)
from stayer.cli.common import (
    EXIT_BUDGET,
    EXIT_FAILED,
    EXIT_INTERRUPTED,
    EXIT_OK,
    JsonFlag,
    app,
    bad_input,
    console,
    dash,
    emit_json,
    environment_error,
    is_store_error,
    parse_decimal,
    run_async,
    stderr,
    step_notes,
    usd,
)
from stayer.cli.options import (
    ConfigOption,
    MaxContextOption,
    MaxProcessesOption,
    MaxStepsOption,
    McpToolsOption,
    OtlpOption,
    RunMaxCostOption,
    SimLatencyOption,
    SimPolicyOption,
    StorageMbOption,
    TaskSandboxOption,
)
from stayer.errors import ConfigError, StoreUnavailable
from stayer.money import Usd

if TYPE_CHECKING:
    from rich.console import Console

    from stayer.ledger import LedgerEntry, LostCall
    from stayer.run import RunReport


@app.command()
def run(
    task: Annotated[str, typer.Argument(help="Task directory (Harbor layout).")],
    model: Annotated[
        str | None,
        typer.Option(
            "--model",
            "-m",
            help="PROVIDER:MODEL, e.g. sim:claude-sonnet-4-5 (with --team: the entry agent's).",
        ),
    ] = None,
    max_steps: MaxStepsOption = DEFAULT_MAX_STEPS,
    max_cost: RunMaxCostOption = None,
    run_id: Annotated[
        str | None, typer.Option("--run-id", help="Id of this run (default: time + random).")
    ] = None,
    base_url: Annotated[
        str | None,
        typer.Option(
            "--base-url", help="OpenAI-compatible server for openai-chat: and local: models."
        ),
    ] = None,
    sim_policy: SimPolicyOption = None,
    sim_latency: SimLatencyOption = 0.0,
    sandbox: TaskSandboxOption = None,
    service_tier: Annotated[
        str | None,
        typer.Option("--service-tier", help="Provider service tier (flex, priority, fast…)."),
    ] = None,
    policy: Annotated[
        str,
        typer.Option("--policy", help=f"Context policy: {POLICY_HELP}."),
    ] = DEFAULT_POLICY,
    max_context: MaxContextOption = None,
    mcp_tools: McpToolsOption = DEFAULT_MCP_TOOLS,
    config_file: ConfigOption = None,
    team: Annotated[
        str | None,
        typer.Option(
            "--team",
            help="team.toml: a team of agents that message and hand off to each other (docs/teams.md).",
        ),
    ] = None,
    command_timeout: Annotated[
        float,
        typer.Option(
            "--command-timeout",
            help="Seconds each sandboxed command may run (the whole process tree is killed).",
        ),
    ] = DEFAULT_COMMAND_TIMEOUT_S,
    memory_mb: Annotated[
        int | None,
        typer.Option("--memory-mb", help="Memory per sandboxed process (default: task.toml's)."),
    ] = None,
    storage_mb: StorageMbOption = None,
    max_processes: MaxProcessesOption = None,
    otlp: OtlpOption = None,
    json_out: JsonFlag = False,
) -> None:
    """Run an agent on one task, verify the result, and report cost per step.

    Exit 0 succeeded, 1 failed, 2 bad input, 3 budget exhausted.

    \b
    Example:  stayer run examples/hello-file --model sim:claude-sonnet-4-5 --max-cost 0.05
    """
    from rich.text import Text

    from stayer.run import RunSettings, prepare

    config = RunSettings(
        task_dir=task,
        model=model or "",
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
        mcp_tools=mcp_tools,
        config_file=config_file,
        team_file=team,
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
    who = f"team {team}" if team else prepared.config.model
    err.print(
        Text.assemble(
            ("stayer run", "bold"), f" {prepared.task.name} · {who} · run {prepared.run_id}"
        )
    )
    err.print(Text(sandbox_line(prepared)))

    finish(lambda: traced(prepared, step_printer(err), otlp), json_out, prepared.run_id)


def sandbox_line(prepared: Any, source: str | None = None) -> str:
    """Where the run's commands run and what each may use: the header's next lines;
    ``source``: who chose the sandbox, when not the run's own flags and task."""
    from stayer.sandbox.bwrap import tmp_size_mb
    from stayer.sandbox.process import default_memory_mb, memory_enforcement

    kind, source = prepared.config.sandbox, source or prepared.sandbox_source
    limits = prepared.task.sandbox_limits(**prepared.config.sandbox_overrides())
    memory = limits.get("memory_mb") or default_memory_mb()
    how = "cgroup" if kind == "docker" else memory_enforcement()
    line = f"limits: memory {memory:,} MiB per command ({how})"
    servers = getattr(prepared, "mcp_servers", {})
    # Where each MCP server runs; on the host only with trust = "host".
    mcp = "".join(f"\nmcp {n}: {_WHERE[s.where]}" for n, s in sorted(servers.items()))
    if kind == "local":
        return f"sandbox local, no isolation ({source})\n{line}{mcp}"
    return (
        f"sandbox {kind} ({source})\n{line} · /tmp {tmp_size_mb(limits.get('storage_mb')):,} MiB"
        + mcp
    )


_WHERE = {
    "sandbox": "stdio, in the run's sandbox",
    "host": 'stdio, on the host (trust = "host")',
    "remote": "streamable HTTP",
}


async def traced(
    prepared: Any, on_step: Callable[[Any], None], otlp: str | None, journal: Any = None
) -> RunReport:
    """Execute the run, inside an OpenTelemetry trace when one is configured (``--otlp`` or
    the OTLP environment); without one, OpenTelemetry is not even imported."""
    from stayer.run import execute
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
    was: one line saying so, exit 2, and ``stayer resume`` continues it. Ctrl-C: one line
    naming the ``stayer resume`` that continues it, exit 130."""
    try:
        report: RunReport = run_async(run)
    except KeyboardInterrupt:
        # The journal holds every finished step: the run continues where it stopped.
        stderr().print(
            f"interrupted: run {run_id} stopped; `stayer resume {run_id}` continues it",
            markup=False,
            highlight=False,
            soft_wrap=True,
        )
        raise typer.Exit(EXIT_INTERRUPTED) from None
    except StoreUnavailable as e:  # the database went away mid-run (a ConfigError too)
        bad_input(f"run {run_id} stopped: {e}; once fixed, `stayer resume {run_id}` continues it")
    except ConfigError as e:
        bad_input(str(e))
    except Exception as e:
        if not (isinstance(e, OSError) or is_store_error(e)):
            raise
        bad_input(
            f"run {run_id} stopped: {environment_error(e)}; once fixed, `stayer resume {run_id}` continues it"
        )
    if json_out:
        emit_json(report.to_json())
    summary_table(report, console(stderr=json_out))
    raise typer.Exit(exit_code(report.status))


def exit_code(status: str) -> int:
    return {"succeeded": EXIT_OK, "budget_exhausted": EXIT_BUDGET}.get(status, EXIT_FAILED)


def step_printer(err: Console, lost: Sequence[LostCall] = ()) -> Callable[[Any], None]:
    """One progress line per step on ``err`` (see ``step_line``). ``lost``: the journal's
    ``model_lost`` records, which grow as a resumed run re-issues calls lost at a crash;
    each gets its line before the step's, so the running total is what the result counts."""
    from rich.markup import escape

    from stayer.journal.session import lost_ledger_entries

    total: list[Decimal | None] = [Decimal(0)]
    shown = [0]

    def show(entry: LedgerEntry) -> None:
        total[0] = (Usd(total[0]) + entry.cost.total).amount
        width = err.width if err.is_terminal else None
        line = step_line(entry, total[0], width)
        err.print(escape(line), highlight=False, soft_wrap=True)

    def progress(entry: LedgerEntry) -> None:
        for lost_entry in lost_ledger_entries(lost[shown[0] :]):
            show(lost_entry)
        shown[0] = len(lost)
        show(entry)

    return progress


def step_line(entry: LedgerEntry, total: Decimal | None, width: int | None = None) -> str:
    """A ledger entry in one line: model, context, cache, cost with the running total,
    tools, and why the cache broke or the context was compacted. Within ``width`` (a
    terminal's) the model (the run's header names it) goes first, then the text at the
    end is cut; the numbers stay whole. No ``width`` (a pipe): the whole line."""
    from stayer.records import to_json

    tools = ",".join(c.name for c in entry.tool_calls) or "-"
    agent = "" if entry.agent == "main" else f"{entry.agent} "
    head = f"{agent}step {entry.step:>3} │ "
    numbers = (
        f"ctx {entry.context_tokens or 0:>9,} │ cache {entry.cache_hit_ratio * 100:5.1f}% │ "
        f"{Usd(entry.cost.total).format()} │ total {usd(total)}"
    )
    text = " │ ".join([tools, *step_notes(to_json(entry))])
    line = f"{head}{entry.model} │ {numbers} │ {text}"
    if width is None or len(line) <= width:
        return line
    line = f"{head}{numbers} │ {text}"
    if len(line) <= width:
        return line
    keep = max(width - len(head) - len(numbers) - 4, 1)
    return f"{head}{numbers} │ {text[: keep - 1]}…" if len(text) > keep else line


def summary_table(doc: RunReport, console: Console) -> None:
    """The result: a table of figures, then why the run stopped, the wrap-up summary, the
    verifier's output when it failed, and what to do next."""
    from stayer.tables import Col, FitTable, print_table, say

    say(console, (f"run {doc.run_id}", "bold"), f" · {doc.task} · {doc.model}")
    t = FitTable(Col("", whole=True), Col(""), show_header=False)
    u = doc.usage
    rows = [
        ("status", doc.status),
        ("stop reason", dash(doc.stop_reason)),
        ("reward", dash(doc.reward)),
        ("steps", str(doc.steps)),
        ("input tokens", f"{u.input_tokens:,}"),
        ("  cache read", f"{u.cache_read_tokens:,}"),
        ("  cache write", f"{u.cache_write_tokens:,}"),
        ("output tokens", f"{u.output_tokens:,} (reasoning {u.reasoning_tokens:,})"),
        ("cost (USD)", usd(doc.cost_usd)),
    ]
    if doc.compactions:
        rows.append(("compactions", str(doc.compactions)))
    for k, v in rows:
        t.add_row(k, str(v))
    print_table(console, t)
    explain(doc, console)


def explain(doc: RunReport, console: Console) -> None:
    """Why the run ended as it did, and the next step, in words."""
    from rich.markup import escape

    def say(label: str, text: str = "") -> None:
        console.print(
            f"[bold]{label}:[/] {escape(text)}".rstrip(),
            highlight=False,
            soft_wrap=not console.is_terminal,
        )

    stop = stop_detail(doc)
    if stop:
        say("stopped", stop)
    if doc.error:
        say("error", doc.error)
    summary = (doc.summary or "").strip()
    if summary and doc.status != "succeeded":
        say("wrap-up summary" if doc.status == "budget_exhausted" else "summary")
        for line in summary.splitlines():
            console.print(f"  {escape(line)}", highlight=False, soft_wrap=not console.is_terminal)
    verifier = doc.verifier or None
    if verifier and verifier.voided:
        say("reward", verifier.voided)
    tail = (verifier.output_tail if verifier else "").strip()
    if verifier and doc.status != "succeeded" and tail:
        lines = tail.splitlines()[-VERIFIER_TAIL_LINES:]
        say(
            "verifier output",
            f"(last {len(lines)} lines, exit code {dash(verifier.exit_code)})",
        )
        for line in lines:
            console.print(f"  {escape(line)}", highlight=False, soft_wrap=not console.is_terminal)
    say("next", next_step(doc))


VERIFIER_TAIL_LINES = 15


def stop_detail(doc: RunReport) -> str:
    """The reason the run stopped, with the breaker's own words when one stopped it."""
    reason = doc.stop_reason or ""
    if doc.stop_detail:
        return f"{reason}: {doc.stop_detail}"
    hard = [b for b in doc.breakers if not b.soft]
    if hard:
        return f"{hard[-1].reason}: {hard[-1].detail}"
    return STOP_WORDS.get(reason, reason)


STOP_WORDS = {"submit": "the agent submitted its work (then the verifier ran)"}


def next_step(doc: RunReport) -> str:
    run_id, status, reason = doc.run_id, doc.status, doc.stop_reason or ""
    if status == "succeeded":
        return f"`stayer report {run_id}` shows the cost of every step"
    if status == "budget_exhausted":
        if reason == "max_cost":
            need = next_call_cost(doc)
            spent = doc.spent.amount or Decimal(0)
            floor = f" to ≥ {usd(round_up(spent + need))}" if need is not None else ""
            return f"raise --max-cost{floor} (each further step costs about as much again)"
        if reason == "max_steps":
            return f"raise --max-steps above {doc.steps}, or read the wrap-up summary above"
        return f"read the wrap-up summary above; `stayer report {run_id}` shows every step"
    if status == "error":
        return f"`stayer doctor` checks this machine; `stayer resume {run_id}` retries from the journal"
    return (
        f"read the verifier output above; `stayer report {run_id}` shows every step; "
        f"`stayer tasks check {doc.task_path or doc.task}` checks the task itself"
    )


def next_call_cost(doc: RunReport) -> Decimal | None:
    """What the call that did not fit needed, from the max_cost breaker's words."""
    import re

    for b in reversed(doc.breakers):
        m = re.search(r"worst case \(\$([0-9.]+)", b.detail)
        if b.reason == "max_cost" and m:
            return Decimal(m.group(1))
    return None


def round_up(amount: Decimal) -> Decimal:
    """Up to two significant digits: $0.009278 → $0.0093."""
    if amount <= 0:
        return amount
    exponent = amount.adjusted() - 1
    step = Decimal(1).scaleb(exponent)
    return (amount / step).to_integral_value(rounding="ROUND_CEILING") * step

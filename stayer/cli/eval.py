"""``stayer eval``: tasks × epochs × configurations, with success and cost with confidence."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, NoReturn

import typer

from stayer.choices import DEFAULT_MAX_STEPS, DEFAULT_POLICY
from stayer.cli.common import (
    EXIT_BAD_INPUT,
    EXIT_FAILED,
    EXIT_INTERRUPTED,
    EXIT_OK,
    JsonFlag,
    app,
    bad_input,
    check_writable_dir,
    console,
    emit_json,
    error_line,
    parse_decimal,
    run_async,
    stderr,
    usd,
)
from stayer.cli.options import (
    MaxStepsOption,
    OtlpOption,
    PoliciesOption,
    RayOption,
    RunMaxCostOption,
    RunsAtOnceOption,
    SimLatencyOption,
    SimPolicyOption,
    SuiteArgument,
    TaskSandboxOption,
)
from stayer.errors import ConfigError

if TYPE_CHECKING:
    from rich.console import Console

    from stayer.eval.records import EvalDocument, InfraTrial, PreflightFinding, TrialRecord
    from stayer.run import RunReport


def report_problems(problems: list[str]) -> NoReturn:
    """Bad input with several problems: one line each on stderr, exit 2."""
    for line in problems:
        error_line(line)
    raise typer.Exit(EXIT_BAD_INPUT)


def _split(value: str | None) -> list[str]:
    return [part.strip() for part in (value or "").split(",") if part.strip()]


@contextlib.contextmanager
def _tracing(otlp: str | None) -> Iterator[Any]:
    """How each trial's run is executed when traces are wanted (``--otlp`` or the OTLP
    environment): inside its trace, the provider flushed at the end. None without them
    (OpenTelemetry is then not even imported)."""
    from stayer.telemetry import tracing_configured

    if not tracing_configured(otlp):
        yield None
        return
    from stayer.telemetry.tracing import execute_traced, provider

    tp = provider(otlp, service_name="stayer-eval")

    async def traced(prepared: Any, journal: Any, controls: Any) -> RunReport:
        return await execute_traced(prepared, None, tp, journal=journal, controls=controls)

    try:
        yield traced
    finally:
        tp.shutdown()  # flushes the batch


@app.command("eval")
def eval_command(
    suite: SuiteArgument,
    model: Annotated[
        str,
        typer.Option(
            "--model", "-m", help="Comma-separated models, e.g. sim:claude-sonnet-4-5,sim:gpt-5."
        ),
    ],
    policy: PoliciesOption = None,
    epochs: Annotated[int, typer.Option("--epochs", help="Trials per task and configuration.")] = 1,
    concurrency: RunsAtOnceOption = 4,
    out: Annotated[
        str | None,
        typer.Option(
            "--out",
            help="Directory for trial records, eval.json and report.html; re-running resumes.",
        ),
    ] = None,
    max_steps: MaxStepsOption = DEFAULT_MAX_STEPS,
    max_cost: RunMaxCostOption = None,
    sim_policy: SimPolicyOption = None,
    sim_latency: SimLatencyOption = 0.0,
    sandbox: TaskSandboxOption = None,
    preflight: Annotated[
        bool,
        typer.Option(
            "--preflight/--no-preflight",
            help="First verify each untouched task here: refuse tasks whose tests cannot run, pass untouched, or leak.",
        ),
    ] = True,
    force: Annotated[
        bool,
        typer.Option(
            "--force",
            help="Run tasks that fail the preflight; their unjudgeable trials count in infra_errors.",
        ),
    ] = False,
    otlp: OtlpOption = None,
    ray: RayOption = None,
    json_out: JsonFlag = False,
) -> None:
    """Evaluate models (and policies) on a task suite, with success and cost with confidence.

    Reports success with 95 % intervals, pass@k, pass^k, cost per solved task, paired
    significance tests and the cost–success frontier.

    \b
    Example:  stayer eval examples --model sim:claude-sonnet-4-5,sim:gpt-5 --epochs 3 --out eval-out
    """
    import time

    from rich.markup import escape

    from stayer.cli.progress import WorkProgress
    from stayer.eval import engine
    from stayer.eval.records import EvalFlags
    from stayer.eval.runner import INFRASTRUCTURE, infra_reason, run_trials
    from stayer.eval.suite import ProblemsError
    from stayer.eval.summary import succeeded
    from stayer.records import to_json

    try:
        configs = engine.configurations(
            _split(model),
            _split(policy),
            epochs=epochs,
            concurrency=concurrency,
            max_steps=max_steps,
            max_cost=parse_decimal(max_cost, "--max-cost"),
            sim_policy=sim_policy,
            sim_latency=sim_latency,
            sandbox=sandbox,
        )
    except ConfigError as e:
        bad_input(str(e))
    out_dir = Path(out) if out else None
    if out_dir is not None:
        check_writable_dir(out_dir, "--out")
    err = stderr()
    try:
        planned = engine.plan(suite, configs, epochs, out_dir)
    except ProblemsError as e:
        report_problems(e.problems)
    except ConfigError as e:
        bad_input(str(e))
    tasks, trials = planned.tasks, planned.trials
    to_check = planned.to_check
    preflight_found = (
        _preflight(to_check, sandbox, concurrency, force) if preflight and to_check else []
    )
    if ray and otlp:
        bad_input("--otlp: trials on Ray are not traced yet; leave out --otlp or --ray")
    executor = _ray_executor(ray) if ray else None
    counts = {"ok": 0, "fail": 0, "infra": 0, "reused": 0}
    progress = WorkProgress(err, "eval", len(trials))

    def on_done(trial: Any, record: TrialRecord, reused: bool) -> None:
        key = (
            "ok"
            if succeeded(record)
            else "infra"
            if record.error_class == INFRASTRUCTURE
            else "fail"
        )
        counts[key] += 1
        counts["reused"] += reused
        if key == "infra" and not reused:  # said as it happens: a table only counts it
            err.print(
                f"[yellow]infra:[/] {escape(_trial_name(record, trial.config.label))}: "
                f"{escape(infra_reason(record))}",
                highlight=False,
                soft_wrap=True,
            )
        progress.advance(
            record.cost_usd,
            f"✓ {counts['ok']}  ✗ {counts['fail']}  infra {counts['infra']}  reused {counts['reused']}",
            reused,
        )

    try:
        err.print(
            f"[bold]stayer eval[/] {len(tasks)} tasks × {len(configs)} configurations × {epochs} epochs "
            f"= {len(trials)} trials, {concurrency} at a time",
            highlight=False,
        )
        # Trials on Ray run in its workers: this process's tracer does not reach them.
        tracing_here = contextlib.nullcontext() if ray else _tracing(otlp)
        with progress, tracing_here as execute_run:
            records = run_async(
                lambda: run_trials(
                    trials,
                    concurrency=concurrency,
                    prices=planned.prices,
                    store=planned.store,
                    on_done=on_done,
                    execute_run=execute_run,
                    executor=executor,
                )
            )
    except KeyboardInterrupt:
        resume = (
            f"rerun with the same --out {out} to resume"
            if out_dir is not None
            else "nothing was kept: pass --out DIR to make an eval resumable"
        )
        err.print(
            f"interrupted: {progress.done}/{len(trials)} done; {escape(resume)}",
            highlight=False,
            soft_wrap=True,
        )
        raise typer.Exit(EXIT_INTERRUPTED) from None

    settings = EvalFlags(
        models=model,
        policies=policy or DEFAULT_POLICY,
        epochs=epochs,
        concurrency=concurrency,
        max_steps=max_steps,
        max_cost=max_cost,
        sandbox=sandbox,
        sim_policy=sim_policy,
        ray=ray,
    )
    doc = engine.document(
        suite,
        records,
        configs,
        epochs=epochs,
        reused=counts["reused"],
        preflight=preflight_found,
        settings=settings,
        wall_s=time.monotonic() - progress.started,
        out_dir=out_dir,
    )
    if json_out:
        emit_json(to_json(doc))
    _summary_table(doc, console(stderr=json_out))
    _infra_summary(doc, console(stderr=json_out), out if out_dir is not None else None)
    raise typer.Exit(EXIT_FAILED if counts["infra"] else EXIT_OK)


def _ray_executor(address: str) -> Any:
    """The Ray executor for ``--ray ADDRESS`` (cluster started or joined here); bad input
    (exit 2) when Ray is missing or a cluster has no shared journal."""
    from rich.markup import escape

    from stayer.scale.ray_backend import RayTrials, connect

    stderr().print(f"connecting to Ray ({escape(address)})…", highlight=False)
    try:
        connect(address)
    except ConfigError as e:
        bad_input(str(e))
    return RayTrials()


def _preflight(
    tasks: list[Any], sandbox: str | None, concurrency: int, force: bool
) -> list[PreflightFinding]:
    """The cheap checks on every task (``eval.checks.preflight``): refuse, exit 2, naming each
    task and its problem; with ``force``, warn and return them for the document."""
    from rich.markup import escape

    from stayer.eval.engine import preflight_all, preflight_lines

    err = stderr()
    if sandbox == "local":
        err.print(
            f"[yellow]note:[/] --sandbox {escape(sandbox)} cannot mount the tests: no preflight",
            highlight=False,
        )
        return []

    found = preflight_all(tasks, sandbox, concurrency)
    lines = preflight_lines(found)
    if lines and not force:
        report_problems([f"preflight: {line} (--force runs it anyway)" for line in lines])
    for line in lines:
        err.print(f"[yellow]warning:[/] preflight: {escape(line)}", highlight=False, soft_wrap=True)
    return found


def _trial_name(record: TrialRecord | InfraTrial, label: str) -> str:
    return f"{record.task} · {label} · epoch {record.epoch}"


def _infra_summary(doc: EvalDocument, console: Console, out: str | None) -> None:
    """The trials that could not be judged, each with its reason, and what to do next."""
    if not doc.infra_trials:
        return
    from stayer.tables import say

    labels = {c.id: c.label for c in doc.configs}
    n = len(doc.infra_trials)
    say(console, f"{n} trial{'s' * (n != 1)} could not be judged (not scored):")
    for t in doc.infra_trials:
        name = _trial_name(t, labels.get(t.config_key, t.config_key))
        say(console, f"  {name}: {t.reason}")
    again = (
        f"rerun with the same --out {out} to run only these again"
        if out is not None
        else "rerun (with --out DIR, a rerun runs only these again)"
    )
    say(console, f"next: fix the cause above, then {again}")


def _summary_table(doc: EvalDocument, console: Console) -> None:
    from stayer.tables import Col, FitTable, print_table, say

    def f(v: Any) -> str:
        return "—" if v is None else f"{v:.3f}" if isinstance(v, float) else str(v)

    t = FitTable(
        Col("configuration"),
        Col("success", number=True),
        Col("95 % CI", number=True),
        Col("pass^k", number=True, drop=2),
        Col("mean cost", number=True),
        Col("cost / success", number=True),
        Col("infra", number=True, drop=1),
        title="stayer eval",
    )
    for c in doc.configs:
        k = max(c.pass_hat_k, key=int)
        t.add_row(
            c.label,
            f"{c.successes}/{c.trials} = {f(c.success_rate)}",
            f"{f(c.ci_low)}–{f(c.ci_high)}",
            f"^{k} {f(c.pass_hat_k[k])}",
            usd(c.mean_cost_usd),
            usd(c.cost_per_success_usd),
            str(c.infra_errors),
        )
    print_table(console, t)
    for x in doc.comparisons:
        say(
            console,
            f"{x.b.label} vs {x.a.label}: Δ success {f(x.success_diff)}, {x.verdict}",
        )
    if isinstance(doc.report, str):
        say(console, f"report: {doc.report}")

"""``stayer rollouts``: samples for training (groups of K per task, across domains), and
``stayer rollouts stats DIR``: what they hold."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from stayer.choices import DEFAULT_MAX_STEPS
from stayer.cli.common import (
    EXIT_BUDGET,
    EXIT_FAILED,
    EXIT_OK,
    JsonFlag,
    app,
    bad_input,
    check_writable_dir,
    console,
    emit_json,
    parse_decimal,
    stderr,
    usd,
)
from stayer.cli.options import (
    MaxStepsOption,
    RayOption,
    RunsAtOnceOption,
    SimPolicyOption,
    TaskSandboxOption,
)
from stayer.errors import ConfigError

if TYPE_CHECKING:
    from stayer.scale.records import Sample

#: ``tasks check`` findings that keep a task out of rollouts (its reward says nothing about
#: the agent), and those that only lower its share.
EXCLUDED_KINDS = frozenset({"invalid", "oracle_fails", "nop_passes", "leak", "gameable"})


@app.command("rollouts")
def rollouts_command(
    args: Annotated[
        list[str],
        typer.Argument(
            metavar="SUITE | stats DIR", help="Suite directory (one domain), or `stats DIR`."
        ),
    ],
    model: Annotated[
        str | None,
        typer.Option("--model", "-m", help="The model that samples, e.g. sim:claude-sonnet-4-5."),
    ] = None,
    n: Annotated[
        int, typer.Option("--n", help="Samples per task: one group, compared with each other.")
    ] = 4,
    domains: Annotated[
        list[str] | None,
        typer.Option("--domains", help="Further suites, one domain each (repeatable)."),
    ] = None,
    target: Annotated[
        int | None, typer.Option("--target", help="Complete groups wanted (required).")
    ] = None,
    overprovision: Annotated[
        float,
        typer.Option(
            "--overprovision",
            help="Start up to target × (1 + F) groups; stragglers are finished, carried over or abandoned.",
        ),
    ] = 0.0,
    max_cost: Annotated[
        str | None,
        typer.Option(
            "--max-cost",
            help="Hard cap in USD for the whole job (each sample runs on a reserved slice).",
        ),
    ] = None,
    max_staleness: Annotated[
        int | None,
        typer.Option(
            "--max-staleness", help="Rounds a carried-over sample may span before it is abandoned."
        ),
    ] = None,
    out: Annotated[
        str | None,
        typer.Option(
            "--out", help="Directory for records and exports; running again continues (next round)."
        ),
    ] = None,
    fmt: Annotated[
        str, typer.Option("--format", help="jsonl, atif, verl, skyrl or verifiers.")
    ] = "jsonl",
    concurrency: RunsAtOnceOption = 4,
    max_steps: MaxStepsOption = DEFAULT_MAX_STEPS,
    sim_policy: SimPolicyOption = None,
    sandbox: TaskSandboxOption = None,
    checks: Annotated[
        str | None,
        typer.Option(
            "--checks",
            help="`stayer tasks check --json` output: flagged tasks are excluded or down-weighted.",
        ),
    ] = None,
    ray: RayOption = None,
    json_out: JsonFlag = False,
) -> None:
    """Collect rollouts for training: K samples per task across domains, with token ids,
    masks, exact per-step cost and raw + normalised rewards.

    \b
    Example:  stayer rollouts examples --model sim:claude-sonnet-4-5 --n 4 --target 3 --out ro --format verl
              stayer rollouts stats ro
    """
    if args and args[0] == "stats":
        if len(args) != 2:
            bad_input("rollouts stats: give one directory, e.g. stayer rollouts stats ro")
        _stats(Path(args[1]), json_out)
        return
    if len(args) != 1:
        bad_input("rollouts: give one SUITE (more domains with --domains)")
    _collect(
        [args[0], *(domains or [])],
        model,
        n,
        target,
        overprovision,
        max_cost,
        max_staleness,
        out,
        fmt,
        concurrency,
        max_steps,
        sim_policy,
        sandbox,
        checks,
        ray,
        json_out,
    )


def _collect(
    suites: list[str],
    model: str | None,
    n: int,
    target: int | None,
    overprovision: float,
    max_cost: str | None,
    max_staleness: int | None,
    out: str | None,
    fmt: str,
    concurrency: int,
    max_steps: int,
    sim_policy: str | None,
    sandbox: str | None,
    checks: str | None,
    ray: str | None,
    json_out: bool,
) -> None:
    import asyncio
    import uuid

    from rich.markup import escape
    from rich.text import Text

    from stayer.eval.runner import EvalConfig, LocalTrials, write_atomic
    from stayer.eval.suite import ProblemsError, load_suite
    from stayer.pricing import PriceBook
    from stayer.records import to_json
    from stayer.run import prepare
    from stayer.scale.exports import FORMATS, export
    from stayer.scale.rollouts import RolloutSpec, collect, domain_of, rollout_trial

    if not model:
        bad_input("--model: give the model that samples, e.g. --model sim:claude-sonnet-4-5")
    if target is None:
        bad_input("--target: give the number of complete groups wanted, e.g. --target 8")
    if out is None:
        bad_input("--out: give a directory for the rollouts")
    if fmt not in FORMATS:
        bad_input(f"--format {fmt}: expected one of {', '.join(FORMATS)}")
    for flag, value, low in (
        ("--n", n, 1),
        ("--target", target, 1),
        ("--concurrency", concurrency, 1),
        ("--max-steps", max_steps, 1),
    ):
        if value < low:
            bad_input(f"{flag} {value}: must be at least {low}")
    if overprovision < 0:
        bad_input(f"--overprovision {overprovision}: must be 0 or more")
    if max_staleness is not None and max_staleness < 0:
        bad_input(f"--max-staleness {max_staleness}: must be 0 or more")
    try:
        cap = parse_decimal(max_cost, "--max-cost")
    except ConfigError as e:
        bad_input(str(e))
    out_dir = Path(out)
    check_writable_dir(out_dir, "--out")
    err = stderr()
    config = EvalConfig(model, None, sim_policy, max_steps, None, sandbox)
    excluded, down_weighted = _flags(checks) if checks else ({}, {})
    by_domain: dict[str, list[Any]] = {}
    try:
        prices = PriceBook.load()
        for suite in suites:
            for task in load_suite(suite):
                if task.name in excluded:
                    err.print(
                        f"[yellow]excluded:[/] {escape(task.name)}: {escape(excluded[task.name])} (tasks check)",
                        highlight=False,
                    )
                    continue
                prepare(config.run_config(task, f"rollouts-validate-{uuid.uuid4().hex}"), prices)
                by_domain.setdefault(domain_of(task, Path(suite)), []).append(task)
    except ProblemsError as e:
        bad_input("; ".join(e.problems))
    except ConfigError as e:
        bad_input(str(e))
    if not by_domain:
        bad_input("rollouts: no task left to sample (all excluded?)")
    for name, why in sorted(down_weighted.items()):
        err.print(
            f"[yellow]down-weighted:[/] {escape(name)}: {escape(why)} (tasks check)",
            highlight=False,
        )
    executor: Any = LocalTrials(rollout_trial)
    if ray:
        from stayer.scale.ray_backend import RayTrials, connect

        try:
            connect(ray)
        except ConfigError as e:
            bad_input(str(e))
        executor = RayTrials(rollout_trial)
    spec = RolloutSpec(config, n, target, overprovision, cap, max_staleness, concurrency)

    def on_done(record: Sample) -> None:
        err.print(
            f"{escape(record.key)}: {escape(str(record.status))} reward {record.reward} {usd(record.cost_usd)}",
            highlight=False,
            soft_wrap=True,
        )

    doc = asyncio.run(
        collect(
            by_domain,
            spec,
            prices,
            out_dir,
            executor=executor,
            down_weighted=down_weighted,
            on_done=on_done,
        )
    )
    doc.excluded = excluded
    round_file = out_dir / "rounds" / f"round-{doc.round}.json"
    write_atomic(round_file, json.dumps(to_json(doc), indent=2))
    doc.export = written = export(_records(out_dir), out_dir, fmt)
    if json_out:
        emit_json(to_json(doc))
    console(stderr=json_out).print(
        Text(
            f"round {doc.round}: {doc.groups_complete}/{doc.target_groups} groups, {doc.samples} samples, "
            f"${doc.cost_usd} (abandoned ${doc.abandoned_cost_usd}); {written.format} → {written.path}"
        )
    )
    if doc.groups_complete >= target:
        raise typer.Exit(EXIT_OK)
    raise typer.Exit(EXIT_BUDGET if doc.stop_reason == "max_cost" else EXIT_FAILED)


def _flags(path: str) -> tuple[dict[str, str], dict[str, str]]:
    """Tasks that ``tasks check --json`` flagged: (excluded, down-weighted), name → why."""
    try:
        doc = json.loads(Path(path).read_text())
        tasks = doc["tasks"]
        excluded: dict[str, str] = {}
        down: dict[str, str] = {}
        for t in tasks:
            for p in t.get("problems", []):
                into = excluded if p["kind"] in EXCLUDED_KINDS else down
                into.setdefault(t["name"], f"{p['kind']}: {p.get('detail', '')}")
    except (OSError, ValueError, KeyError, TypeError) as e:
        bad_input(
            f"--checks {path}: not the output of `stayer tasks check --json` ({type(e).__name__}: {e})"
        )
    for name in excluded:
        down.pop(name, None)
    return excluded, down


def _records(out: Path) -> list[Sample]:
    """The samples kept in ``out`` (records without steps or a group are not samples)."""
    from stayer.records import decode
    from stayer.scale.records import Sample

    records = []
    for path in sorted((out / "trials").rglob("*.json")):
        try:
            r = decode(path.read_bytes(), Sample)
        except (OSError, ValueError):  # msgspec's errors are ValueErrors
            continue
        if isinstance(r.trace, list) and isinstance(r.group, str):
            records.append(r)
    return records


def _stats(out: Path, json_out: bool) -> None:
    """Per-domain rewards, success rates, cost per sample, and the allocation over time."""
    import statistics
    from decimal import Decimal

    from rich.markup import escape
    from rich.text import Text

    from stayer.eval.verify import passes
    from stayer.records import decode, to_json
    from stayer.scale.exports import raw_reward
    from stayer.scale.records import DomainStats, RolloutStats, RoundStats
    from stayer.scale.scheduler import learning_signal

    if not (out / "trials").is_dir():
        bad_input(f"{out}: no rollouts here (no trials/ directory)")
    records = _records(out)
    domains: dict[str, list[Sample]] = {}
    for r in records:
        domains.setdefault(r.domain_name, []).append(r)
    rows: list[DomainStats] = []
    for d, rs in sorted(domains.items()):
        rewards = [raw_reward(r) for r in rs]
        groups: dict[str, list[bool]] = {}
        for r in rs:
            groups.setdefault(r.group_name, []).append(passes(r.reward))
        costs = [c for r in rs if (c := r.cost.amount) is not None]
        rows.append(
            DomainStats(
                domain=d,
                samples=len(rs),
                groups=len(groups),
                groups_with_signal=sum(learning_signal(sum(o), len(o)) for o in groups.values()),
                success_rate=sum(passes(r.reward) for r in rs) / len(rs),
                reward_mean=statistics.fmean(rewards),
                reward_sd=statistics.pstdev(rewards),
                reward_min=min(rewards),
                reward_max=max(rewards),
                cost_per_sample_usd=str(sum(costs, Decimal(0)) / len(costs)) if costs else None,
            )
        )
    rounds = [
        decode(path.read_bytes(), RoundStats)
        for path in sorted(
            (out / "rounds").glob("round-*.json"), key=lambda p: int(p.stem.split("-")[1])
        )
    ]
    doc = RolloutStats(out=str(out.resolve()), samples=len(records), domains=rows, rounds=rounds)
    if json_out:
        emit_json(to_json(doc))
    from stayer.tables import Col, FitTable, print_table

    t = FitTable(
        Col("domain"),
        Col("samples", number=True),
        Col("groups", number=True, drop=2),
        Col("with signal", number=True, drop=1),
        Col("success", number=True),
        Col("reward mean ± sd", number=True),
        Col("cost / sample", number=True),
        title=f"stayer rollouts · {escape(str(out))}",
    )
    for row in rows:
        t.add_row(
            row.domain,
            str(row.samples),
            str(row.groups),
            str(row.groups_with_signal),
            f"{row.success_rate:.3f}",
            f"{row.reward_mean:.3f} ± {row.reward_sd:.3f}",
            usd(row.cost_per_sample_usd),
        )
    print_table(console(stderr=json_out), t)
    for rd in rounds:
        history = rd.allocation_history or []
        last = history[-1].allocation if history else {}
        shares = ", ".join(f"{d} {s:.2f}" for d, s in sorted(last.items()))
        console(stderr=json_out).print(Text(f"round {rd.round}: allocation at its end: {shares}"))
    raise typer.Exit(EXIT_OK)

"""What ``stayer eval`` does between its flags and its output, shared by the command and
``stayer.eval`` (``evaluate``; the package is callable): the configurations checked, the
pending trials checked runnable, the preflight, and the ``--json`` document with its files
in ``--out``. Bad input raises ``ConfigError`` (``ProblemsError`` for several problems)
before any trial runs.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path
from typing import TYPE_CHECKING, Any

from stayer._version import __version__
from stayer.choices import DEFAULT_MAX_STEPS, DEFAULT_POLICY
from stayer.errors import ConfigError
from stayer.eval.records import (
    Comparison,
    ConfigSummary,
    EvalDocument,
    EvalFlags,
    InfraTrial,
    ParetoPoint,
    PreflightFinding,
    TrialRecord,
)
from stayer.eval.runner import EvalConfig, Trial, TrialStore, write_atomic
from stayer.eval.suite import ProblemsError
from stayer.eval.task import Task
from stayer.money import usd_argument
from stayer.paths import check_writable_dir
from stayer.records import to_json

if TYPE_CHECKING:
    from stayer.pricing import PriceBook


def configurations(
    models: Sequence[str],
    policies: Sequence[str],
    *,
    epochs: int,
    concurrency: int,
    max_steps: int,
    max_cost: Decimal | None,
    sim_policy: str | None,
    sim_latency: float,
    sandbox: str | None,
) -> list[EvalConfig]:
    """Every model × policy, once the flags are within their bounds."""
    from stayer.settings import EvalSettings, RunFlags, check_flags

    if not models:
        raise ConfigError("--model: give at least one model, e.g. --model sim:claude-sonnet-4-5")
    if len(set(models)) != len(models):
        raise ConfigError(f"--model {','.join(models)}: a model is listed twice")
    check_flags(EvalSettings, {"epochs": epochs, "concurrency": concurrency})
    check_flags(
        RunFlags, {"max_steps": max_steps, "max_cost": max_cost, "sim_latency": sim_latency}
    )
    chosen: list[str | None] = list(policies) or [None]
    return [
        EvalConfig(m, p, sim_policy, max_steps, max_cost, sandbox, sim_latency)
        for m in models
        for p in chosen
    ]


@dataclass(frozen=True)
class EvalPlan:
    """A suite's trials, and of its tasks those with a trial still to run (``to_check``),
    priced with ``prices`` (None when nothing is left to run)."""

    tasks: list[Task]
    trials: list[Trial]
    store: TrialStore | None
    prices: PriceBook | None
    to_check: list[Task]


def plan(
    suite: str | Path, configs: Sequence[EvalConfig], epochs: int, out_dir: Path | None
) -> EvalPlan:
    """The trials of ``suite`` × ``configs`` × ``epochs``; those not kept in ``out_dir``
    already are checked runnable (``runnable_prices``). Only what is still to run is
    checked: re-rendering a finished ``--out`` checks nothing again, and imports neither
    the agent nor the price data. Bad input: ``ConfigError`` or ``ProblemsError``."""
    from stayer.eval.runner import plan_trials
    from stayer.eval.suite import load_suite

    tasks = load_suite(suite)
    trials = plan_trials(tasks, configs, epochs)
    store = TrialStore(out_dir) if out_dir else None
    todo = {(t.task.path, t.config) for t in trials if store is None or store.load(t) is None}
    prices = runnable_prices(tasks, configs, todo) if todo else None
    to_check = [t for t in tasks if any(path == t.path for path, _ in todo)]
    return EvalPlan(tasks, trials, store, prices, to_check)


def runnable_prices(
    tasks: Sequence[Task], configs: Sequence[EvalConfig], todo: set[tuple[Path, EvalConfig]]
) -> PriceBook:
    """The price book, once every pair in ``todo`` is known to be runnable (model, prices,
    sandbox, limits); else ``ProblemsError`` with all that is wrong."""
    from stayer.pricing import PriceBook
    from stayer.run import prepare

    prices = PriceBook.load()
    problems = []
    for task in tasks:
        for config in configs:
            if (task.path, config) not in todo:
                continue
            try:
                prepare(config.run_config(task, f"eval-validate-{uuid.uuid4().hex}"), prices)
            except ConfigError as e:
                problems.append(f"{task.path.name} · {config.label}: {e}")
    if problems:
        raise ProblemsError(sorted(set(problems)))
    return prices


def preflight_all(
    tasks: Sequence[Task], sandbox: str | None, concurrency: int
) -> list[PreflightFinding]:
    """``eval.checks.preflight`` on every task: those with problems, as the document
    lists them."""
    from stayer.eval.checks import preflight

    async def check_all() -> list[list[Any]]:
        gate = asyncio.Semaphore(concurrency)

        async def one(task: Task) -> list[Any]:
            async with gate:
                return await preflight(task, sandbox=sandbox)

        return list(await asyncio.gather(*(one(t) for t in tasks)))

    return [
        PreflightFinding(task=task.name, problems=list(problems))
        for task, problems in zip(tasks, asyncio.run(check_all()), strict=True)
        if problems
    ]


def preflight_lines(found: Sequence[PreflightFinding]) -> list[str]:
    return [f"{f.task}: {p.kind}: {p.detail}" for f in found for p in f.problems]


def document(
    suite: str | Path,
    records: list[TrialRecord],
    configs: Sequence[EvalConfig],
    *,
    epochs: int,
    reused: int,
    preflight: list[PreflightFinding],
    settings: EvalFlags,
    wall_s: float,
    out_dir: Path | None,
) -> EvalDocument:
    """The ``--json`` document; with ``out_dir``, also written there with ``report.html``
    and a page per run."""
    from stayer.eval.html_report import render, write_run_pages
    from stayer.eval.summary import summarise

    summary = summarise(records, configs, epochs)
    doc = EvalDocument(
        suite=str(Path(suite).resolve()),
        epochs=epochs,
        trials_total=len(records),
        trials_reused=reused,
        preflight=preflight,
        stayer_version=__version__,
        settings=settings,
        finished=datetime.now(UTC).isoformat(timespec="seconds"),
        wall_s=round(wall_s, 3),
        configs=summary.configs,
        comparisons=summary.comparisons,
        pareto=summary.pareto,
        tasks=summary.tasks,
        infra_trials=summary.infra_trials,
    )
    if out_dir is not None:
        doc.out = str(out_dir.resolve())
        write_atomic(out_dir / "eval.json", json.dumps(to_json(doc), indent=2))
        write_run_pages(out_dir, records, write_atomic)
        write_atomic(
            out_dir / "report.html", render(doc, records, f"stayer eval · {Path(suite).name}")
        )
        doc.report = str((out_dir / "report.html").resolve())
    return doc


@dataclass(frozen=True)
class EvalOutcome:
    """An evaluation's result (``stayer eval --json``): per configuration its success with
    interval and cost (``configs``), the paired comparisons, the frontier, and the whole
    document."""

    suite: str
    trials_total: int
    configs: list[ConfigSummary]
    comparisons: list[Comparison]
    pareto: list[ParetoPoint]
    infra_trials: list[InfraTrial]
    document: dict[str, Any]  # as JSON: the API's boundary, as ``RunOutcome.document``

    @classmethod
    def from_document(cls, doc: EvalDocument) -> EvalOutcome:
        return cls(
            suite=doc.suite,
            trials_total=doc.trials_total,
            configs=list(doc.configs),
            comparisons=list(doc.comparisons),
            pareto=list(doc.pareto),
            infra_trials=list(doc.infra_trials),
            document=to_json(doc),
        )


def evaluate(
    suite: str | Path,
    *,
    models: Sequence[str],
    policies: Sequence[str] = (),
    epochs: int = 1,
    concurrency: int = 4,
    out: str | Path | None = None,
    max_steps: int = DEFAULT_MAX_STEPS,
    max_cost: Decimal | str | int | float | None = None,
    sim_policy: str | None = None,
    sim_latency: float = 0.0,
    sandbox: str | None = None,
    preflight: bool = True,
    force: bool = False,
) -> EvalOutcome:
    """Evaluate ``models`` (× ``policies``) on the tasks in ``suite``, ``epochs`` trials
    each: ``stayer eval SUITE --model M1,M2 …``. With ``out``, trials are kept there with
    ``eval.json`` and ``report.html``, and a second call reuses the finished ones. A task
    failing the preflight raises ``ConfigError`` unless ``force``."""
    from stayer.eval.runner import run_trials

    started = time.monotonic()
    configs = configurations(
        list(models),
        list(policies),
        epochs=epochs,
        concurrency=concurrency,
        max_steps=max_steps,
        max_cost=usd_argument(max_cost, "max_cost"),
        sim_policy=sim_policy,
        sim_latency=sim_latency,
        sandbox=sandbox,
    )
    out_dir = None if out is None else Path(out)
    if out_dir is not None:
        check_writable_dir(out_dir, "out")
    planned = plan(suite, configs, epochs, out_dir)
    found: list[PreflightFinding] = []
    if preflight and planned.to_check and sandbox != "local":
        found = preflight_all(planned.to_check, sandbox, concurrency)
        lines = preflight_lines(found)
        if lines and not force:
            raise ProblemsError(
                [f"preflight: {line} (force=True runs it anyway)" for line in lines]
            )
    reused = 0

    def on_done(trial: Any, record: TrialRecord, was_reused: bool) -> None:
        nonlocal reused
        reused += was_reused

    records = asyncio.run(
        run_trials(
            planned.trials,
            concurrency=concurrency,
            prices=planned.prices,
            store=planned.store,
            on_done=on_done,
        )
    )
    settings = EvalFlags(
        models=",".join(models),
        policies=",".join(policies) or DEFAULT_POLICY,
        epochs=epochs,
        concurrency=concurrency,
        max_steps=max_steps,
        max_cost=None if max_cost is None else str(max_cost),
        sandbox=sandbox,
        sim_policy=sim_policy,
        ray=None,
    )
    doc = document(
        suite,
        records,
        configs,
        epochs=epochs,
        reused=reused,
        preflight=found,
        settings=settings,
        wall_s=time.monotonic() - started,
        out_dir=out_dir,
    )
    return EvalOutcome.from_document(doc)

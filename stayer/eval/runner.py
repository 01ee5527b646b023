"""Run tasks × epochs × configurations concurrently, each trial on a fresh workspace.

A trial is one ``stayer run`` (``stayer.run.prepare`` + ``execute``, which also enforces the
task's agent time limit): the runner adds concurrency, an error class, and a store that
makes evaluations resumable. Each finished trial is written atomically to
``OUT/trials/<config>/<task>.e<N>.json``; re-running with the same ``OUT`` reuses those
records and runs only what is missing.

Details and rationale: docs/notes.md, ``stayer/eval/runner.py``.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import json
import os
import re
import time
import traceback
import uuid
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from stayer.eval.records import ConfigSettings, EarlierAttempt, TrialRecord
from stayer.eval.task import Task
from stayer.eval.verify import passes
from stayer.journal.backends import open_store, stayer_home
from stayer.records import decode, to_json
from stayer.settings import RunSettings
from stayer.workspace.hostfs import tree_digest

if TYPE_CHECKING:
    from stayer.agent import Observer
    from stayer.journal import RunJournal
    from stayer.pricing import PriceBook
    from stayer.run import Controls, PreparedRun, RunReport

#: Runs a prepared run (continuing ``journal`` when there is one) to its result document.
RunExecutor = Callable[["PreparedRun", "RunJournal | None", "Controls"], Awaitable["RunReport"]]

# The agent (``stayer.run``) is imported when a trial runs: an evaluation whose trials are
# all done only re-renders its report, and that needs neither it nor the price data.

AGENT_FAILURE, LIMIT_REACHED, INFRASTRUCTURE = "agent_failure", "limit_reached", "infrastructure"
ERROR_CLASSES = (AGENT_FAILURE, LIMIT_REACHED, INFRASTRUCTURE)


def _slug(text: str, limit: int = 48) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", text).strip("_.")[:limit] or "x"


@dataclass(frozen=True)
class EvalConfig:
    """One configuration under evaluation: a model and the harness settings that matter."""

    model: str
    policy: str | None = None  # context policy; None: the run's default
    sim_policy: str | None = None
    max_steps: int = RunSettings.max_steps
    max_cost: Decimal | None = None
    # None: each task's own (Task.kind: task.toml's, its image's, else bwrap), as ``stayer run`` chooses
    sandbox: str | None = None
    sim_latency: float = 0.0

    @property
    def policy_name(self) -> str:
        return self.policy or RunSettings.policy

    @property
    def label(self) -> str:
        return self.model if self.policy is None else f"{self.model} · {self.policy}"

    def settings(self) -> ConfigSettings:
        return ConfigSettings(
            model=self.model,
            policy=self.policy_name,
            sim_policy=self.sim_policy,
            max_steps=self.max_steps,
            max_cost=None if self.max_cost is None else str(self.max_cost),
            sandbox=self.sandbox,
            sim_latency=self.sim_latency,
        )

    @property
    def key(self) -> str:
        """Directory name of this configuration's trials: readable, plus a hash of every
        setting, so that changing any of them never reuses another setting's results."""
        settings = json.dumps(to_json(self.settings()), sort_keys=True)
        digest = hashlib.sha256(settings.encode()).hexdigest()
        return f"{_slug(self.model)}-{_slug(self.policy_name, 24)}-{digest[:8]}"

    def run_config(self, task: Task, run_id: str) -> RunSettings:
        return RunSettings(
            task_dir=str(task.path),
            model=self.model,
            max_steps=self.max_steps,
            max_cost=self.max_cost,
            run_id=run_id,
            sim_policy=self.sim_policy,
            sim_latency=self.sim_latency,
            sandbox=self.sandbox,
            policy=RunSettings.policy if self.policy is None else self.policy,
        )


def task_digest(task: Task) -> str:
    """Content hash of a task directory: a record is reused only for the same task content."""
    return tree_digest(task.path)[:16]


@dataclass(frozen=True)
class Trial:
    task: Task
    config: EvalConfig
    epoch: int  # 1-based
    digest: str = ""

    @property
    def key(self) -> str:
        return f"{self.config.key}/{self.task.name}.e{self.epoch}"

    def new_run_id(self) -> str:
        return f"eval-{_slug(self.task.name, 32)}-e{self.epoch}-{uuid.uuid4().hex[:8]}"


def plan_trials(tasks: Sequence[Task], configs: Sequence[EvalConfig], epochs: int) -> list[Trial]:
    """Every (task, config, epoch), epoch-major, so that a partial run covers every task and
    configuration evenly before repeating any."""
    digests = {t.path: task_digest(t) for t in tasks}
    return [
        Trial(task, config, epoch, digests[task.path])
        for epoch in range(1, epochs + 1)
        for task in tasks
        for config in configs
    ]


def error_class(report: RunReport) -> str | None:
    """None for a trial whose tests passed; else why it did not succeed (module docstring)."""
    if passes(report.reward):
        return None
    verifier = report.verifier or None  # UNSET: the verifier did not run
    if report.status == "error" or (verifier and verifier.outcome == "infrastructure"):
        return INFRASTRUCTURE  # the model call failed after retries, or the tests could not run
    if report.status == "budget_exhausted":
        return LIMIT_REACHED
    if report.reward is None and not (verifier and verifier.timed_out):
        return INFRASTRUCTURE  # no judgement (a record from before outcomes were classified)
    return AGENT_FAILURE


def infra_reason(record: TrialRecord) -> str:
    """Why a trial of the infrastructure class could not be judged, as its record says:
    the run's error, or the verifier's reason the tests could not run here."""
    return str(record.error or "no reason was recorded")


def _record(trial: Trial, **fields: Any) -> TrialRecord:
    return TrialRecord(
        key=trial.key,
        task=trial.task.name,
        task_path=str(trial.task.path),
        task_digest=trial.digest,
        model=trial.config.model,
        policy=trial.config.policy_name,
        config_key=trial.config.key,
        config=trial.config.settings(),
        epoch=trial.epoch,
        **fields,
        finished=datetime.now(UTC).isoformat(),
    )


async def run_trial(
    trial: Trial,
    prices: PriceBook,
    *,
    run_id: str | None = None,
    on_started: Callable[[str], None] | None = None,
    execute_run: RunExecutor | None = None,
    observers: Sequence[Observer] = (),
) -> TrialRecord:
    """Run one trial to a record; never raises for a failure of the trial itself.

    ``run_id`` names the run of an earlier attempt that a killed evaluation left behind: it
    is continued through its journal, or, if it had finished, its result is taken as it is.
    ``on_started(run_id)`` is called once the run's id is fixed, before the run starts.
    ``execute_run`` runs the prepared run (default: ``stayer.run.execute``; the CLI passes
    a traced one). ``observers`` watch the run (``stayer.agent.Observer``)."""
    started = time.monotonic()
    run_id = run_id or trial.new_run_id()
    resumed = False
    try:
        report, resumed = await _run_or_resume(
            trial, prices, run_id, on_started, execute_run, observers
        )
    except Exception as e:  # a trial that cannot run is recorded, not fatal to the evaluation
        return crashed_record(trial, run_id, e, time.monotonic() - started)
    verifier = report.verifier or None  # UNSET: the verifier did not run
    return _record(
        trial,
        status=report.status,
        error_class=error_class(report),
        reward=report.reward,
        steps=report.steps,
        usage=to_json(report.usage),
        tokens=report.usage.input_tokens + report.usage.output_tokens,
        cost_usd=report.cost_usd,
        wall_s=round(time.monotonic() - started, 3),
        run_id=report.run_id,
        run_dir=report.run_dir,
        resumed=resumed,
        stop_reason=report.stop_reason,
        verifier_outcome=verifier.outcome if verifier else None,
        error=report.error or (verifier.error if verifier else None),
    )


def crashed_record(trial: Trial, run_id: str, error: BaseException, wall_s: float) -> TrialRecord:
    """The record of a trial whose run crashed: an infrastructure error, with what its
    journal says it spent."""
    steps, cost, ran = _spent(run_id)
    return _record(
        trial,
        steps=steps,
        cost_usd=cost,
        run_id=ran,
        reward=None,
        usage={},
        tokens=0,
        status="error",
        error_class=INFRASTRUCTURE,
        error=f"{type(error).__name__}: {error}",
        traceback="".join(traceback.format_exception(error, limit=8)),
        wall_s=round(wall_s, 3),
    )


async def _run_or_resume(
    trial: Trial,
    prices: PriceBook,
    run_id: str,
    on_started: Callable[[str], None] | None,
    execute_run: RunExecutor | None = None,
    observers: Sequence[Observer] = (),
) -> tuple[RunReport, bool]:
    """The result of run ``run_id``: run from the start if the journal has no such
    run, else continued from its journal (or its result, if it had finished). Whether it
    was continued comes second."""
    from stayer.eval.resume import prepare_resume
    from stayer.journal import RunFinished
    from stayer.run import Controls, execute, prepare

    store = open_store(stayer_home())
    assert store is not None
    journal = None
    try:
        if store.run(run_id) is None:
            prepared = prepare(trial.config.run_config(trial.task, run_id), prices, store=store)
            if on_started is not None:
                on_started(run_id)
        else:
            try:
                prepared, journal = prepare_resume(run_id, store=store, prices=prices)
            except RunFinished as e:
                store.close()
                return e.result, True
    except BaseException:
        store.close()
        raise
    prepared.close_store = True  # execute closes it
    controls = Controls(observers=list(observers))
    if execute_run is not None:
        report = await execute_run(prepared, journal, controls)
    else:
        report = await execute(prepared, journal=journal, controls=controls)
    return report, journal is not None


def _spent(run_id: str) -> tuple[int, str, str | None]:
    """What the journal says run ``run_id`` spent (a trial that crashed still paid for its
    calls): steps, cost and the run id; nothing if it never started."""
    try:
        store = open_store(stayer_home(), create=False)
    except Exception:  # the journal itself is the problem: the error says so
        store = None
    if store is None:
        return 0, "0", None
    try:
        row = store.run(run_id)
    finally:
        store.close()
    if row is None:
        return 0, "0", None
    return row.steps, row.cost_usd, run_id


class TrialStore:
    """Finished trials as one JSON file each, written atomically (temp file + rename), so a
    killed evaluation never leaves a half-written record and resumes where it stopped; and
    the run id of each trial in progress (``<key>.run``), so that its run is continued."""

    def __init__(self, out: Path, record_type: type[TrialRecord] = TrialRecord) -> None:
        self.out = out
        self.dir = out / "trials"
        self.record_type = record_type  # what its files are read back as

    def path(self, trial: Trial) -> Path:
        return self.dir / f"{trial.key}.json"

    def run_path(self, trial: Trial) -> Path:
        return self.dir / f"{trial.key}.run"

    def _read(self, trial: Trial) -> TrialRecord | None:
        try:
            return decode(self.path(trial).read_bytes(), self.record_type)
        except (OSError, ValueError):  # msgspec's DecodeError is a ValueError
            return None

    def load(self, trial: Trial) -> TrialRecord | None:
        """The finished record of ``trial``, or None if it must (re)run: missing, unreadable,
        another task content, or an infrastructure error (which is worth retrying)."""
        record = self._read(trial)
        if (
            record is None
            or record.task_digest != trial.digest
            or record.error_class == INFRASTRUCTURE
        ):
            return None
        return record

    def earlier_attempts(self, trial: Trial) -> list[EarlierAttempt]:
        """The attempts that the trial's next record replaces (a record that ``load``
        rejected, and those it replaced): their money was spent all the same."""
        record = self._read(trial)
        if record is None:
            return []
        earlier = record.earlier_attempts if isinstance(record.earlier_attempts, list) else []
        return [*earlier, record.attempt()]

    def run_in_progress(self, trial: Trial) -> str | None:
        """The run id of the trial's run that a killed evaluation left unrecorded, if any."""
        try:
            run_id = self.run_path(trial).read_text().strip()
        except OSError:
            return None
        record = self._read(trial)
        return run_id if run_id and (record is None or record.run_id != run_id) else None

    def started(self, trial: Trial, run_id: str) -> None:
        write_atomic(self.run_path(trial), run_id + "\n")

    def save(self, record: TrialRecord) -> None:
        path = self.dir / f"{record.key}.json"
        write_atomic(path, json.dumps(to_json(record), indent=2))
        path.with_suffix(".run").unlink(missing_ok=True)


def write_atomic(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text)
    tmp.replace(path)


#: A function that runs one trial to its record, as ``run_trial`` (whose signature it has).
TrialFunction = Callable[..., Awaitable[TrialRecord]]


class TrialExecutor(Protocol):
    """Where a trial runs. ``run`` has ``run_trial``'s contract: one record, never raising for
    a failure of the trial itself, the run journaled in the shared store (``$STAYER_HOME`` or
    ``STAYER_DB``) so that a trial another process or machine ran resumes anywhere."""

    async def run(
        self,
        trial: Trial,
        prices: PriceBook,
        run_id: str | None,
        on_started: Callable[[str], None] | None,
    ) -> TrialRecord: ...


class LocalTrials:
    """The default executor: every trial a coroutine in this process, run by ``trial_fn``
    (``run_trial``, or a function with its signature that adds to the record)."""

    def __init__(self, trial_fn: TrialFunction = run_trial) -> None:
        self.trial_fn = trial_fn

    async def run(
        self,
        trial: Trial,
        prices: PriceBook,
        run_id: str | None,
        on_started: Callable[[str], None] | None,
    ) -> TrialRecord:
        return await self.trial_fn(trial, prices, run_id=run_id, on_started=on_started)


async def run_trials(
    trials: Sequence[Trial],
    *,
    concurrency: int,
    prices: PriceBook | None,
    store: TrialStore | None = None,
    on_start: Callable[[Trial], None] | None = None,
    on_done: Callable[[Trial, TrialRecord, bool], None] | None = None,
    execute_run: RunExecutor | None = None,
    executor: TrialExecutor | None = None,
) -> list[TrialRecord]:
    """Run (or reuse) every trial, at most ``concurrency`` at a time; records in trial order.
    ``execute_run``: see ``run_trial`` (the CLI's traces each trial's run).

    ``on_done(trial, record, reused)`` is called as each finishes, for live progress.
    ``prices`` may be None only when the store holds every trial.
    ``executor``: where trials run (default: here, ``LocalTrials``); ``execute_run`` applies
    to trials run here."""
    if executor is not None and execute_run is not None:
        raise ValueError("execute_run: trials run by another executor are executed where they run")
    executor = executor or LocalTrials(
        functools.partial(run_trial, execute_run=execute_run) if execute_run else run_trial
    )
    gate = asyncio.Semaphore(concurrency)

    async def one(trial: Trial) -> TrialRecord:
        if store is not None and (record := store.load(trial)) is not None:
            if on_done:
                on_done(trial, record, True)
            return record
        assert prices is not None, f"{trial.key}: not in the store, and no prices to run it with"
        async with gate:
            if on_start:
                on_start(trial)
            if store is None:
                record = await executor.run(trial, prices, None, None)
            else:
                earlier = store.earlier_attempts(trial)
                record = await executor.run(
                    trial,
                    prices,
                    store.run_in_progress(trial),
                    lambda rid: store.started(trial, rid),
                )
                if earlier:
                    record.earlier_attempts = earlier
                store.save(record)
        if on_done:
            on_done(trial, record, False)
        return record

    return list(await asyncio.gather(*(one(t) for t in trials)))

"""``stayer rollouts``: K samples per task (a group, for GRPO-style training) across task
domains, until ``target`` groups are complete, within a job's dollar cap.

Each sample is one trial (``eval.runner``), run by a ``TrialExecutor`` (here, or on Ray)
with a ``StepRecorder``: its record (``OUT/trials/…``, written atomically, reused when the
command is run again) holds every step's token ids, new messages and cost by kind.

Details and rationale: docs/notes.md, ``stayer/scale/rollouts.py``.
"""

from __future__ import annotations

import asyncio
import json
import math
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path
from typing import cast

import msgspec

from stayer.eval.runner import (
    EvalConfig,
    LocalTrials,
    Trial,
    TrialExecutor,
    TrialStore,
    run_trial,
    task_digest,
    write_atomic,
)
from stayer.eval.task import Task
from stayer.eval.verify import passes
from stayer.guard.budget import MemoryBudgetStore
from stayer.journal import open_store
from stayer.journal.backends import stayer_home
from stayer.money import ZERO, Usd
from stayer.pricing import PriceBook
from stayer.records import decode, to_json
from stayer.scale.recorder import StepRecorder
from stayer.scale.records import (
    Abandoned,
    Carried,
    RolloutStateDoc,
    RoundSummary,
    Sample,
)
from stayer.scale.scheduler import Job, Scheduler, StragglerAction, straggler_action

#: ``scheduler.straggler_action``'s signature.
StragglerPolicy = Callable[..., StragglerAction]
CACHE_TTL_S = 300.0  # the default prompt-cache lifetime (Anthropic 5 m; OpenAI ≥ 5 m)


async def rollout_trial(
    trial: Trial,
    prices: PriceBook,
    *,
    run_id: str | None = None,
    on_started: Callable[[str], None] | None = None,
) -> Sample:
    """``run_trial`` with a ``StepRecorder``: the record gains ``trace`` (one per step) and
    ``trace_complete`` (False when steps were replayed from a journal, unseen)."""
    recorder = StepRecorder(prices)
    record = await run_trial(
        trial, prices, run_id=run_id, on_started=on_started, observers=[recorder]
    )
    return Sample(
        **msgspec.structs.asdict(record),
        trace=recorder.steps,
        trace_complete=recorder.complete(record.steps),
    )


@dataclass(frozen=True)
class RolloutSpec:
    config: EvalConfig  # model and harness settings of every sample
    samples: int  # K, per group
    target: int  # complete groups wanted
    overprovision: float = 0.0
    max_cost: Decimal | None = None
    max_staleness: int | None = None  # rounds a carried sample may span
    concurrency: int = 4
    min_share: float = 0.1

    @property
    def launch_limit(self) -> int:
        return math.ceil(self.target * (1 + self.overprovision))


def domain_of(task: Task, suite: Path) -> str:
    """A task's domain: ``[metadata] domain`` in its task.toml, else its suite's name."""
    return str(task.metadata.get("domain") or suite.resolve().name)


class RolloutState:
    """What persists between rounds on one ``OUT``: the round number, the round each
    carried sample started in, and the allocation over time."""

    def __init__(self, out: Path) -> None:
        self.path = out / "rollouts-state.json"
        try:
            doc = decode(self.path.read_bytes(), RolloutStateDoc)
        except (OSError, ValueError):  # msgspec's errors are ValueErrors
            doc = RolloutStateDoc()
        self.round = doc.round + 1
        self.carried: dict[str, Carried] = dict(doc.carried)  # key -> round, domain, g
        self.abandoned: list[Abandoned] = list(doc.abandoned)

    def save(self) -> None:
        doc = RolloutStateDoc(round=self.round, carried=self.carried, abandoned=self.abandoned)
        write_atomic(self.path, json.dumps(to_json(doc), indent=2))


async def collect(
    domains: Mapping[str, Sequence[Task]],
    spec: RolloutSpec,
    prices: PriceBook,
    out: Path,
    *,
    executor: TrialExecutor | None = None,
    down_weighted: Mapping[str, str] | None = None,
    on_done: Callable[[Sample], None] | None = None,
    config_of: Callable[[Task, int], EvalConfig] | None = None,
    stragglers: StragglerPolicy = straggler_action,
) -> RoundSummary:
    """Run one round of rollouts into ``out``; returns the round's summary document.
    ``down_weighted``: task name → why (``tasks check``), scheduled at weight 0.25.
    ``config_of(task, epoch)``: a sample's settings where they differ (default
    ``spec.config``); ``stragglers``: the decision for samples still running at the target."""
    executor = executor or LocalTrials(rollout_trial)
    down_weighted = down_weighted or {}
    store = TrialStore(out, Sample)
    state = RolloutState(out)
    scheduler = Scheduler(min_share=spec.min_share)
    budget = MemoryBudgetStore()
    budget.open("job", spec.max_cost)
    slice_cap = None if spec.max_cost is None else spec.max_cost / spec.concurrency
    started_at = time.monotonic()

    # Groups: task × group number, numbered on from the earlier rounds' (a task is sampled
    # again in later groups); a round killed before its end is run again with its numbers.
    digests = {t.path: task_digest(t) for ts in domains.values() for t in ts}
    per_domain = spec.launch_limit

    def group_job(domain: str, g: int, priority: int = 0) -> Job:
        tasks = domains[domain]
        task = tasks[g % len(tasks)]
        epochs = range(g * spec.samples + 1, (g + 1) * spec.samples + 1)
        trials = [
            Trial(task, config_of(task, e) if config_of else spec.config, e, digests[task.path])
            for e in epochs
        ]
        weight = 0.25 if task.name in down_weighted else 1.0
        return Job(
            f"{domain}/{task.name}.g{g + 1}",
            domain=domain,
            priority=priority,
            weight=weight,
            payload=(g, trials),
        )

    for domain in sorted(domains):
        for g in range((state.round - 1) * per_domain, state.round * per_domain):
            scheduler.add(group_job(domain, g))
    # Groups with a sample carried over from an earlier round go first (their finished
    # samples are reused; the carried one continues from its journal).
    carried_keys = sorted(state.carried)
    for domain, g in sorted(
        {(c.domain, c.g) for c in state.carried.values() if c.domain in domains}
    ):
        scheduler.add(group_job(domain, g, priority=1))
    gate = asyncio.Semaphore(spec.concurrency)
    running: dict[str, tuple[asyncio.Task[Sample | None], Trial]] = {}
    records: dict[str, Sample] = {}
    groups_done: list[str] = []
    sample_group: dict[str, tuple[str, int]] = {}  # sample key -> its group's domain and number
    groups_launched = 0
    abandoned_usd = ZERO
    stop_reason = "target"

    async def sample(trial: Trial, run_id: str | None, job: Job) -> Sample | None:
        """The trial's sample; None when the job's cap cannot fund its slice."""
        hold = budget.reserve("job", slice_cap) if slice_cap is not None else None
        if slice_cap is not None and hold is None:
            return None
        record: Sample | None = None
        try:
            # The run's own cap is its slice: it never spends beyond what was reserved.
            t = (
                replace(trial, config=replace(trial.config, max_cost=slice_cap))
                if slice_cap is not None
                else trial
            )
            ran = await executor.run(t, prices, run_id, lambda rid: store.started(trial, rid))
            record = ran if isinstance(ran, Sample) else Sample(**msgspec.structs.asdict(ran))
            record.key = trial.key  # the slice is a budget, not a setting: one key
            record.domain, record.group = job.domain, job.key
            record.weight, record.round = job.weight, state.round
            store.save(record)
            return record
        finally:
            if hold is not None:
                assert slice_cap is not None  # only a slice is ever held
                # What it spent; a sample stopped midway, what its journal says it spent.
                cost = record.cost.amount if record is not None else None
                spent = cost if cost is not None else _spent_so_far(store, trial)
                budget.settle(hold, slice_cap if spent is None else spent)  # unknown: all it held

    async def group(job: Job) -> None:
        g, trials = job.payload
        sample_group.update({t.key: (job.domain, g) for t in trials})
        outcomes: list[bool] = []
        cost = ZERO

        async def one(trial: Trial) -> None:
            nonlocal cost
            reused = cast("Sample | None", store.load(trial))
            record: Sample | None
            if reused is not None and isinstance(reused.trace, list):
                record = reused
            else:
                async with gate:
                    task = asyncio.ensure_future(sample(trial, store.run_in_progress(trial), job))
                    running[trial.key] = (task, trial)
                    try:
                        record = await task
                    finally:
                        running.pop(trial.key, None)
            if record is None:  # unfunded
                return
            records[trial.key] = record
            outcomes.append(passes(record.reward))
            cost += record.cost.amount or ZERO
            if on_done:
                on_done(record)

        await asyncio.gather(*(one(t) for t in trials), return_exceptions=False)
        scheduler.finished(job, cost, outcomes)
        if len(outcomes) == len(trials):
            groups_done.append(job.key)

    tasks: set[asyncio.Task[None]] = set()
    while True:
        if len(groups_done) >= spec.target:
            break
        # Groups in flight: enough to keep ``concurrency`` samples busy, no more, so that
        # the scheduler chooses each next group with what the finished ones taught it.
        while groups_launched < spec.launch_limit and len(tasks) < max(
            1, spec.concurrency // spec.samples + 1
        ):
            if slice_cap is not None and (budget.account("job").available or ZERO) < slice_cap:
                stop_reason = "max_cost"
                break
            job = scheduler.next()
            if job is None:
                break
            groups_launched += 1
            tasks.add(asyncio.ensure_future(group(job)))
        if not tasks:
            stop_reason = stop_reason if stop_reason == "max_cost" else "exhausted"
            break
        done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        tasks -= done
        for t in done:
            t.result()
    target_s = time.monotonic() - started_at
    at_target = len(groups_done)
    cost_at_target = _known_total(records.values())

    # Stragglers: finish, carry over or abandon each sample still running.
    decisions = await _stragglers(store, running, records, spec, state, prices, stragglers)
    stopped = {key: running[key] for action in ("carry", "abandon") for key in decisions[action]}
    still = [task for task, _ in running.values()]
    for task, _ in stopped.values():
        task.cancel()
    await asyncio.gather(*still, return_exceptions=True)  # the finished ones, and the stopped
    for key in decisions["abandon"]:
        trial = stopped[key][1]
        # Sunk, and said so: what its journal holds (a call in flight when it was stopped is
        # billed by the provider but not journaled).
        spent = _spent_so_far(store, trial) or ZERO
        abandoned_usd += spent
        gone = Abandoned(
            key=key, run_id=store.run_in_progress(trial), round=state.round, cost_usd=str(spent)
        )
        state.abandoned.append(gone)
        store.run_path(trial).unlink(missing_ok=True)  # never continued
        state.carried.pop(key, None)
    for key in decisions["carry"]:
        domain, g = sample_group[key]
        state.carried.setdefault(key, Carried(state.round, domain, g))
    if tasks:
        await asyncio.gather(*tasks, return_exceptions=True)
    for key in list(state.carried):
        if key in records:
            state.carried.pop(key)
    state.save()
    return RoundSummary(
        round=state.round,
        target_groups=spec.target,
        groups_complete=len(groups_done),
        groups_at_target=at_target,
        groups_launched=groups_launched,
        samples=len(records),
        stop_reason=stop_reason,
        seconds_to_target=round(target_s, 3),
        wall_s=round(time.monotonic() - started_at, 3),
        cost_usd=str(_known_total(records.values())),
        cost_at_target_usd=str(cost_at_target),
        abandoned_cost_usd=str(abandoned_usd),
        stragglers={k: sorted(v) for k, v in decisions.items()},
        carried_in=sorted(carried_keys),
        down_weighted=dict(down_weighted),
        allocation_history=scheduler.history,
        finished=datetime.now(UTC).isoformat(timespec="seconds"),
    )


def _known_total(records: Iterable[Sample]) -> Decimal:
    """What the samples whose cost is known cost together (a Decimal's own text in JSON)."""
    return sum((c for r in records if (c := r.cost.amount) is not None), ZERO)


def _spent_so_far(store: TrialStore, trial: Trial) -> Decimal | None:
    """What the journal says a sample's unfinished run has spent so far (0 if it never
    started; None if unknown)."""
    run_id = store.run_in_progress(trial)
    journal = open_store(stayer_home(), create=False) if run_id else None
    if journal is None:
        return ZERO
    try:
        row = journal.run(run_id) if run_id else None
    finally:
        journal.close()
    if row is None:
        return ZERO
    return Usd.parse(row.cost_usd).amount


async def _stragglers(
    store: TrialStore,
    running: Mapping[str, tuple[asyncio.Task[Sample | None], Trial]],
    records: Mapping[str, Sample],
    spec: RolloutSpec,
    state: RolloutState,
    prices: PriceBook,
    policy: StragglerPolicy,
) -> dict[str, list[str]]:
    """The action for each sample still running, by ``scheduler.straggler_action``, from
    what its journal says: spent so far, the age of its last step, its context size."""
    finished_costs = [c for r in records.values() if (c := r.cost.amount) is not None]
    decisions: dict[str, list[str]] = {"finish": [], "carry": [], "abandon": []}
    if not running:
        return decisions
    journal = open_store(stayer_home(), create=False)
    now = datetime.now(UTC)
    try:
        for key, (_, trial) in running.items():
            spent, age, context = ZERO, math.inf, 0
            row_id = store.run_in_progress(trial)
            if (
                journal is not None
                and row_id is not None
                and (row := journal.run(row_id)) is not None
            ):
                spent = Usd.parse(row.cost_usd).amount or ZERO
                steps = [e for e in journal.events(row_id) if e.kind == "step"]
                if steps:
                    age = (now - datetime.fromisoformat(steps[-1].at)).total_seconds()
                    context = int(steps[-1].data.get("entry", {}).get("context_tokens", 0))
            rates = prices.rates(trial.config.model.split(":", 1)[-1])
            premium = (
                ZERO
                if rates is None
                else (rates.cache_write_5m - rates.cache_read) * context / 1_000_000
            )
            action = policy(
                spent,
                finished_costs,
                cache_warm=age < CACHE_TTL_S,
                cold_premium=premium,
                staleness=state.round - carried.round if (carried := state.carried.get(key)) else 0,
                max_staleness=spec.max_staleness,
            )
            decisions[action].append(key)
    finally:
        if journal is not None:
            journal.close()
    return decisions

"""One scheduler for evaluations and rollouts: which trial runs next, and what to do with
the stragglers once enough have finished.

A job is a group of samples (rollouts) or one trial (an evaluation). Order (``Scheduler.next``): higher ``priority`` first; among equals, the tenant furthest
below its fair share of the dollars spent so far (spent ÷ share, so a tenant whose trials
are dear gets fewer of them, not more); then the domain furthest below its allocation;
then first come, first served.

Allocation across domains (``Scheduler.allocation``): each domain's weight is the share of
its finished jobs that still carry a learning signal (success rate neither 0 nor 1: a
group all of whose samples pass, or all fail, gives GRPO-style training zero advantage),
never below ``min_share``, and 1 while a domain has none finished. Trials of flagged
tasks (``tasks check``: flaky, nop_passes, gameable) count with their ``weight`` (< 1).

Details and rationale: docs/notes.md, ``stayer/scale/scheduler.py``.
"""

from __future__ import annotations

import itertools
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any, Literal

from stayer.money import ZERO
from stayer.scale.records import AllocationSnapshot


@dataclass
class Job:
    """One trial to schedule."""

    key: str
    domain: str = "default"
    tenant: str = "default"
    priority: int = 0
    weight: float = 1.0  # < 1: a task that `tasks check` flagged
    payload: Any = None
    seq: int = field(default=0, compare=False)


def learning_signal(successes: int, samples: int) -> bool:
    """Whether a group's outcomes differ (some samples succeed, some do not)."""
    return 0 < successes < samples


class Scheduler:
    def __init__(
        self, *, tenant_shares: dict[str, float] | None = None, min_share: float = 0.1
    ) -> None:
        if not 0 < min_share <= 1:
            raise ValueError(f"min_share {min_share}: must be in (0, 1]")
        self.tenant_shares = tenant_shares or {}
        self.min_share = min_share
        self._pending: list[Job] = []
        self._seq = itertools.count()
        self.spent: dict[str, Decimal] = defaultdict(lambda: ZERO)  # by tenant
        self.launched: dict[str, float] = defaultdict(float)  # by domain, weighted
        self._signal: dict[str, list[bool]] = defaultdict(list)  # by domain: each finished job's
        self.domains: set[str] = set()
        self.history: list[AllocationSnapshot] = []  # one per finished job

    def add(self, job: Job) -> None:
        job.seq = next(self._seq)
        self._pending.append(job)
        self.domains.add(job.domain)

    def __len__(self) -> int:
        return len(self._pending)

    def allocation(self) -> dict[str, float]:
        """Each domain's share of the next trials (sums to 1)."""
        weights: dict[str, float] = {}
        for d in sorted(self.domains):
            signals = self._signal[d]
            weights[d] = max(self.min_share, sum(signals) / len(signals)) if signals else 1.0
        total = sum(weights.values())
        return {d: w / total for d, w in weights.items()}

    def next(self) -> Job | None:
        """The job to start now (removed from the queue), or None when none is waiting."""
        if not self._pending:
            return None
        share = self.allocation()
        launched_total = sum(self.launched.values()) or 1.0

        def order(job: Job) -> tuple[Any, ...]:
            tenant_load = self.spent[job.tenant] / Decimal(
                str(self.tenant_shares.get(job.tenant, 1.0))
            )
            domain_load = self.launched[job.domain] / launched_total - share.get(job.domain, 0.0)
            return (-job.priority, tenant_load, domain_load, job.seq)

        job = min(self._pending, key=order)
        self._pending.remove(job)
        self.launched[job.domain] += job.weight
        return job

    def finished(self, job: Job, cost: Decimal | None, outcomes: Sequence[bool]) -> None:
        """Account a finished job (a group of samples, or one trial): its tenant's dollars,
        and whether its outcomes carry a learning signal."""
        self.spent[job.tenant] += cost or ZERO
        if outcomes:
            self._signal[job.domain].append(learning_signal(sum(outcomes), len(outcomes)))
            done = sum(len(v) for v in self._signal.values())
            self.history.append(AllocationSnapshot(done, self.allocation()))


StragglerAction = Literal["finish", "carry", "abandon"]


def expected_remaining(spent: Decimal, finished_costs: Sequence[Decimal]) -> Decimal:
    """The expected cost to finish a trial that has spent ``spent``: the mean of what the
    finished trials that got that far went on to spend (a heavy tail makes a long-running
    trial's remainder larger, not smaller); with none that far, ``spent`` again."""
    further = [c - spent for c in finished_costs if c > spent]
    return sum(further, ZERO) / len(further) if further else spent


def straggler_action(
    spent: Decimal,
    finished_costs: Sequence[Decimal],
    *,
    cache_warm: bool,
    cold_premium: Decimal,
    staleness: int = 0,
    max_staleness: int | None = None,
) -> StragglerAction:
    """What to do with a trial still running once the target is reached (module docstring).
    ``cold_premium``: what its context costs to re-write once its cache has expired;
    ``staleness``: rounds since it started (abandoned beyond ``max_staleness``)."""
    if not finished_costs:
        return "carry"
    fresh = sum(finished_costs, ZERO) / len(finished_costs)
    remaining = expected_remaining(spent, finished_costs)
    if cache_warm and remaining <= fresh:
        return "finish"
    if (max_staleness is None or staleness < max_staleness) and remaining + cold_premium <= fresh:
        return "carry"
    return "abandon"

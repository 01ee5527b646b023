"""The eval's records: a trial's record (``OUT/trials/…json``, also a rollout sample's) and
the ``stayer eval --json`` document (``eval.json``), as ``stayer.records`` Records.

Their JSON field names and order are the contract (tests/test_doc_shapes.py keeps them);
amounts stay the decimal strings the run wrote, ``"unknown"`` where unpriced. A field a
record never had is ``UNSET`` and absent from its JSON, so a record read back is written
out with the fields it had. ``as_trials`` reads records handed over as JSON documents.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import msgspec
from msgspec import UNSET, UnsetType

from stayer.money import Usd
from stayer.records import Record, from_json


class ConfigSettings(Record, kw_only=True):
    """A configuration's settings, as its key's hash and its records have them."""

    model: str
    policy: str
    sim_policy: str | None = None
    max_steps: int = 0
    max_cost: str | None = None
    sandbox: str | None = None
    sim_latency: float = 0.0


class EarlierAttempt(Record, kw_only=True):
    """An attempt a trial's record replaced (its money was spent all the same)."""

    run_id: str | None = None
    status: str | None = None
    error_class: str | None = None
    cost_usd: str | None = None
    error: str | None = None
    finished: str | None = None

    @property
    def cost(self) -> Usd:
        return Usd.parse(self.cost_usd)


class TrialRecord(Record, kw_only=True):
    """One finished trial (a rollout sample's record, ``scale.records.Sample``, adds to it)."""

    key: str = ""
    task: str = ""
    task_path: str = ""
    task_digest: str = ""
    model: str = ""
    policy: str = ""
    config_key: str = ""
    config: ConfigSettings | UnsetType = UNSET
    epoch: int = 1
    status: str = "error"
    error_class: str | None = None
    reward: float | None = None
    steps: int = 0
    usage: dict[str, int] = msgspec.field(default_factory=dict)
    tokens: int = 0
    cost_usd: str = "0"
    wall_s: float = 0.0
    run_id: str | None = None
    run_dir: str | UnsetType = UNSET
    resumed: bool | UnsetType = UNSET
    stop_reason: str | None | UnsetType = UNSET
    verifier_outcome: str | None | UnsetType = UNSET
    error: str | None = None
    traceback: str | UnsetType = UNSET
    finished: str = ""
    earlier_attempts: list[EarlierAttempt] | UnsetType = UNSET

    @property
    def cost(self) -> Usd:
        return Usd.parse(self.cost_usd)

    def attempt(self) -> EarlierAttempt:
        return EarlierAttempt(
            run_id=self.run_id,
            status=self.status,
            error_class=self.error_class,
            cost_usd=self.cost_usd,
            error=self.error,
            finished=self.finished,
        )

    def attempts(self) -> list[EarlierAttempt | TrialRecord]:
        """This record and the attempts it replaced: what its trial cost in all."""
        earlier = self.earlier_attempts if isinstance(self.earlier_attempts, list) else []
        return [self, *earlier]


def as_trials(records: Iterable[TrialRecord | dict[str, Any]]) -> list[TrialRecord]:
    """Records handed over as records or as their JSON documents."""
    return [r if isinstance(r, TrialRecord) else from_json(r, TrialRecord) for r in records]


# --- the ``stayer eval --json`` document ----------------------------------------------------


class ConfigSummary(Record, kw_only=True):
    id: str
    label: str
    model: str
    policy: str
    settings: ConfigSettings
    trials: int
    successes: int
    success_rate: float | None
    ci_low: float | None
    ci_high: float | None
    pass_at_k: dict[str, float | None]
    pass_hat_k: dict[str, float | None]
    mean_tokens: float | None
    median_tokens: int | float | None
    mean_cost_usd: str | None
    median_cost_usd: str | None
    total_cost_usd: str | None
    cost_per_success_usd: str | None
    mean_steps: float | None
    mean_wall_s: float | None
    infra_errors: int
    error_classes: dict[str, int]
    tasks: int


class ConfigRef(Record, kw_only=True):
    id: str
    label: str
    model: str
    policy: str


class Bootstrap(Record, kw_only=True):
    diff: float
    ci_low: float
    ci_high: float
    p_value: float


class Comparison(Record, kw_only=True):
    a: ConfigRef
    b: ConfigRef
    pairs: int
    tasks: int
    a_only: int
    b_only: int
    success_diff: float | None  # B − A, in success rate
    test: str
    p_value: float
    significant: bool
    verdict: str
    mcnemar_p: float
    bootstrap: Bootstrap | None
    cost_diff_usd: str | None
    cost_diff_ci_usd: list[str | None] | None


class ParetoPoint(Record, kw_only=True):
    id: str
    label: str
    model: str
    policy: str
    mean_cost_usd: str | None
    success_rate: float | None
    cost_per_success_usd: str | None


class Cell(Record, kw_only=True):
    successes: int = 0
    trials: int = 0
    infra_errors: int = 0


class TaskResults(Record, kw_only=True):
    task: str
    results: dict[str, Cell]


class InfraTrial(Record, kw_only=True):
    task: str
    config_key: str
    epoch: int
    run_id: str | None
    reason: str


class Problem(Record):
    """What is wrong with a task (``stayer tasks check``, an evaluation's preflight)."""

    kind: str
    detail: str


class PreflightFinding(Record, kw_only=True):
    task: str
    problems: list[Problem]


class EvalSummary(Record, kw_only=True):
    configs: list[ConfigSummary]
    comparisons: list[Comparison]
    pareto: list[ParetoPoint]
    tasks: list[TaskResults]
    infra_trials: list[InfraTrial]  # what could not be judged, and why


class EvalFlags(Record, kw_only=True):
    """The flags an evaluation ran with, as the command line gave them."""

    models: str
    policies: str
    epochs: int
    concurrency: int
    max_steps: int
    max_cost: str | None
    sandbox: str | None
    sim_policy: str | None
    ray: str | None


class EvalDocument(Record, kw_only=True):
    """``stayer eval --json`` and ``eval.json`` (``report``: only on stdout)."""

    suite: str
    epochs: int
    trials_total: int
    trials_reused: int
    preflight: list[PreflightFinding]
    stayer_version: str
    settings: EvalFlags
    finished: str
    wall_s: float
    configs: list[ConfigSummary]
    comparisons: list[Comparison]
    pareto: list[ParetoPoint]
    tasks: list[TaskResults]
    infra_trials: list[InfraTrial]
    out: str | UnsetType = UNSET
    report: str | UnsetType = UNSET

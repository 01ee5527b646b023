"""The rollouts' records: a sample (a trial's record with every step a trainer needs), a
round's summary and the state kept between rounds, as ``stayer.records`` Records.

Their JSON field names and order are the contract (tests/test_doc_shapes.py keeps them);
amounts stay decimal strings, ``"unknown"`` where unpriced. ``as_samples`` reads samples
handed over as JSON documents.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import msgspec
from msgspec import UNSET, UnsetType

from stayer.eval.records import TrialRecord
from stayer.journal.codec import MessageCall, MessageRecord
from stayer.records import Record, from_json
from stayer.usage import Usage


class TraceMessage(MessageRecord, kw_only=True):
    """A message as the journal writes it; ``copied``: context a compaction kept."""

    copied: bool | UnsetType = UNSET

    @property
    def calls(self) -> list[MessageCall]:
        return self.tool_calls if isinstance(self.tool_calls, list) else []


class ToolDefinition(Record):
    name: str
    description: str
    parameters: dict[str, Any]


class TraceStep(Record, kw_only=True):
    """One main-agent step (``scale.recorder``); the first also has the prompt's prefix
    (``system``, ``tools``)."""

    system: str | UnsetType = UNSET
    tools: list[ToolDefinition] | UnsetType = UNSET
    step: int
    model: str
    context_reset: bool
    messages: list[TraceMessage]  # the prompt's messages that were not in the previous one
    reply: TraceMessage
    stop_reason: str | None
    prompt_ids: list[int] | None
    completion_ids: list[int] | None
    usage: Usage
    cost_usd: str
    cost_parts: dict[str, str] | None
    auxiliary_calls: int


class Sample(TrialRecord, kw_only=True):
    """A rollout sample: a trial's record with its steps (``trace``; ``trace_complete``
    False when steps were replayed from a journal, unseen) and its place in the job."""

    trace: list[TraceStep] | UnsetType = UNSET
    trace_complete: bool | UnsetType = UNSET
    domain: str | UnsetType = UNSET
    group: str | UnsetType = UNSET
    weight: float | UnsetType = UNSET
    round: int | UnsetType = UNSET

    @property
    def steps_traced(self) -> list[TraceStep]:
        return self.trace if isinstance(self.trace, list) else []

    @property
    def group_name(self) -> str:
        return self.group if isinstance(self.group, str) else ""

    @property
    def domain_name(self) -> str:
        return self.domain if isinstance(self.domain, str) else ""


def as_samples(records: Iterable[Sample | dict[str, Any]]) -> list[Sample]:
    """Samples handed over as records or as their JSON documents."""
    return [r if isinstance(r, Sample) else from_json(r, Sample) for r in records]


class AllocationSnapshot(Record):
    """The scheduler's share per domain once ``finished`` jobs had finished."""

    finished: int
    allocation: dict[str, float]


class ExportSummary(Record, kw_only=True):
    """What ``exports.export`` wrote (``sequences``: token formats only) and skipped."""

    format: str
    path: str
    samples: int
    sequences: int | UnsetType = UNSET
    skipped: list[str]


class RoundSummary(Record, kw_only=True):
    """One round of ``stayer rollouts`` (``--json``; ``rounds/round-N.json`` without
    ``export``)."""

    round: int
    target_groups: int
    groups_complete: int
    groups_at_target: int  # complete when the target was reached (or the job stopped)
    groups_launched: int
    samples: int
    stop_reason: str
    seconds_to_target: float
    wall_s: float
    cost_usd: str
    cost_at_target_usd: str
    abandoned_cost_usd: str
    stragglers: dict[str, list[str]]
    carried_in: list[str]
    down_weighted: dict[str, str]
    allocation_history: list[AllocationSnapshot]
    finished: str
    excluded: dict[str, str] | UnsetType = UNSET
    export: ExportSummary | UnsetType = UNSET


class Carried(Record):
    round: int
    domain: str
    g: int


class Abandoned(Record, kw_only=True):
    key: str
    run_id: str | None
    round: int
    cost_usd: str


class RolloutStateDoc(Record, kw_only=True):
    """``rollouts-state.json``: the last round, the samples carried over, those abandoned."""

    round: int = 0
    carried: dict[str, Carried] = msgspec.field(default_factory=dict)
    abandoned: list[Abandoned] = msgspec.field(default_factory=list)


class DomainStats(Record, kw_only=True):
    """``stayer rollouts stats``: one domain's samples."""

    domain: str
    samples: int
    groups: int
    groups_with_signal: int
    success_rate: float
    reward_mean: float
    reward_sd: float
    reward_min: float
    reward_max: float
    cost_per_sample_usd: str | None


class RoundStats(Record, kw_only=True):
    """``stayer rollouts stats``: a round, as its ``rounds/round-N.json`` has it."""

    round: int | None = None
    groups_complete: int | None = None
    samples: int | None = None
    cost_usd: str | None = None
    abandoned_cost_usd: str | None = None
    allocation_history: list[AllocationSnapshot] | None = None


class RolloutStats(Record, kw_only=True):
    """``stayer rollouts stats DIR --json``."""

    out: str
    samples: int
    domains: list[DomainStats]
    rounds: list[RoundStats]

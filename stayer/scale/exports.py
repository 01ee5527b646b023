"""Rollout records (``scale.rollouts``) in the shapes trainers read.

* ``jsonl`` — one sample per line, stayer's own shape (every field below, plus the steps).
* ``atif`` — one ATIF v1.7 trajectory per sample (Harbor RFC 0001), ``atif/<sample>.json``.
* ``verl`` — veRL ``AgentLoopOutput`` fields, one per line (``verl.jsonl``).
* ``skyrl`` — one SkyRL ``GeneratorOutput`` (``skyrl.json``): parallel lists.
* ``verifiers`` — verifiers' processed outputs (``verifiers.json``): parallel lists.

Details and rationale: docs/notes.md, ``stayer/scale/exports.py``.
"""

from __future__ import annotations

import json
import statistics
from collections import defaultdict
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import msgspec
from msgspec import UNSET, UnsetType

from stayer._version import __version__
from stayer.eval.runner import write_atomic
from stayer.records import Record, from_json, to_json
from stayer.scale.records import ExportSummary, Sample, TraceStep, as_samples
from stayer.usage import Usage

FORMATS = ("jsonl", "atif", "verl", "skyrl", "verifiers")
ATIF_VERSION = "ATIF-v1.7"


def raw_reward(record: Sample) -> float:
    r = record.reward
    return float(r) if isinstance(r, int | float) else 0.0


def normalised_rewards(records: Sequence[Sample | dict[str, Any]]) -> dict[str, float]:
    """Sample key → its reward's z-score within its group (module docstring)."""
    groups: dict[str, list[Sample]] = defaultdict(list)
    for r in as_samples(records):
        groups[r.group_name].append(r)
    out: dict[str, float] = {}
    for members in groups.values():
        rewards = [raw_reward(r) for r in members]
        mean = statistics.fmean(rewards)
        sd = statistics.pstdev(rewards)
        for r, x in zip(members, rewards, strict=True):
            out[r.key] = 0.0 if sd == 0 else (x - mean) / sd
    return out


class Segment(Record, kw_only=True):
    """One token sequence of a sample: a prompt and the response after it, steps whose
    prompts extend it included (their tool output masked 0)."""

    prompt_ids: list[int]
    response_ids: list[int] = msgspec.field(default_factory=list)
    response_mask: list[int] = msgspec.field(default_factory=list)
    steps: list[int] = msgspec.field(default_factory=list)
    stop_reason: str = ""


def segments(trace: Sequence[TraceStep | dict[str, Any]]) -> list[Segment] | None:
    """The sample's token sequences (module docstring), or None without token ids."""
    steps = [s if isinstance(s, TraceStep) else from_json(s, TraceStep) for s in trace]
    if not steps or any(s.prompt_ids is None for s in steps):
        return None
    out: list[Segment] = []
    current: Segment | None = None
    seen: list[int] = []  # the current segment's prompt and response so far
    for step in steps:
        prompt, completion = step.prompt_ids or [], step.completion_ids or []
        if current is not None and prompt[: len(seen)] == seen:
            added = prompt[len(seen) :]
            current.response_ids += added
            current.response_mask += [0] * len(added)
        else:
            current = Segment(prompt_ids=list(prompt))
            out.append(current)
        current.response_ids += completion
        current.response_mask += [1] * len(completion)
        current.steps.append(step.step)
        current.stop_reason = step.stop_reason or ""
        seen = current.prompt_ids + current.response_ids
    return out


class SampleRow(Record, kw_only=True):
    """The ``jsonl`` shape of one sample."""

    sample_id: str
    domain: str | None
    task: str
    group: str | None
    epoch: int
    round: int | None
    run_id: str | None
    model: str
    status: str
    reward: float | None
    reward_normalised: float
    weight: float
    cost_usd: str
    trace_complete: bool
    steps: list[TraceStep]


def _set(value: Any) -> Any:
    return None if value is UNSET else value


def sample_doc(record: Sample, normalised: float) -> SampleRow:
    """The ``jsonl`` shape of one sample."""
    return SampleRow(
        sample_id=record.key,
        domain=_set(record.domain),
        task=record.task,
        group=_set(record.group),
        epoch=record.epoch,
        round=_set(record.round),
        run_id=record.run_id,
        model=record.model,
        status=record.status,
        reward=record.reward,
        reward_normalised=normalised,
        weight=1.0 if record.weight is UNSET else record.weight,
        cost_usd=record.cost_usd,
        trace_complete=record.trace_complete is True,
        steps=record.steps_traced,
    )


def _arguments(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return {"raw": text}  # arguments the model wrote that are not JSON, kept as written


# --- ATIF v1.7 --------------------------------------------------------------------------------


class AtifToolCall(Record):
    tool_call_id: str
    function_name: str
    arguments: Any


class AtifResult(Record):
    source_call_id: str | None
    content: str


class AtifObservation(Record):
    results: list[AtifResult]


class AtifStepExtra(Record):
    stayer_step: int
    stop_reason: str | None


class AtifMessageExtra(Record, kw_only=True):
    """A system step's message: a compaction's summary, or a tool's result shown as one."""

    context_management: str | UnsetType = UNSET  # "summary": a compaction wrote it
    role: str
    tool_call_id: str | None | UnsetType = UNSET


class AtifCostExtra(Record):
    cost_usd_exact: str
    cost_parts_usd: dict[str, str] | None
    usage: Usage


class AtifMetrics(Record, kw_only=True):
    prompt_tokens: int  # includes cached
    completion_tokens: int
    cached_tokens: int
    cost_usd: float | None
    prompt_token_ids: list[int] | None
    completion_token_ids: list[int] | None
    logprobs: None = None
    extra: AtifCostExtra


class AtifStep(Record, kw_only=True):
    step_id: int
    source: str
    message: str
    model_name: str | UnsetType = UNSET
    tool_calls: list[AtifToolCall] | UnsetType = UNSET
    metrics: AtifMetrics | UnsetType = UNSET
    extra: AtifStepExtra | AtifMessageExtra | UnsetType = UNSET
    is_copied_context: bool | UnsetType = UNSET
    observation: AtifObservation | UnsetType = UNSET


class AtifTool(Record):
    type: str
    function: Any


class AtifAgent(Record, kw_only=True):
    name: str
    version: str
    model_name: str
    tool_definitions: list[AtifTool]


class AtifFinalExtra(Record, kw_only=True):
    reward: float | None
    reward_normalised: float
    cost_usd_exact: str


class AtifFinalMetrics(Record, kw_only=True):
    total_prompt_tokens: int
    total_completion_tokens: int
    total_cached_tokens: int
    total_cost_usd: float | None
    total_steps: int
    extra: AtifFinalExtra


class Trajectory(Record, kw_only=True):
    """One sample as an ATIF v1.7 trajectory."""

    schema_version: str
    session_id: str
    trajectory_id: str
    agent: AtifAgent
    steps: list[AtifStep]
    final_metrics: AtifFinalMetrics
    subagent_trajectories: list[Any]


def _float(amount: str) -> float | None:
    return None if amount in ("", "unknown") else float(amount)


def atif(record: Sample, normalised: float) -> Trajectory:
    """One sample as an ATIF v1.7 trajectory."""
    trace = record.steps_traced
    head = trace[0] if trace else None
    steps: list[AtifStep] = []

    def add(source: str, message: str, **extra: Any) -> AtifStep:
        step = AtifStep(step_id=len(steps) + 1, source=source, message=message, **extra)
        steps.append(step)
        return step

    if head is not None and isinstance(head.system, str) and head.system:
        add("system", head.system)
    last_agent: AtifStep | None = None
    for s in trace:
        for m in s.messages:
            copied = {"is_copied_context": True} if m.copied is True else {}
            if m.kind == "summary":  # a compaction wrote it (ATIF: context management)
                add(
                    "system",
                    m.content,
                    extra=AtifMessageExtra(context_management="summary", role=m.role),
                    **copied,
                )
            elif m.role == "tool":
                call_id = m.tool_call_id if isinstance(m.tool_call_id, str) else None
                if last_agent is not None and m.copied is not True:
                    if not isinstance(last_agent.observation, AtifObservation):
                        last_agent.observation = AtifObservation([])
                    last_agent.observation.results.append(AtifResult(call_id, m.content))
                else:
                    add(
                        "system",
                        m.content,
                        extra=AtifMessageExtra(role="tool", tool_call_id=call_id),
                        **copied,
                    )
            elif m.role == "assistant":
                add("agent", m.content, **copied)
            else:
                add("user", m.content, **copied)
        metrics = AtifMetrics(
            prompt_tokens=s.usage.input_tokens,
            completion_tokens=s.usage.output_tokens,
            cached_tokens=s.usage.cache_read_tokens,
            cost_usd=_float(s.cost_usd),
            prompt_token_ids=s.prompt_ids,
            completion_token_ids=s.completion_ids,
            extra=AtifCostExtra(s.cost_usd, s.cost_parts, s.usage),
        )
        last_agent = add(
            "agent",
            s.reply.content,
            model_name=s.model,
            tool_calls=[AtifToolCall(c.id, c.name, _arguments(c.arguments)) for c in s.reply.calls],
            metrics=metrics,
            extra=AtifStepExtra(s.step, s.stop_reason),
        )
    tools = head.tools if head is not None and isinstance(head.tools, list) else []
    return Trajectory(
        schema_version=ATIF_VERSION,
        session_id=record.run_id or record.key,
        trajectory_id=record.key,
        agent=AtifAgent(
            name="stayer",
            version=__version__,
            model_name=record.model,
            tool_definitions=[AtifTool("function", t) for t in tools],
        ),
        steps=steps,
        final_metrics=AtifFinalMetrics(
            total_prompt_tokens=sum(s.usage.input_tokens for s in trace),
            total_completion_tokens=sum(s.usage.output_tokens for s in trace),
            total_cached_tokens=sum(s.usage.cache_read_tokens for s in trace),
            total_cost_usd=_float(record.cost_usd),
            total_steps=len(steps),
            extra=AtifFinalExtra(
                reward=record.reward, reward_normalised=normalised, cost_usd_exact=record.cost_usd
            ),
        ),
        subagent_trajectories=[],
    )


# --- token formats ----------------------------------------------------------------------------


class VerlExtra(Record, kw_only=True):
    sample_id: str
    segment: int
    domain: str | None
    group: str | None
    reward_raw: float | None
    cost_usd: str
    steps: list[int]


class VerlRow(Record, kw_only=True):
    """veRL ``AgentLoopOutput`` fields of one sequence."""

    prompt_ids: list[int]
    response_ids: list[int]
    response_mask: list[int]
    response_logprobs: None = None
    reward_score: float
    num_turns: int
    extra_fields: VerlExtra


class TrajectoryId(Record):
    instance_id: str | None
    repetition_id: int


class SkyrlMetrics(Record):
    cost_usd: list[str]
    reward_raw: list[float | None]


class SkyrlBatch(Record, kw_only=True):
    """SkyRL ``GeneratorOutput``: parallel lists."""

    prompt_token_ids: list[list[int]]
    response_ids: list[list[int]]
    rewards: list[float]
    loss_masks: list[list[int]]
    stop_reasons: list[str]
    rollout_logprobs: None = None
    trajectory_ids: list[TrajectoryId]
    rollout_metrics: SkyrlMetrics


class VerifiersBatch(Record, kw_only=True):
    """verifiers' processed outputs: parallel lists."""

    prompt_ids: list[list[int]]
    prompt_mask: list[list[int]]
    completion_ids: list[list[int]]
    completion_mask: list[list[int]]
    completion_logprobs: list[list[float]]
    rewards: list[float]


def export(records: Iterable[Sample | dict[str, Any]], out: Path, fmt: str) -> ExportSummary:
    """Write ``records`` (or their JSON documents) in format ``fmt`` under ``out``; what
    was written and skipped."""
    if fmt not in FORMATS:
        raise ValueError(f"--format {fmt}: expected one of {', '.join(FORMATS)}")
    samples = sorted(as_samples(records), key=lambda r: r.key)
    norm = normalised_rewards(samples)
    if fmt == "jsonl":
        path = out / "rollouts.jsonl"
        write_atomic(
            path,
            "".join(json.dumps(to_json(sample_doc(r, norm[r.key]))) + "\n" for r in samples),
        )
        return ExportSummary(format=fmt, path=str(path), samples=len(samples), skipped=[])
    if fmt == "atif":
        for r in samples:
            write_atomic(
                out / "atif" / f"{_file_name(r.key)}.json",
                json.dumps(to_json(atif(r, norm[r.key])), indent=1),
            )
        return ExportSummary(format=fmt, path=str(out / "atif"), samples=len(samples), skipped=[])
    rows: list[tuple[Sample, int, Segment]] = []
    skipped: list[str] = []
    for r in samples:
        segs = segments(r.steps_traced) if r.trace_complete is True else None
        if segs is None:
            skipped.append(r.key)
            continue
        for i, seg in enumerate(segs):
            rows.append((r, i, seg))
    path = out / {"verl": "verl.jsonl", "skyrl": "skyrl.json", "verifiers": "verifiers.json"}[fmt]
    if fmt == "verl":
        text = "".join(
            json.dumps(to_json(_verl(r, i, seg, norm[r.key]))) + "\n" for r, i, seg in rows
        )
    elif fmt == "skyrl":
        text = json.dumps(to_json(_skyrl(rows, norm)))
    else:
        text = json.dumps(to_json(_verifiers(rows, norm)))
    write_atomic(path, text)
    return ExportSummary(
        format=fmt,
        path=str(path),
        samples=len(samples) - len(skipped),
        sequences=len(rows),
        skipped=skipped,
    )


def _file_name(key: str) -> str:
    return key.replace("/", "__")


def _verl(r: Sample, i: int, seg: Segment, normalised: float) -> VerlRow:
    return VerlRow(
        prompt_ids=seg.prompt_ids,
        response_ids=seg.response_ids,
        response_mask=seg.response_mask,
        reward_score=normalised,
        num_turns=len(seg.steps),
        extra_fields=VerlExtra(
            sample_id=r.key,
            segment=i,
            domain=_set(r.domain),
            group=_set(r.group),
            reward_raw=r.reward,
            cost_usd=r.cost_usd,
            steps=seg.steps,
        ),
    )


def _skyrl(rows: Sequence[tuple[Sample, int, Segment]], norm: dict[str, float]) -> SkyrlBatch:
    return SkyrlBatch(
        prompt_token_ids=[seg.prompt_ids for _, _, seg in rows],
        response_ids=[seg.response_ids for _, _, seg in rows],
        rewards=[norm[r.key] for r, _, _ in rows],
        loss_masks=[seg.response_mask for _, _, seg in rows],
        stop_reasons=[seg.stop_reason for _, _, seg in rows],
        trajectory_ids=[TrajectoryId(_set(r.group), r.epoch) for r, _, _ in rows],
        rollout_metrics=SkyrlMetrics(
            cost_usd=[r.cost_usd for r, _, _ in rows],
            reward_raw=[r.reward for r, _, _ in rows],
        ),
    )


def _verifiers(
    rows: Sequence[tuple[Sample, int, Segment]], norm: dict[str, float]
) -> VerifiersBatch:
    return VerifiersBatch(
        prompt_ids=[seg.prompt_ids for _, _, seg in rows],
        prompt_mask=[[0] * len(seg.prompt_ids) for _, _, seg in rows],
        completion_ids=[seg.response_ids for _, _, seg in rows],
        completion_mask=[seg.response_mask for _, _, seg in rows],
        completion_logprobs=[[0.0] * len(seg.response_ids) for _, _, seg in rows],
        rewards=[norm[r.key] for r, _, _ in rows],
    )

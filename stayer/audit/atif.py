"""Agent Trajectory Interchange Format (ATIF, Harbor's ``agent/trajectory.json``).

One JSON document: ``schema_version`` (``ATIF-v1.x``), ``session_id``, ``agent``
(``name``, ``model_name``), ``steps`` and ``final_metrics``. An agent step's ``metrics``
hold ``prompt_tokens`` (cache reads included), ``cached_tokens`` (reads),
``completion_tokens``, optionally ``cost_usd``, and in ``extra`` Anthropic's
``cache_creation_input_tokens`` (with its 5 m / 1 h split in ``cache_creation``).

Harbor writes one step per content block of a response, each with the response's whole
usage, so consecutive steps of a chain (the agent's own, or ``extra.is_sidechain``) with
the same model and metrics are one call, counted once. ``final_metrics`` adds up every
step, repeats included: the audit is checked against it and says by how much the repeats
account for the difference. Harbor's ``claude-code`` agent leaves cache writes out of
``prompt_tokens`` (prompt = uncached + reads); they are added back, as they are wherever
prompt tokens are fewer than reads plus writes.
"""

from __future__ import annotations

import re
from decimal import Decimal
from typing import Any

import msgspec

from stayer.audit.calls import (
    MAIN_CHAIN,
    Call,
    DocumentImporter,
    ImportedSession,
    LogFile,
    file_time,
    parse_ts,
)
from stayer.audit.codex import UNKNOWN_MODEL
from stayer.usage import Usage

SIDECHAIN = "sidechain"
_SESSION_ID = re.compile(rb'"session_id"\s*:\s*"([^"\\]{1,200})"')


class _CacheCreation(msgspec.Struct):
    ephemeral_5m_input_tokens: int | None = None
    ephemeral_1h_input_tokens: int | None = None


class _MetricsExtra(msgspec.Struct):
    cache_creation_input_tokens: int | None = None
    cache_creation: _CacheCreation | None = None


class _Metrics(msgspec.Struct):
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    cached_tokens: int | None = None
    cost_usd: float | None = None
    extra: _MetricsExtra | None = None


class _StepExtra(msgspec.Struct):
    is_sidechain: bool | None = None


class _Step(msgspec.Struct):
    timestamp: str | None = None
    model_name: str | None = None
    metrics: _Metrics | None = None
    extra: _StepExtra | None = None


class _Agent(msgspec.Struct):
    name: str | None = None
    model_name: str | None = None


class _FinalExtra(msgspec.Struct):
    total_cache_creation_input_tokens: int | None = None


class _FinalMetrics(msgspec.Struct):
    total_prompt_tokens: int | None = None
    total_completion_tokens: int | None = None
    total_cached_tokens: int | None = None
    total_cost_usd: float | None = None
    extra: _FinalExtra | None = None


class _Trajectory(msgspec.Struct):
    schema_version: str
    steps: list[_Step]
    session_id: str | None = None
    agent: _Agent | None = None
    final_metrics: _FinalMetrics | None = None


_DECODER = msgspec.json.Decoder(_Trajectory)


def _written(m: _Metrics) -> tuple[int, int]:
    """Cache writes of a step: (5 minutes, 1 hour)."""
    extra = m.extra
    if extra is None:
        return 0, 0
    total = extra.cache_creation_input_tokens or 0
    split = extra.cache_creation
    w1h = (split.ephemeral_1h_input_tokens or 0) if split is not None else 0
    return total - w1h, w1h


class AtifImporter(DocumentImporter):
    """Reads ATIF ``trajectory.json`` documents (see module docstring)."""

    source = "atif"
    decoder = _DECODER

    def sniff(self, name: str, head: bytes) -> bool:
        return name.endswith(".json") and b'"ATIF-' in head and b'"schema_version"' in head

    def _name(self, f: LogFile) -> tuple[str, str]:
        m = _SESSION_ID.search(f.head)
        return (m.group(1).decode("utf-8", "replace") if m else f.name.removesuffix(".json")), ""

    @staticmethod
    def _session(doc: _Trajectory, path: str, out: ImportedSession) -> None:
        if doc.session_id:
            out.id = doc.session_id
        agent = doc.agent or _Agent()
        writes_apart = agent.name == "claude-code"
        previous: dict[str, tuple[Any, ...]] = {}
        stepped = [0, 0, 0, 0]  # prompt, cached, completion, writes over every step
        repeats = 0
        left_out = 0  # cache writes left out of prompt_tokens, over the calls
        cost = Decimal(0)
        costed = True
        fallback = file_time(path)
        for step in doc.steps:
            m = step.metrics
            if m is None:
                continue
            prompt, cached, output = (
                m.prompt_tokens or 0,
                m.cached_tokens or 0,
                m.completion_tokens or 0,
            )
            w5m, w1h = _written(m)
            stepped[0] += prompt
            stepped[1] += cached
            stepped[2] += output
            stepped[3] += w5m + w1h
            chain = SIDECHAIN if step.extra is not None and step.extra.is_sidechain else MAIN_CHAIN
            model = step.model_name or agent.model_name or UNKNOWN_MODEL
            key = (model, prompt, cached, output, w5m, w1h, m.cost_usd)
            if previous.get(chain) == key:
                repeats += 1
                continue
            previous[chain] = key
            if min(prompt, cached, output, w5m, w1h) < 0:
                out.skipped_lines += 1
                continue
            if writes_apart or prompt < cached + w5m + w1h:
                prompt += w5m + w1h
                left_out += w5m + w1h
            if m.cost_usd is None:
                costed = False
            else:
                cost += Decimal(repr(m.cost_usd))
            ts = parse_ts(step.timestamp)
            out.calls.append(
                Call(
                    ts=fallback if ts is None else ts,
                    model=model,
                    usage=Usage(
                        input_tokens=prompt,
                        cache_read_tokens=cached,
                        cache_write_5m_tokens=w5m,
                        cache_write_1h_tokens=w1h,
                        output_tokens=output,
                    ),
                    chain=chain,
                    approximate_ts=ts is None,
                )
            )
        final = doc.final_metrics
        if final is None:
            return
        summed = (
            f"final_metrics adds up the metrics of every step, and {repeats} steps repeat the "
            "usage of the response before them (one step per content block)"
        )
        base = "final_metrics."
        fx = final.extra
        for what, field, value, over_steps in (
            ("input_tokens", "total_prompt_tokens", final.total_prompt_tokens, stepped[0]),
            ("cache_read_tokens", "total_cached_tokens", final.total_cached_tokens, stepped[1]),
            ("output_tokens", "total_completion_tokens", final.total_completion_tokens, stepped[2]),
            (
                "cache_write_tokens",
                "extra.total_cache_creation_input_tokens",
                fx.total_cache_creation_input_tokens if fx is not None else None,
                stepped[3],
            ),
        ):
            reasons = [summed] if repeats and value == over_steps else []
            if what == "input_tokens" and left_out:
                reasons.append(
                    f"its prompt tokens leave out cache writes ({left_out:,} over the calls)"
                )
            out.check(what, base + field, value, "; ".join(reasons))
        why = ""
        if costed and out.calls and repeats:
            why = f"{summed}; the calls' own cost_usd sum to {cost}"
        out.check_cost(base + "total_cost_usd", final.total_cost_usd, why)

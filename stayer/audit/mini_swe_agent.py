"""mini-swe-agent (and live-swe-agent) trajectories: ``<instance>.traj.json``.

One JSON document: ``messages`` (the conversation) and ``info.model_stats``
(``instance_cost``, ``api_calls``). Each assistant message keeps the LiteLLM response it
came from in ``extra.response`` (``id``, ``model``, ``usage``: see
``stayer.audit.litellm_usage``) with its cost (``extra.cost``) and time
(``extra.timestamp``); a call is one response, counted once by its id.

A reply the agent rejects (no single bash block: ``FormatError``) is not kept: the log
has a user message with ``extra.interrupt_type`` instead, and no usage. ``api_calls``
counts those calls too, so the audit counts fewer calls than ``api_calls``; the report
says how many and why. Files without usage per message (format 1.0) have no calls here.
"""

from __future__ import annotations

from collections import Counter
from decimal import Decimal

import msgspec

from stayer.audit.calls import (
    Call,
    DocumentImporter,
    ImportedSession,
    LogFile,
    file_time,
    same_cost,
)
from stayer.audit.codex import UNKNOWN_MODEL
from stayer.audit.litellm_usage import LiteLLMResponse, Responses


class _Extra(msgspec.Struct):
    response: LiteLLMResponse | None = None
    cost: float | None = None
    timestamp: float | None = None
    interrupt_type: str | None = None


class _Message(msgspec.Struct):
    role: str = ""
    extra: _Extra | None = None


class _ModelStats(msgspec.Struct):
    instance_cost: float | None = None
    api_calls: int | None = None


class _ModelConfig(msgspec.Struct):
    model_name: str | None = None


class _Config(msgspec.Struct):
    model: _ModelConfig | None = None


class _Info(msgspec.Struct):
    model_stats: _ModelStats | None = None
    config: _Config | None = None


class _Traj(msgspec.Struct):
    messages: list[_Message]
    info: _Info | None = None
    instance_id: str | None = None


_DECODER = msgspec.json.Decoder(_Traj)


class MiniSweAgentImporter(DocumentImporter):
    """Reads mini-swe-agent ``.traj.json`` files (see module docstring)."""

    source = "mini-swe-agent"
    decoder = _DECODER

    def sniff(self, name: str, head: bytes) -> bool:
        return (
            name.endswith(".traj.json")
            and (b'"messages"' in head or b'"info"' in head)
            or (name.endswith(".json") and b'"mini-swe-agent' in head)
        )

    def _name(self, f: LogFile) -> tuple[str, str]:
        return f.name.removesuffix(".json").removesuffix(".traj"), ""

    @staticmethod
    def _session(doc: _Traj, path: str, out: ImportedSession) -> None:
        if doc.instance_id:
            out.id = out.project = doc.instance_id
        info = doc.info or _Info()
        configured = info.config.model.model_name if info.config and info.config.model else None
        responses = Responses(out)
        rejected: Counter[str] = Counter()
        kept_cost = Decimal(0)
        costs_known = True
        fallback_ts = file_time(path)
        for m in doc.messages:
            extra = m.extra
            if extra is None:
                continue
            if m.role == "user" and extra.interrupt_type:
                rejected[extra.interrupt_type] += 1
            response = extra.response
            usage = responses.usage(response) if m.role == "assistant" else None
            if usage is None:
                continue
            assert response is not None
            if extra.cost is None:
                costs_known = False
            else:
                kept_cost += Decimal(repr(extra.cost))
            ts = extra.timestamp or response.created
            out.calls.append(
                Call(
                    ts=float(ts) if ts else fallback_ts,
                    model=response.model or configured or UNKNOWN_MODEL,
                    usage=usage,
                    service_tier=response.service_tier,
                    approximate_ts=not ts,
                )
            )
        stats = info.model_stats
        if stats is None:
            return
        base = "info.model_stats."
        if stats.api_calls is not None:
            why = ""
            missing = stats.api_calls - len(out.calls)
            if missing > 0 and sum(rejected.values()) == missing:
                kinds = ", ".join(f"{n} {k}" for k, n in sorted(rejected.items()))
                why = (
                    f"{missing} calls whose reply the agent rejected ({kinds}) left no usage "
                    "in the log (the replies are not kept)"
                )
            out.check("calls", base + "api_calls", stats.api_calls, why)
        logged = stats.instance_cost
        why = ""
        if (
            logged is not None
            and costs_known
            and out.calls
            and not same_cost(kept_cost, Decimal(repr(float(logged))))
        ):
            why = f"the logged costs of the kept calls sum to {kept_cost}"
        out.check_cost(base + "instance_cost", logged, why)

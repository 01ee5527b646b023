"""OpenHands event streams: a saved trajectory, one JSON list of events (``id``,
``timestamp``, ``source``, ``action`` or ``observation``, …).

An event the agent made from a model response carries it in
``tool_call_metadata.model_response`` (``id``, ``created``, ``model``, LiteLLM ``usage``:
see ``stayer.audit.litellm_usage``); every action made from one response carries the same
response (and its observation again), so a call is one response id, counted once. Its
time is the response's ``created`` (event timestamps have no time zone).

Newer OpenHands adds ``llm_metrics`` to events: the last one's ``accumulated_cost`` and
``accumulated_token_usage`` are the log's own totals, and the audit is checked against
them. Logs without it (such as OpenHands' own test trajectories) record no totals: the
responses' usage is the whole record.
"""

from __future__ import annotations

import os

import msgspec

from stayer.audit.calls import (
    Call,
    DocumentImporter,
    ImportedSession,
    LogFile,
    file_time,
    parse_ts,
)
from stayer.audit.codex import UNKNOWN_MODEL
from stayer.audit.litellm_usage import LiteLLMResponse, Responses


class _ToolCallMetadata(msgspec.Struct):
    model_response: LiteLLMResponse | None = None


class _TokenUsage(msgspec.Struct):
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    cache_read_tokens: int | None = None
    cache_write_tokens: int | None = None


class _Metrics(msgspec.Struct):
    accumulated_cost: float | None = None
    accumulated_token_usage: _TokenUsage | None = None


class _Event(msgspec.Struct):
    timestamp: str | None = None
    tool_call_metadata: _ToolCallMetadata | None = None
    llm_metrics: _Metrics | None = None


_DECODER = msgspec.json.Decoder(list[_Event])


class OpenHandsImporter(DocumentImporter):
    """Reads OpenHands trajectories saved as a list of events (see module docstring)."""

    source = "openhands"
    decoder = _DECODER

    def sniff(self, name: str, head: bytes) -> bool:
        return (
            name.endswith(".json")
            and head.lstrip().startswith(b"[")
            and b'"source"' in head
            # (a first event's message can fill the head before its "action" key)
            and (b'"action"' in head or b'"observation"' in head or b'"timestamp"' in head)
        )

    def _name(self, f: LogFile) -> tuple[str, str]:
        return f.name.removesuffix(".json"), os.path.basename(os.path.dirname(f.path))

    @staticmethod
    def _session(events: list[_Event], path: str, out: ImportedSession) -> None:
        responses = Responses(out)
        metrics: _Metrics | None = None
        fallback = file_time(path)
        for e in events:
            if e.llm_metrics is not None:
                metrics = e.llm_metrics
            meta = e.tool_call_metadata
            response = meta.model_response if meta is not None else None
            usage = responses.usage(response)
            if usage is None:
                continue
            assert response is not None
            ts = response.created or parse_ts(e.timestamp)
            out.calls.append(
                Call(
                    ts=float(ts) if ts else fallback,
                    model=response.model or UNKNOWN_MODEL,
                    usage=usage,
                    approximate_ts=not response.created,
                )
            )
        if metrics is None:
            return
        base = "llm_metrics."
        tokens = metrics.accumulated_token_usage
        if tokens is not None:
            for what, field, value in (
                ("input_tokens", "prompt_tokens", tokens.prompt_tokens),
                ("cache_read_tokens", "cache_read_tokens", tokens.cache_read_tokens),
                ("cache_write_tokens", "cache_write_tokens", tokens.cache_write_tokens),
                ("output_tokens", "completion_tokens", tokens.completion_tokens),
            ):
                out.check(what, base + "accumulated_token_usage." + field, value)
        out.check_cost(base + "accumulated_cost", metrics.accumulated_cost)

"""SWE-agent trajectories: ``<instance>.traj``, one JSON document per task instance.

SWE-agent records no usage per call: only the instance's totals, in ``info.model_stats``
(``tokens_sent``, ``tokens_received``, ``api_calls``, ``instance_cost``), and no times
(the file's modification time stands for them, marked approximate). A session is therefore
one record standing for ``api_calls`` calls (``Call.count``): its tokens are the log's own,
its cost is genai-prices' for the model named in ``replay_config.agent.model`` (``name``
or ``model_name``; older files name none: the cost is then unknown), checked against
``instance_cost``, which SWE-agent priced with its own table. ``tokens_sent`` has no
cache split, so cached tokens are priced as uncached.
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
)
from stayer.audit.codex import UNKNOWN_MODEL
from stayer.usage import Usage


class _ModelStats(msgspec.Struct):
    instance_cost: float | None = None
    tokens_sent: int | None = None
    tokens_received: int | None = None
    api_calls: int | None = None


class _Info(msgspec.Struct):
    model_stats: _ModelStats | None = None


class _Model(msgspec.Struct):
    name: str | None = None
    model_name: str | None = None


class _Agent(msgspec.Struct):
    model: _Model | None = None


class _ReplayConfig(msgspec.Struct):
    agent: _Agent | None = None


class _Traj(msgspec.Struct):
    trajectory: list[msgspec.Raw]
    info: _Info
    environment: str | None = None
    # an object, or that object as a JSON string (Raw: msgspec takes no union with it)
    replay_config: msgspec.Raw = msgspec.Raw(b"null")


_DECODER = msgspec.json.Decoder(_Traj)
_CONFIG = msgspec.json.Decoder(_ReplayConfig)
_CONFIG_TEXT = msgspec.json.Decoder(str)


def _model(raw: msgspec.Raw) -> str | None:
    text = bytes(raw)
    if text == b"null":
        return None
    try:
        if text.startswith(b'"'):
            text = _CONFIG_TEXT.decode(text).encode()
        agent = _CONFIG.decode(text).agent
    except (msgspec.DecodeError, msgspec.ValidationError):
        return None
    model = agent.model if agent is not None else None
    return (model.name or model.model_name) if model is not None else None


class SweAgentImporter(DocumentImporter):
    """Reads SWE-agent ``.traj`` files (see module docstring)."""

    source = "swe-agent"
    decoder = _DECODER

    def sniff(self, name: str, head: bytes) -> bool:
        return name.endswith(".traj") and b'"trajectory"' in head

    def _name(self, f: LogFile) -> tuple[str, str]:
        return f.name.removesuffix(".traj"), ""

    @staticmethod
    def _session(doc: _Traj, path: str, out: ImportedSession) -> None:
        out.project = doc.environment or ""
        stats = doc.info.model_stats
        if stats is None or not stats.api_calls:
            return
        sent, received = stats.tokens_sent or 0, stats.tokens_received or 0
        if sent < 0 or received < 0 or stats.api_calls < 0:
            out.skipped_lines += 1
            return
        model = _model(doc.replay_config)
        out.calls.append(
            Call(
                ts=file_time(path),
                model=model or UNKNOWN_MODEL,
                usage=Usage(input_tokens=sent, output_tokens=received),
                approximate_ts=True,
                count=stats.api_calls,
            )
        )
        base = "info.model_stats."
        out.check("calls", base + "api_calls", stats.api_calls)
        out.check("input_tokens", base + "tokens_sent", sent)
        out.check("output_tokens", base + "tokens_received", received)
        why = (
            ""
            if model
            else f"the log names no model ({os.path.basename(path)} has no replay_config)"
        )
        out.check_cost(base + "instance_cost", stats.instance_cost, why)

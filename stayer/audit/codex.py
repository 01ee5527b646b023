"""Codex CLI sessions: ``~/.codex/sessions/YYYY/MM/DD/rollout-<time>-<uuid>.jsonl``.

Details and rationale: docs/notes.md, ``stayer/audit/codex.py``.
"""

from __future__ import annotations

import operator
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from stayer.audit.calls import (
    Call,
    ImportedSession,
    LogFile,
    SessionRef,
    json_object,
    open_logs,
    parse_ts,
    well_framed,
)
from stayer.usage import Usage

_UUID = re.compile(r"([0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12})$")
_FIELDS = ("input_tokens", "cached_input_tokens", "output_tokens", "reasoning_output_tokens")
_ZERO = (0,) * len(_FIELDS)
UNKNOWN_MODEL = "(unknown model)"


def _counts(u: Any) -> tuple[int, ...] | None:
    if not isinstance(u, Mapping):
        return None
    out = []
    for k in _FIELDS:
        v = u.get(k, 0)
        if v is None:
            v = 0
        if not isinstance(v, int) or v < 0:
            return None
        out.append(v)
    return tuple(out)


class CodexImporter:
    """Reads Codex CLI rollout files (see module docstring)."""

    source = "codex"

    def sniff(self, name: str, head: bytes) -> bool:
        return name.endswith(".jsonl") and (
            b'"session_meta"' in head or b'"turn_context"' in head or b'"type":"event_msg"' in head
        )

    def group(self, files: Sequence[LogFile]) -> Iterable[SessionRef]:
        for f in files:
            stem = f.name.removesuffix(".jsonl")
            m = _UUID.search(stem)
            yield SessionRef(self.source, m.group(1) if m else stem, "", (f.path,), f.size)

    def read(self, ref: SessionRef) -> ImportedSession:
        out = ImportedSession(self.source, ref.id, ref.project)
        for f in open_logs(ref, out):
            with f:
                self._read(f, out)
        return out

    def _read(self, lines: Iterable[bytes], out: ImportedSession) -> None:
        model = UNKNOWN_MODEL
        previous_info: Any = None
        # The cumulative usage of the calls counted so far, as Codex's running total has it.
        accounted: tuple[int, ...] | None = None
        compacted = False
        for line in lines:
            out.bytes += len(line)
            if not (
                b'"token_count"' in line
                or b'"turn_context"' in line
                or b'"session_meta"' in line
                or b"compacted" in line
            ):
                if not well_framed(line):
                    out.skipped_lines += 1
                continue
            d = json_object(line, out)
            if d is None:
                continue
            payload = d.get("payload")
            if not isinstance(payload, dict):
                out.skipped_lines += 1
                continue
            kind, ptype = d.get("type"), payload.get("type")
            if kind == "session_meta":
                if isinstance(payload.get("id"), str):
                    out.id = payload["id"]
                if isinstance(payload.get("cwd"), str):
                    out.project = payload["cwd"]
            elif kind == "turn_context":
                if isinstance(payload.get("model"), str) and payload["model"]:
                    model = payload["model"]
            elif kind == "compacted" or ptype == "context_compacted":
                compacted = True
            elif kind == "event_msg" and ptype == "token_count":
                info = payload.get("info")
                if info is None:
                    continue  # rate-limit update before the first response
                if info == previous_info:
                    continue  # repeated when only the rate limits changed
                previous_info = info
                ts = parse_ts(d.get("timestamp"))
                total = _counts(info.get("total_token_usage")) if isinstance(info, dict) else None
                last = _counts(info.get("last_token_usage")) if isinstance(info, dict) else None
                if ts is None or (total is None and last is None):
                    out.skipped_lines += 1
                    continue
                if total is not None and (
                    accounted is None or all(map(operator.ge, total, accounted))
                ):
                    if total == accounted:
                        continue  # nothing new since the calls already counted
                    counts = last or tuple(map(operator.sub, total, accounted or _ZERO))
                    accounted = total
                elif last is not None:
                    # A null, non-numeric or decreasing total is no base for the next
                    # difference: the calls counted so far stay the base, or the call
                    # after it would be counted again.
                    counts = last
                    accounted = tuple(map(operator.add, accounted or _ZERO, last))
                else:
                    out.skipped_lines += 1
                    continue
                if not any(counts):
                    continue
                inp, cached, output, reasoning = counts
                if cached > inp or reasoning > output:
                    out.skipped_lines += 1
                    continue
                named = payload.get("model") or info.get("model")
                out.calls.append(
                    Call(
                        ts=ts,
                        model=named if isinstance(named, str) and named else model,
                        usage=Usage(
                            input_tokens=inp,
                            cache_read_tokens=cached,
                            output_tokens=output,
                            reasoning_tokens=reasoning,
                        ),
                        provider="openai",
                        compacted=compacted,
                    )
                )
                compacted = False

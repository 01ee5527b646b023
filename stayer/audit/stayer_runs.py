"""stayer's own runs: ``$STAYER_HOME/runs/<run_id>/result.json`` and its ledger.

The ledger has one entry per model call with its normalised usage, its model spec
(``sim:claude-sonnet-4-5``, ``anthropic:…``) and the cache-break verdict the agent's
forensics reached with the full request in view — better evidence than usage alone, so it
is kept as the call's reason. Calls are not timestamped; their times are reconstructed from
the run's start and each call's latency (tool time is not in the ledger), so idle gaps in
these runs are underestimated and marked approximate.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from typing import Any

import orjson

from stayer.audit.calls import (
    Call,
    ImportedSession,
    LogFile,
    SessionRef,
    open_logs,
    parse_ts,
)
from stayer.usage import Usage


class StayerRunImporter:
    """Reads ``result.json`` documents written by ``stayer run``."""

    source = "stayer"

    def sniff(self, name: str, head: bytes) -> bool:
        return name == "result.json" and b'"run_id"' in head and b'"task_path"' in head

    def group(self, files: Sequence[LogFile]) -> Iterable[SessionRef]:
        for f in files:
            run_dir = os.path.basename(os.path.dirname(f.path))
            yield SessionRef(self.source, run_dir, "", (f.path,), f.size)

    def read(self, ref: SessionRef) -> ImportedSession:
        out = ImportedSession(self.source, ref.id, ref.project)
        for f in open_logs(ref, out):
            try:
                with f:
                    raw = f.read()
                doc = orjson.loads(raw)
            except (OSError, orjson.JSONDecodeError):
                out.skipped_lines += 1
                continue
            out.bytes += len(raw)
            if not isinstance(doc, dict) or not isinstance(doc.get("ledger"), list):
                out.skipped_lines += 1
                continue
            out.id = str(doc.get("run_id") or ref.id)
            out.project = str(doc.get("task") or "")
            self._ledger(doc, out)
        return out

    @staticmethod
    def _ledger(doc: dict[str, Any], out: ImportedSession) -> None:
        clock = parse_ts(doc.get("started")) or 0.0
        for entry in doc["ledger"]:
            try:
                usage = Usage.from_dict(entry["usage"])
                model = str(entry["model"])
                latency = float(entry.get("latency_s") or 0.0)
            except (KeyError, TypeError, ValueError, AttributeError):
                out.skipped_lines += 1
                continue
            verdict = entry.get("cache_break")
            if isinstance(verdict, dict):
                reason: str | None = str(verdict.get("reason") or "unknown")
            else:  # null: the forensics saw no break; absent: an older ledger without them
                reason = "" if "cache_break" in entry else None
            at = parse_ts(entry.get("ts"))
            out.calls.append(
                Call(
                    ts=at if at is not None else clock,
                    model=model,
                    usage=usage,
                    service_tier=entry.get("service_tier") or doc.get("service_tier"),
                    cache_break_reason=reason,
                    approximate_ts=at is None,
                )
            )
            clock += latency

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

import msgspec
from msgspec import UNSET, UnsetType

from stayer.audit.calls import (
    Call,
    ImportedSession,
    LogFile,
    SessionRef,
    open_logs,
    parse_ts,
)
from stayer.records import Record, decode
from stayer.usage import Usage


class CacheVerdict(Record):
    """A ledger entry's ``cache_break``, as far as the audit reads it."""

    reason: str | None = None


class LedgerStep(Record):
    """A ledger entry of ``result.json`` as the audit reads it (``stayer.ledger``'s
    ``LedgerEntry``; ``ts`` and ``service_tier`` where a ledger has them)."""

    model: str
    usage: Usage
    latency_s: float | None = None
    # None: the forensics saw no break; UNSET: an older ledger without verdicts.
    cache_break: CacheVerdict | None | UnsetType = UNSET
    ts: str | None = None
    service_tier: str | None = None


class RunDoc(Record):
    """``result.json`` as the audit reads it; its entries are read one by one, so a bad
    one is a skipped line, not a skipped run."""

    ledger: list[msgspec.Raw]
    run_id: str | None = None
    task: str | None = None
    started: str | None = None
    service_tier: str | None = None


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
            except OSError:
                out.skipped_lines += 1
                continue
            try:
                doc = decode(raw, RunDoc)
            except msgspec.ValidationError:  # JSON, but not a run's result
                out.bytes += len(raw)
                out.skipped_lines += 1
                continue
            except msgspec.DecodeError:
                out.skipped_lines += 1
                continue
            out.bytes += len(raw)
            out.id = doc.run_id or ref.id
            out.project = doc.task or ""
            self._ledger(doc, out)
        return out

    @staticmethod
    def _ledger(doc: RunDoc, out: ImportedSession) -> None:
        clock = parse_ts(doc.started) or 0.0
        for raw in doc.ledger:
            try:
                entry = decode(raw, LedgerStep)
            except msgspec.ValidationError:
                out.skipped_lines += 1
                continue
            verdict = entry.cache_break
            if isinstance(verdict, CacheVerdict):
                reason: str | None = verdict.reason or "unknown"
            else:  # null: the forensics saw no break; absent: an older ledger without them
                reason = None if verdict is UNSET else ""
            at = parse_ts(entry.ts)
            out.calls.append(
                Call(
                    ts=at if at is not None else clock,
                    model=entry.model,
                    usage=entry.usage,
                    service_tier=entry.service_tier or doc.service_tier,
                    cache_break_reason=reason,
                    approximate_ts=at is None,
                )
            )
            clock += entry.latency_s or 0.0

"""stayer audit reads stayer's own result.json: each ledger entry on its own, so a bad
entry is one skipped line and the others still count."""

from __future__ import annotations

import json
from pathlib import Path

from stayer.audit.calls import SessionRef
from stayer.audit.stayer_runs import StayerRunImporter
from stayer.usage import Usage


def _read(path: Path, text: str):  # noqa: ANN202
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    ref = SessionRef("stayer", path.parent.name, "", (str(path),), path.stat().st_size)
    return StayerRunImporter().read(ref)


def test_each_entry_is_read_on_its_own(tmp_path: Path) -> None:
    usage = Usage(1_000, 600, 400, 0, 50).to_dict()
    entry = {"model": "sim:claude-sonnet-4-5", "usage": usage, "latency_s": 2.0}
    ledger = [
        {**entry, "cache_break": None},
        {**entry, "cache_break": {"position_tokens": 5, "reason": "tools_changed", "detail": ""}},
        {**entry, "cache_break": {"position_tokens": 5, "detail": ""}},
        entry,  # an older ledger: no verdict at all
        {**entry, "usage": {"input_tokens": "many"}},  # skipped
        {"model": "m"},  # skipped: no usage
        5,  # skipped
        {**entry, "ts": "2026-01-01T00:00:10Z", "service_tier": "priority", "latency_s": None},
    ]
    doc = {"run_id": "", "task": "fix-median", "started": "2026-01-01T00:00:00Z"}
    text = json.dumps({**doc, "service_tier": "flex", "task_path": "/t", "ledger": ledger})
    out = _read(tmp_path / "r1" / "result.json", text)
    assert (out.id, out.project, out.skipped_lines, out.bytes) == ("r1", "fix-median", 3, len(text))
    assert [c.cache_break_reason for c in out.calls] == ["", "tools_changed", "unknown", None, None]
    assert [c.service_tier for c in out.calls] == ["flex"] * 4 + ["priority"]
    assert [c.ts - out.calls[0].ts for c in out.calls[:4]] == [0.0, 2.0, 4.0, 6.0]
    assert [c.approximate_ts for c in out.calls] == [True] * 4 + [False]
    assert all(c.usage == Usage.from_dict(usage) for c in out.calls)


def test_a_document_that_is_not_a_result_is_one_skipped_file(tmp_path: Path) -> None:
    not_a_ledger = '{"run_id": "a", "task_path": "t", "ledger": "no"}'
    out = _read(tmp_path / "r2" / "result.json", not_a_ledger)
    assert (out.calls, out.skipped_lines, out.bytes) == ([], 1, len(not_a_ledger))
    out = _read(tmp_path / "r3" / "result.json", '{"run_id": "a", broken')
    assert (out.calls, out.skipped_lines, out.bytes) == ([], 1, 0)

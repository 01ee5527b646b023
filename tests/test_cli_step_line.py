"""``stayer run``'s progress line is made from the ledger entry record itself."""

from __future__ import annotations

from decimal import Decimal

from stayer.cli.run import step_line
from stayer.context.compactor import Compacted
from stayer.context.forensics import CacheBreak
from stayer.ledger import LedgerEntry, ToolCallEntry
from stayer.pricing import Cost
from stayer.usage import Usage


def _entry(**kw: object) -> LedgerEntry:
    fields: dict[str, object] = {
        "step": 7,
        "model": "sim:claude-sonnet-4-5",
        "usage": Usage(12_000, 9_000, 1_000, 0, 300),
        "cost": Cost(Decimal("0.0123"), None, None, "m"),
        "context_tokens": 12_000,
        "latency_s": 1.5,
        "tool_calls": [
            ToolCallEntry("a", "bash", False),
            ToolCallEntry("b", "edit", True),
        ],
    }
    return LedgerEntry.made(**{**fields, **kw})  # type: ignore[arg-type]


def test_a_step_line_reads_the_entry_record():
    entry = _entry(
        agent="main/sub-1",
        cache_break=CacheBreak(position_tokens=10, reason="prefix_edit", detail="message 3"),
        compaction=Compacted(
            reason="threshold", first_index=2, tokens_before=120_000, tokens_after=4_000
        ),
    )
    assert step_line(entry, Decimal("0.5")) == (
        "main/sub-1 step   7 │ sim:claude-sonnet-4-5 │ ctx    12,000 │ cache  75.0% │ "
        "$0.012300 │ total $0.500000 │ bash,edit │ cache break: prefix_edit (message 3) │ "
        "compacted 120,000 → 4,000 tokens (threshold)"
    )
    # At a terminal's width the model goes first, then the text is cut; numbers stay whole.
    assert step_line(entry, None, 90) == (
        "main/sub-1 step   7 │ ctx    12,000 │ cache  75.0% │ $0.012300 │ total — │ bash,edit │ c…"
    )


def test_an_unpriced_step_of_the_main_agent_without_tools():
    entry = _entry(
        cost=Cost.unknown("m"), tool_calls=[], context_tokens=0, usage=Usage(0, 0, 0, 0, 0)
    )
    assert step_line(entry, None) == (
        "step   7 │ sim:claude-sonnet-4-5 │ ctx         0 │ cache   0.0% │ unknown │ total — │ -"
    )

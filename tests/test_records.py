"""The record family's one codec: a ledger entry of each kind, and one an older journal
stored, reads into ``LedgerEntry`` and is written out with exactly the fields it had."""

from __future__ import annotations

from decimal import Decimal

import msgspec
import pytest

from stayer.context.forensics import CacheBreak
from stayer.ledger import LedgerEntry, LostCall, ToolCallEntry
from stayer.pricing import Cost
from stayer.records import decode, encode, from_json, to_json
from stayer.tokens import PromptEstimate
from stayer.usage import Usage

USAGE = {
    "input_tokens": 100,
    "cache_read_tokens": 40,
    "cache_write_5m_tokens": 10,
    "cache_write_1h_tokens": 0,
    "output_tokens": 7,
    "reasoning_tokens": 0,
    "cache_write_tokens": 10,
}


def made() -> LedgerEntry:
    return LedgerEntry.made(
        step=2,
        model="anthropic:claude-sonnet-4-5",
        usage=Usage(100, 40, 10, 0, 7),
        cost=Cost(Decimal("0.00123400"), None, None, "claude-sonnet-4-5"),
        context_tokens=95,
        latency_s=1.234567,
        tool_calls=[
            ToolCallEntry(id="a", name="bash", is_error=False, exit_code=1),
            ToolCallEntry(id="b", name="bash", is_error=False, exit_code=0),
        ],
        cache_break=CacheBreak(position_tokens=3, reason="prefix_edit", detail="d"),
        agent="main/sub-1",
        prompt_estimate=PromptEstimate(90, 120, exact=True),
    )


def test_a_step_made_is_the_documented_json():
    assert to_json(made()) == {
        "agent": "main/sub-1",
        "step": 2,
        "model": "anthropic:claude-sonnet-4-5",
        "usage": USAGE,
        "cost_usd": "0.001234",
        "cache_hit_ratio": 0.4,
        "context_tokens": 95,
        "latency_s": 1.2346,
        "tool_calls": [
            {"id": "a", "name": "bash", "is_error": False, "exit_code": 1},
            {"id": "b", "name": "bash", "is_error": False, "exit_code": 0},
        ],
        "tool_errors": 1,
        "cache_break": {"position_tokens": 3, "reason": "prefix_edit", "detail": "d"},
        "compaction": None,
        "breakers": [],
        "route": None,
        "prompt_estimate": {"tokens": 90, "upper": 120},
    }


def test_a_lost_attempt_has_only_its_kinds_fields():
    lost = LostCall(n=4, step=3, model="m", usage=Usage(10), cost=Cost(None, None, None, "m"))
    entry = lost.entry()
    assert to_json(entry) == {
        "agent": "main",
        "step": 3,
        "kind": "lost_in_flight",
        "model": "m",
        "usage": {**dict.fromkeys(USAGE, 0), "input_tokens": 10},
        "cost_usd": "unknown",
        "estimated": True,
        "cache_hit_ratio": 0.0,
        "context_tokens": None,
        "latency_s": None,
        "tool_calls": [],
        "tool_errors": 0,
        "cache_break": None,
    }


# What a step of an older journal says besides its step, tool calls and compaction.
OLD_STEP = {
    "model": "m",
    "usage": {"input_tokens": 5, "output_tokens": 1},
    "cost_usd": "0.5",
    "cache_hit_ratio": 0.0,
    "context_tokens": 5,
    "latency_s": 0.1,
}


@pytest.mark.parametrize(
    "doc",
    [
        # written before breakers, routes and prompt estimates were kept
        {
            "step": 1,
            **OLD_STEP,
            "tool_calls": [{"id": "x", "name": "bash", "is_error": True}],
            "tool_errors": 1,
            "cache_break": None,
            "compaction": {"reason": "r", "first_index": 2, "tokens_before": 9, "tokens_after": 3},
        },
        {  # a compaction that took an MCP server's changed tool list with it
            "step": 3,
            **OLD_STEP,
            "tool_calls": [],
            "tool_errors": 0,
            "cache_break": None,
            "compaction": {
                "reason": "r",
                "first_index": 2,
                "tokens_before": 9,
                "tokens_after": 3,
                "cost_usd": "0.01",
                "tools_changed": {"when": "compaction", "added": ["t__added"], "removed": []},
            },
        },
        {
            "agent": "main",
            "step": 4,
            "kind": "cut_short",
            "model": "m",
            "model_calls": 2,
            "usage": USAGE,
            "cost_usd": "unknown",
            "cache_hit_ratio": 0.4,
            "context_tokens": None,
            "latency_s": 0.5,
            "tool_calls": [],
            "tool_errors": 0,
            "cache_break": None,
        },
    ],
)
def test_a_stored_entry_is_written_back_exactly(doc):
    entry = from_json(doc, LedgerEntry)
    assert to_json(entry) == {
        **doc,
        "agent": doc.get("agent", "main"),
        "usage": {**dict.fromkeys(USAGE, 0), **Usage.from_dict(doc["usage"]).to_dict()},
    }
    assert decode(encode(entry), LedgerEntry) == entry


def test_a_usage_stored_as_one_cache_write_total_reads_as_5m_writes():
    u = from_json({"input_tokens": 50, "cache_write_tokens": 20}, Usage)
    assert (u.cache_write_5m_tokens, u.cache_write_tokens) == (20, 20)
    assert u == Usage.from_dict({"input_tokens": 50, "cache_write_tokens": 20})


def test_a_malformed_entry_is_refused():
    with pytest.raises(msgspec.ValidationError, match="step"):
        from_json({"step": "two", "model": "m", "usage": {}, "cost_usd": "1"}, LedgerEntry)

"""Context policies, the compaction scheduler, cache-break forensics and what-if replay."""

from __future__ import annotations

import asyncio
import json
import random
from decimal import Decimal
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from stayer.agent import Agent, AgentSettings, Limits
from stayer.context.forensics import CacheForensics
from stayer.context.layout import Context
from stayer.context.policies import (
    AutoPolicy,
    ContextOverflow,
    MaskPolicy,
    NonePolicy,
    StepView,
    SummarizePolicy,
    TextbookPolicy,
    make_policy,
)
from stayer.errors import ConfigError
from stayer.models.base import Message, ModelRequest, ToolCall, ToolSpec
from stayer.models.caching import cache_rules
from stayer.models.sim import SimModel
from stayer.models.sim_policies import filler
from stayer.pricing import PriceBook
from stayer.tokens import MessageCounter, TiktokenCounter
from stayer.usage import Usage
from stayer.whatif import BASH, Trace, load_trace, replay

COUNTER = MessageCounter(TiktokenCounter())
PRICES = PriceBook()
CORPUS = Path(__file__).resolve().parent.parent.parent / "shared" / "corpus" / "swe-agent"


def text(n: int, seed: int) -> str:
    return filler(n, random.Random(seed))


def trace(steps: int, obs: int, out: int, kinds: list[str] | None = None) -> Trace:
    turns, observations = [], {}
    for s in range(steps):
        call = ToolCall(f"c{s}", "bash", json.dumps({"command": f"step {s}"}))
        turns.append(Message("assistant", text(out, s), (call,)))
        observations[call.id] = text(obs, 1000 + s)
    return Trace("synthetic", "You are an agent.", "Solve it.", turns, observations, [BASH])


def whatif(t: Trace, model: str, policy: str, max_context: int | None = None) -> dict:
    return asyncio.run(
        replay(
            t, model, make_policy(policy), prices=PRICES, counter=COUNTER, max_context=max_context
        )
    )


# --- the scheduler against the baselines --------------------------------------------------


def test_auto_halves_the_published_workload_under_anthropic_prices():
    t = trace(30, 20_000, 2_000)
    none, auto = whatif(t, "claude-sonnet-4-5", "none"), whatif(t, "claude-sonnet-4-5", "auto")
    assert Decimal(auto["cost_usd"]) <= Decimal(none["cost_usd"]) / 2
    assert auto["peak_context_tokens"] < 200_000 < none["peak_context_tokens"]
    assert auto["compactions"] >= 2


@pytest.mark.parametrize("model", ["claude-sonnet-4-5", "gpt-5"])
def test_auto_never_costs_more_than_none_or_masking(model):
    for t in (trace(12, 300, 100), trace(40, 3_000, 300), trace(25, 12_000, 1_000)):
        costs = {p: Decimal(whatif(t, model, p)["cost_usd"]) for p in ("none", "mask", "auto")}
        assert costs["auto"] <= costs["none"] and costs["auto"] <= costs["mask"], costs


def test_short_sessions_are_left_alone():
    # Compacting a small context costs a cache miss and saves almost nothing.
    assert whatif(trace(6, 500, 100), "claude-sonnet-4-5", "auto")["compactions"] == 0


def test_max_context_is_never_exceeded_and_below_keep_content_is_an_error():
    t = trace(30, 5_000, 200)
    r = whatif(t, "gpt-5", "none", max_context=20_000)
    assert r["peak_context_tokens"] <= 20_000 and r["requests"] == 30
    with pytest.raises(ConfigError, match="keep-class"):
        whatif(trace(30, 5_000, 2_000), "gpt-5", "auto", max_context=20_000)


# --- what policies may touch ----------------------------------------------------------


def fresh_context(messages: list[Message]) -> Context:
    ctx = Context("system", [ToolSpec("bash", "run", {})], "the task: keep me", COUNTER)
    for m in messages:
        ctx.append(m)
    return ctx


message_kinds = st.sampled_from(["observation", "note", "error", "result", "nudge", "assistant"])


@settings(max_examples=60, deadline=None)
@given(
    kinds=st.lists(message_kinds, min_size=1, max_size=40),
    sizes=st.lists(st.integers(min_value=1, max_value=400), min_size=40, max_size=40),
    policy=st.sampled_from(["auto", "mask:2", "summarize:500", "textbook:800", "none"]),
    limit=st.one_of(st.none(), st.integers(min_value=3_000, max_value=20_000)),
)
def test_pinned_and_keep_content_survives_any_number_of_compactions(kinds, sizes, policy, limit):
    p = make_policy(policy)
    ctx = fresh_context([])
    kept: list[str] = []
    for step, kind in enumerate(kinds, 1):
        body = f"{kind}-{step} " + text(sizes[step - 1], step)
        if kind == "assistant":
            m = Message("assistant", body, (ToolCall(f"c{step}", "bash", "{}"),))
        elif kind == "nudge":
            m = Message("user", body, kind="nudge")
        else:
            m = Message("tool", body, tool_call_id=f"c{step}", is_error=kind == "error", kind=kind)
        if kind in ("note", "error", "result", "assistant"):
            kept.append(body)
        ctx.append(m)
        view = StepView(
            step=step,
            max_steps=100,
            max_context=limit,
            rates_at=lambda n: PRICES.rates("claude-sonnet-4-5", "anthropic", None, n),
        )
        try:
            c = p.plan(ctx, view)
        except ContextOverflow:
            assert limit is not None
            return
        if c is not None:
            c.apply(ctx)
        if limit is not None:
            assert ctx.tokens <= limit
        everything = "\n".join(m.content for m in ctx.messages)
        assert ctx.messages[0].content == "the task: keep me" and ctx.system == "system"
        for body in kept:
            assert body in everything
        assert ctx.tokens == ctx.prefix_tokens + sum(COUNTER.message(m) for m in ctx.messages)


def test_mask_keeps_a_window_and_stubs_name_the_saved_file():
    ctx = fresh_context(
        [Message("tool", text(50, i), tool_call_id=f"c{i}", kind="observation") for i in range(8)]
    )
    c = MaskPolicy(window=3).plan(ctx, StepView(step=9))
    c.apply(ctx)
    stubbed = [m for m in ctx.messages if m.kind == "elided"]
    assert len(stubbed) == 5 and "/app/.stayer/outputs/c0.txt" in stubbed[0].content
    assert c.archive["/app/.stayer/outputs/c0.txt"] == text(50, 0)


def test_summarize_puts_state_in_the_first_stub():
    ctx = fresh_context(
        [
            Message("assistant", "", (ToolCall("c1", "bash", '{"command": "make"}'),)),
            Message(
                "tool",
                "cc -o x x.c\nerror: boom\n[exit code: 2]",
                tool_call_id="c1",
                kind="observation",
            ),
            Message("assistant", "", (ToolCall("c2", "bash", '{"command": "ls"}'),)),
            Message("tool", text(900, 2), tool_call_id="c2", kind="observation"),
            Message("assistant", "", (ToolCall("c3", "bash", '{"command": "ls"}'),)),
            Message("tool", text(900, 3), tool_call_id="c3", kind="observation"),
        ]
    )
    c = SummarizePolicy(high_watermark=100, window=1).plan(ctx, StepView(step=4))
    assert c.summary_input_tokens > 0 and c.summary_output_tokens > 0
    first = c.changes[min(c.changes)]
    assert "FAILED bash" in first.content and "make" in first.content


def test_textbook_rewrites_from_the_head():
    ctx = fresh_context(
        [Message("tool", text(500, i), tool_call_id=f"c{i}", kind="observation") for i in range(5)]
    )
    c = TextbookPolicy(max_tokens=1_000).plan(ctx, StepView(step=6))
    assert c.first_index == 1 and c.head_insert is not None


def test_unknown_policy_is_bad_input():
    with pytest.raises(ConfigError, match="--policy"):
        make_policy("lru")


# --- cache-break forensics, against the simulator --------------------------------------


class Echo:
    def next_message(self, request: ModelRequest) -> Message:
        return Message("assistant", "ok", (ToolCall(f"c{len(request.messages)}", "bash", "{}"),))


def sim_call(
    sim: SimModel,
    f: CacheForensics,
    messages: list[Message],
    now: float,
    *,
    system: str = "sys",
    tools: list[ToolSpec] | None = None,
    compaction_at: int | None = None,
    model: str | None = None,
):
    req = ModelRequest(
        system=system,
        tools=tools or [BASH],
        messages=messages,
        cache_breakpoints=[0, len(messages) - 1],
        cache_key="k",
        now=now,
    )
    r = asyncio.run(sim.complete(req))
    return f.observe(
        req, r.usage, model or sim.spec, cache_rules(sim.provider, sim.model_id), now, compaction_at
    )


@pytest.mark.parametrize("model", ["claude-sonnet-4-5", "gpt-5"])
def test_cache_break_reasons(model):
    sim, f = SimModel(model, Echo(), COUNTER), CacheForensics(COUNTER)
    history = [
        Message("user", text(2_000, 1), kind="task"),
        Message("assistant", "a"),
        Message("tool", text(300, 2), tool_call_id="x"),
    ]
    assert sim_call(sim, f, history[:1], 0) is None
    assert sim_call(sim, f, history, 1) is None  # append-only: whole previous prompt read
    edited = [history[0], Message("assistant", "b"), history[2]]
    brk = sim_call(sim, f, edited, 2)
    assert (
        brk["reason"] == "prefix_edit" and "message 1" in brk["detail"] and "'a'" in brk["detail"]
    )
    grown = [*edited, Message("user", "next")]
    brk = sim_call(sim, f, grown, 2 + 400)  # idle longer than the 5-minute lifetime
    assert brk["reason"] == "ttl_expired" and "idle 400 s" in brk["detail"]
    brk = sim_call(sim, f, grown, 403, model="sim:other")
    assert brk["reason"] == "model_switch"
    brk = sim_call(sim, f, grown, 404, model="sim:other", tools=[BASH, ToolSpec("memory", "m", {})])
    assert brk["reason"] == "tools_changed"


def test_compaction_reason_and_no_break_below_the_minimum():
    sim, f = SimModel("claude-sonnet-4-5", Echo(), COUNTER), CacheForensics(COUNTER)
    small = [Message("user", "short task", kind="task")]
    sim_call(sim, f, small, 0)
    # Too short to be cached: nothing read, and nothing lost (issue 35: it was a "break").
    assert sim_call(sim, f, [*small, Message("assistant", "a")], 1) is None
    big = [
        Message("user", text(3_000, 5), kind="task"),
        Message("tool", text(500, 6), tool_call_id="x"),
    ]
    sim_call(sim, f, big, 2)
    brk = sim_call(
        sim,
        f,
        [big[0], Message("tool", "[elided]", tool_call_id="x", kind="elided")],
        3,
        compaction_at=1,
    )
    assert brk["reason"] == "compaction" and brk["position_tokens"] > 3_000


def test_ledger_carries_cache_breaks_and_compactions():
    t = trace(30, 20_000, 2_000)
    model = SimModel("claude-sonnet-4-5", _Turns(t.turns), COUNTER)
    from stayer.whatif import RecordedTool

    outputs = iter([t.observations[c.id] for turn in t.turns for c in turn.tool_calls])
    agent = Agent(
        model,
        [RecordedTool(BASH, outputs)],
        _no_sandbox(),
        AgentSettings(PRICES, COUNTER, Limits(max_steps=30)),
    )
    result = asyncio.run(agent.run("Solve it.", "r"))
    compacted = [e for e in result.ledger if e.compaction]
    assert compacted and all(
        e.cache_break and e.cache_break["reason"] == "compaction" for e in compacted
    )
    # Step 1's prompt was too short to be cached: no break at step 2 either.
    assert all(e.cache_break is None for e in result.ledger if not e.compaction)


class _Turns:
    def __init__(self, turns):
        self.turns = turns

    def next_message(self, request):
        return self.turns[sum(1 for m in request.messages if m.role == "assistant")]


def _no_sandbox():
    from stayer.tools.base import ToolContext

    return ToolContext(sandbox=None, workspace="")  # type: ignore[arg-type]


# --- what-if traces ------------------------------------------------------------------


@pytest.mark.skipif(not CORPUS.is_dir(), reason="shared corpus not present")
@pytest.mark.parametrize(
    "name", ["pydicom__pydicom-1458.traj", "mini-swe-agent/django__django-11119.traj.json"]
)
def test_corpus_traces_replay(name):
    t = load_trace(str(CORPUS / name))
    r = whatif(t, "gpt-5", "auto")
    assert r["requests"] == len(t.turns) and Decimal(r["cost_usd"]) > 0 and r["estimate"] is True


def test_trace_errors_name_the_file(tmp_path):
    bad = tmp_path / "x.traj"
    bad.write_text('{"history": [')
    with pytest.raises(ConfigError, match="truncated"):
        load_trace(str(bad))
    other = tmp_path / "y.json"
    other.write_text('{"events": []}')
    with pytest.raises(ConfigError, match="unknown trace format"):
        load_trace(str(other))


def test_memory_notes_survive_compaction(tmp_path):
    from stayer.sandbox.local import LocalSandbox
    from stayer.tools import default_tools
    from stayer.tools.base import ToolContext

    calls = [
        ToolCall("m1", "memory", json.dumps({"action": "save", "note": "the bug is in parse()"}))
    ]
    calls += [
        ToolCall(f"b{i}", "bash", json.dumps({"command": f"seq 1 3000 | sed s/^/line{i}-/"}))
        for i in range(12)
    ]
    turns = [Message("assistant", "", (c,)) for c in calls]

    counter = TiktokenCounter()
    ctx = ToolContext(
        sandbox=LocalSandbox(tmp_path), workspace=str(tmp_path), output_token_budget=20_000
    )
    agent = Agent(
        SimModel("claude-sonnet-4-5", _Turns(turns), COUNTER),
        default_tools(counter),
        ctx,
        AgentSettings(PRICES, COUNTER, Limits(max_steps=len(turns)), policy=MaskPolicy(window=1)),
    )
    seen: list[ModelRequest] = []
    original = agent.model.complete

    async def spy(request):
        seen.append(request)
        return await original(request)

    agent.model.complete = spy  # type: ignore[method-assign]
    asyncio.run(agent.run("task", "r"))
    last = seen[-1].messages
    assert any(m.content == "saved note: the bug is in parse()" for m in last)
    assert sum(1 for m in last if m.kind == "elided") >= 10
    assert (tmp_path / ".stayer" / "memory.md").read_text() == "- the bug is in parse()\n"
    saved = tmp_path / ".stayer" / "outputs" / "b0.txt"
    assert saved.read_text().startswith("line0-1\n")


def test_none_policy_matches_raw_history():
    ctx = fresh_context([Message("tool", text(100, i), tool_call_id=f"c{i}") for i in range(5)])
    assert NonePolicy().plan(ctx, StepView(step=6)) is None
    assert AutoPolicy().plan(ctx, StepView(step=6)) is None  # no prices: nothing to trade off


def test_usage_of_unknown_prices_never_compacts_except_for_the_limit():
    ctx = fresh_context([Message("tool", text(400, i), tool_call_id=f"c{i}") for i in range(5)])
    c = AutoPolicy().plan(ctx, StepView(step=6, max_context=1_000))
    assert c is not None and c.reason == "max_context" and c.tokens_after <= 1_000
    assert Usage().cache_hit_ratio == 0


def test_summarize_with_a_real_model_asks_it_for_the_summary(tmp_path):
    from stayer.context.summarizer import ModelSummarizer
    from stayer.models.base import ModelResponse
    from stayer.sandbox.local import LocalSandbox
    from stayer.tools.base import ToolContext

    class Writer:
        spec, provider, model_id = "test:claude-haiku-4-5", "anthropic", "claude-haiku-4-5"
        prompts: list[str] = []

        async def complete(self, request):
            self.prompts.append(request.messages[0].content)
            return ModelResponse(
                Message("assistant", "Files: none. Failed: nothing."),
                Usage(input_tokens=900, output_tokens=12),
                {},
                self.model_id,
                0.0,
            )

    writer = Writer()
    outputs = iter([text(600, i) for i in range(6)])
    turns = [Message("assistant", "", (ToolCall(f"c{i}", "bash", "{}"),)) for i in range(6)]
    from stayer.whatif import RecordedTool

    agent = Agent(
        SimModel("claude-sonnet-4-5", _Turns(turns), COUNTER),
        [RecordedTool(BASH, outputs)],
        ToolContext(sandbox=LocalSandbox(tmp_path), workspace=str(tmp_path)),
        AgentSettings(
            PRICES,
            COUNTER,
            Limits(max_steps=6),
            policy=SummarizePolicy(high_watermark=1_500, window=1),
            summarizer=ModelSummarizer(writer, PRICES),
        ),
    )
    result = asyncio.run(agent.run("task", "r"))
    compactions = [e.compaction for e in result.ledger if e.compaction]
    assert compactions and writer.prompts
    # Haiku 4.5: 900 input at $1/M + 12 output at $5/M
    assert Decimal(compactions[0]["cost_usd"]) == Decimal("0.00096")
    assert result.cost_usd == sum((e.cost.total for e in result.ledger), Decimal(0)) + sum(
        Decimal(c["cost_usd"]) for c in compactions
    )


def test_a_compaction_s_event_carries_its_rewritten_messages_as_records() -> None:
    from stayer.context.policies import Compaction
    from stayer.events import ChangedMessage, event_record

    c = Compaction(
        changes={3: Message("tool", "[evicted]", tool_call_id="t1", kind="observation")},
        reason="evict",
        tokens_before=900,
        tokens_after=400,
        first_index=3,
        head_insert=Message("user", "summary"),
    )
    event = c.event(7, "0.01")
    assert event.changes == {
        "3": ChangedMessage(role="tool", content="[evicted]", tool_call_id="t1", kind="observation")
    }
    kind, payload = event_record(event)
    assert kind == "compaction" and payload["changes"] == {
        "3": {"role": "tool", "content": "[evicted]", "tool_call_id": "t1", "kind": "observation"}
    }
    assert (payload["step"], payload["head_insert"], payload["cost_usd"]) == (7, "summary", "0.01")
    assert "agent" not in payload  # a single agent's compaction names none

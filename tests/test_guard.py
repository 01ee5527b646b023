"""Budgets (reservation, nesting, cross-task and cross-process atomicity), breakers and the
wrap-up, through the real agent loop with scripted models."""

from __future__ import annotations

import asyncio
import multiprocessing
import random
from decimal import Decimal
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from stayer.agent import Agent, AgentSettings, Limits
from stayer.delegation import ChildAgents, ChildSettings
from stayer.guard.attribution import per_agent
from stayer.guard.breakers import GuardConfig, StepRecord, ToolCallRecord
from stayer.guard.budget import Budget, MemoryBudgetStore
from stayer.guard.guard import Guard
from stayer.guard.reserve import quote
from stayer.guard.shared import SqliteBudgetStore
from stayer.models.scripted import COUNTER, Prices, ScriptedModel, bash, call, rates, text
from stayer.sandbox.local import LocalSandbox
from stayer.tools import default_tools
from stayer.tools.base import ToolContext

D = Decimal
PRICES = Prices(
    {"m-strong": rates("3", "0.3", "3.75", "15"), "m-cheap": rates("1", "0.1", "1.25", "5")}
)


def agent(model, workspace: Path | None, limits: Limits, prices=PRICES, **kw) -> Agent:
    ctx = ToolContext(
        sandbox=LocalSandbox(workspace) if workspace else None, workspace=str(workspace or "")
    )  # type: ignore[arg-type]
    tools = default_tools(COUNTER.counter) if workspace else []
    return Agent(model, tools, ctx, AgentSettings(prices, COUNTER, limits, **kw))


def run(a: Agent, task: str = "Do the task.") -> object:
    return asyncio.run(a.run(task, "run-1"))


# --- budgets -------------------------------------------------------------------------


def test_reservation_holds_until_settled_and_never_exceeds_the_cap():
    b = Budget(D("1"))
    r1 = b.reserve(D("0.6"))
    assert r1 is not None and b.reserve(D("0.5")) is None  # 0.6 held: 0.5 does not fit
    b.settle(r1, D("0.2"))
    assert b.spent == D("0.2") and b.available == D("0.8")
    r2 = b.reserve(D("0.8"))
    assert r2 is not None and b.available == 0
    b.release(r2)
    assert b.available == D("0.8") and b.spent == D("0.2")


def test_carved_slices_roll_up_and_cannot_be_overdrawn():
    root = Budget(D("10"))
    child = root.carve(D("4"), "sub-1")
    assert child is not None and root.available == D("6")
    assert root.carve(D("7"), "sub-2") is None  # more than the parent has left: refused
    grandchild = child.carve(D("3"), "sub-1")
    assert grandchild is not None and child.reserve(D("1.5")) is None
    r = grandchild.reserve(D("3"))
    assert r is not None
    grandchild.settle(r, D("2.5"))
    grandchild.close()
    assert child.spent == D("2.5") and child.available == D("1.5")
    child.close()
    assert root.spent == D("2.5") and root.available == D("7.5")


def test_unlimited_budgets_still_account():
    root = Budget(None)
    child = root.carve(None, "sub")
    assert child is not None and child.cap is None
    r = child.reserve(D("5"))
    child.settle(r, D("4"))
    child.close()
    assert root.spent == D("4") and root.available is None


def test_a_shared_budget_must_be_opened_with_the_same_cap(tmp_path):
    store = SqliteBudgetStore(tmp_path / "b.db")
    Budget(D("1"), store=store, name="team")
    Budget(D("1"), store=store, name="team")
    with pytest.raises(ValueError, match="already exists with cap"):
        Budget(D("2"), store=store, name="team")


def _hammer(path: str, seed: int, n: int, out) -> None:  # runs in a child process
    store = SqliteBudgetStore(path)
    b = Budget(D("5"), store=store, name="shared")
    rng = random.Random(seed)
    spent = D(0)
    for _ in range(n):
        amount = D(rng.randint(1, 300)) / 1000
        r = b.reserve(amount)
        if r is not None:
            actual = amount if rng.random() < 0.7 else amount * D(rng.randint(0, 100)) / 100
            b.settle(r, actual)
            spent += actual
    out.put(str(spent))


def test_reservations_are_atomic_across_processes(tmp_path):
    path = str(tmp_path / "budget.db")
    SqliteBudgetStore(path)  # create the schema once
    ctx = multiprocessing.get_context("fork")
    out = ctx.Queue()
    procs = [ctx.Process(target=_hammer, args=(path, seed, 150, out)) for seed in range(4)]
    for p in procs:
        p.start()
    totals = [D(out.get(timeout=60)) for _ in procs]
    for p in procs:
        p.join(timeout=60)
    b = Budget(D("5"), store=SqliteBudgetStore(path), name="shared")
    # Every process's spend is in the shared row, nothing is still held, and the cap holds.
    assert b.spent == sum(totals) and b.reserved == 0 and b.spent <= D("5")
    assert b.spent > D("4")  # the processes did compete for the whole cap


# --- the property: no overshoot, whatever the caps, prices, usage and concurrency --------


@st.composite
def scenarios(draw):
    return {
        "cap": D(draw(st.integers(1, 4000))) / 10000,  # $0.0001 .. $0.40
        "inp": draw(st.integers(1, 3000)),  # cents per MTok: $0.01 .. $30
        "read_pct": draw(st.integers(5, 100)),
        "write_pct": draw(st.integers(100, 200)),
        "out_mul": draw(st.integers(1, 8)),
        "cliff": draw(st.one_of(st.none(), st.integers(300, 3000))),
        "long": draw(st.integers(1, 3)),
        "agents": draw(
            st.lists(
                st.tuples(
                    st.sampled_from(["share", "slice"]), st.integers(1, 100), st.integers(1, 12)
                ),
                min_size=1,
                max_size=4,
            )
        ),
        "asks": draw(
            st.lists(st.integers(1, 150), max_size=3)
        ),  # sub-agent budget asks, % of what is left
        "seed": draw(st.integers(0, 2**32 - 1)),
        "sqlite": draw(st.integers(0, 7)) == 0,  # an eighth of the cases on the SQL store
    }


async def _scenario(s: dict) -> None:
    cents = D(s["inp"]) / 100
    base = rates(
        str(cents),
        str(cents * s["read_pct"] / 100),
        str(cents * s["write_pct"] / 100),
        str(cents * s["out_mul"]),
    )
    prices = Prices({"m-strong": base}, cliff=s["cliff"], long_factor=D(s["long"]))
    rng = random.Random(s["seed"])
    root = Budget(s["cap"], store=SqliteBudgetStore(":memory:") if s["sqlite"] else None)
    limits = Limits(
        max_steps=12, max_output_tokens=2048, guard=GuardConfig(loop_repeats=0, max_tool_errors=0)
    )
    runners, budgets = [], []
    for n, (mode, share, steps) in enumerate(s["agents"]):
        budget = (
            root
            if mode == "share"
            else root.carve((s["cap"] * share / 100).quantize(D("1e-9")), f"a{n}")
        )
        if budget is None:
            continue
        # Some steps delegate to a sub-agent, asking for a share of the cap (often more than
        # is left); the children run inside the step while the other agents keep running.
        replies = [text("working " * rng.randint(1, 50)) for _ in range(steps)]
        for k, pct in enumerate(s["asks"]):
            ask = float((s["cap"] * pct / 100).quantize(D("1e-6")))
            replies.insert(
                min(k * 2, len(replies)), call("subagent", {"task": "help", "budget_usd": ask}, k)
            )
        a = agent(
            ScriptedModel(replies=replies, rng=random.Random(rng.random())),
            None,
            limits,
            prices,
            budget=budget,
            path=f"a{n}",
        )
        child_model = ScriptedModel(replies=[text("sub work")], rng=random.Random(rng.random()))
        a.add_tool(ChildAgents(a, child_model, list, ChildSettings(max_steps=4)).tool())
        runners.append(a)
        budgets.append(budget)
    results = await asyncio.gather(*(a.run("task", f"r{i}") for i, a in enumerate(runners)))
    for budget in budgets:
        if budget is not root:
            budget.close()
    assert root.reserved == 0
    assert root.spent <= s["cap"], f"overshoot: {root.spent} > {s['cap']}"
    assert (
        sum(r.cost_usd for r in results) == root.spent
    )  # every dollar accounted, children included
    for budget, r in zip(budgets, results, strict=True):
        if budget is not root:
            assert r.cost_usd <= budget.cap
        assert r.status in ("submitted", "budget_exhausted") and r.summary  # never empty
        for row in per_agent(e.to_dict() for e in r.ledger):
            assert D(row["subtree_cost_usd"]) <= s["cap"]


# 100 scenarios in the default suite; the thousand in the slow one (.ci/run runs both).
@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios())
def test_no_hard_cap_is_ever_overshot(s):
    asyncio.run(_scenario(s))


@pytest.mark.slow
@settings(max_examples=1000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios())
def test_no_hard_cap_is_ever_overshot_in_a_thousand_scenarios(s):
    asyncio.run(_scenario(s))


def test_worst_case_covers_the_long_context_cliff():
    prices = Prices({"m": rates("1", "0.1", "1.25", "5")}, cliff=1000, long_factor=D(2))
    q = quote(lambda n: prices.rates("m", None, None, n), 900)  # 900 × 1.2 = 1080 > the cliff
    assert q is not None and q.input_cost == D(1080) * D("2.5") / 1_000_000


# --- breakers and wrap-up through the loop ---------------------------------------------


def test_loop_breaker_trips_and_the_run_ends_with_a_fallback_summary(tmp_path):
    model = ScriptedModel(
        replies=[bash("ls")]
    )  # the same action forever, and it ignores the wrap-up
    result = run(agent(model, tmp_path, Limits(max_steps=30)))
    assert result.status == "budget_exhausted" and result.stop_reason == "loop"
    trips = [t for e in result.ledger for t in e.breakers]
    assert (
        trips[0]["reason"] == "loop" and trips[0]["action"] == "wrap_up" and trips[0]["step"] == 4
    )
    assert result.steps == 4 + 2  # the loop, then at most wrapup_steps calls
    assert "wrap_up" in {m.kind for m in model.requests[-1].messages}
    assert result.summary.startswith("Stopped before the task was finished (loop")
    assert (
        "DONE: 6 step(s)" in result.summary
        and "REMAINING" in result.summary
        and "STATE" in result.summary
    )


def test_wrap_up_summary_from_the_model_is_kept(tmp_path):
    def reply(request):
        if any(m.kind == "wrap_up" for m in request.messages):
            return call(
                "submit", {"summary": "DONE: wrote a.txt. REMAINING: b.txt. STATE: a.txt exists."}
            )
        return bash(f"echo {len(request.messages)} > a.txt")

    result = run(agent(ScriptedModel(replies=[reply]), tmp_path, Limits(max_steps=10)))
    assert result.status == "budget_exhausted" and result.stop_reason == "max_steps"
    assert result.summary == "DONE: wrote a.txt. REMAINING: b.txt. STATE: a.txt exists."
    assert result.steps == 9  # wrap-up at 80 % of 10 steps, answered in one step


def test_consecutive_tool_errors_trip(tmp_path):
    model = ScriptedModel(replies=[call("bash", '{"command": ', i) for i in range(10)])
    result = run(agent(model, tmp_path, Limits(max_steps=20, guard=GuardConfig(max_tool_errors=3))))
    assert (
        result.stop_reason == "tool_errors"
        and result.ledger[2].breakers[0]["reason"] == "tool_errors"
    )


def test_no_progress_trips_when_the_workspace_does_not_change(tmp_path):
    model = ScriptedModel(
        replies=[lambda r: bash(f"echo {len(r.messages)}")]
    )  # distinct, but changes nothing
    result = run(agent(model, tmp_path, Limits(max_steps=20, guard=GuardConfig(no_change_steps=3))))
    assert (
        result.stop_reason == "no_progress"
        and result.ledger[2].breakers[0]["reason"] == "no_progress"
    )
    model = ScriptedModel(
        replies=[lambda r: bash(f"echo {len(r.messages)} >> log")]
    )  # changes it every step
    result = run(agent(model, tmp_path, Limits(max_steps=8, guard=GuardConfig(no_change_steps=3))))
    assert result.stop_reason == "max_steps"


def test_cost_anomaly_trips_on_a_spike_but_not_on_steady_steps(tmp_path):
    steady = [lambda r: bash(f"echo {len(r.messages)} >> log")]
    config = GuardConfig(anomaly_factor=4)
    task = "Do the task. " * 400
    spiky = ScriptedModel(
        replies=steady, cached_share=0.95, output_tokens=1, misses={8}
    )  # a cache miss at call 8
    result = run(agent(spiky, tmp_path, Limits(max_steps=20, guard=config)), task)
    assert result.stop_reason == "cost_anomaly"
    assert result.ledger[7].breakers[0]["reason"] == "cost_anomaly"
    steady_model = ScriptedModel(replies=steady, cached_share=0.95, output_tokens=1)
    result = run(agent(steady_model, tmp_path, Limits(max_steps=12, guard=config)), task)
    assert result.stop_reason == "max_steps"


def test_a_call_billed_beyond_its_worst_case_is_recorded(tmp_path):
    # A provider counting 200,000 more prompt tokens than we did breaks the estimate's
    # assumption; the spend happened, so it is on the ledger, never hidden.
    steady = [lambda r: bash(f"echo {len(r.messages)} >> log")]
    result = run(
        agent(ScriptedModel(replies=steady, spikes={3: 200_000}), tmp_path, Limits(max_steps=6))
    )
    trips = result.ledger[2].breakers
    assert trips[0]["reason"] == "reservation_overrun" and trips[0]["action"] == "record"


def test_token_limit_is_never_exceeded(tmp_path):
    model = ScriptedModel(
        replies=[lambda r: bash(f"echo {len(r.messages)} >> log")], output_tokens=300
    )
    result = run(
        agent(model, tmp_path, Limits(max_steps=100, guard=GuardConfig(max_tokens=40_000)))
    )
    used = result.usage.input_tokens + result.usage.output_tokens
    assert result.stop_reason == "max_tokens" and used <= 40_000 and result.summary


def test_cost_cap_run_ends_budget_exhausted_within_the_cap(tmp_path):
    model = ScriptedModel(
        replies=[lambda r: bash(f"echo {len(r.messages)} >> log")], output_tokens=500
    )
    result = run(agent(model, tmp_path, Limits(max_steps=200, max_cost=D("0.2"))))
    assert result.status == "budget_exhausted" and result.stop_reason == "max_cost"
    assert result.cost_usd <= D("0.2") and result.summary
    assert result.ledger[-1].breakers or any(e.breakers for e in result.ledger)


def test_wall_time_soft_threshold_then_hard_stop():
    now = [0.0]
    guard = Guard(Budget(None), GuardConfig(max_wall_s=100), max_steps=50, clock=lambda: now[0])
    assert guard.begin_step(1).go and guard.working
    now[0] = 81.0
    gate = guard.begin_step(2)
    assert gate.go and gate.instruction is not None and guard.stop_reason == "max_wall_time"
    now[0] = 101.0
    assert not guard.begin_step(3).go and guard.stopped


def test_escalation_is_offered_before_wrapping_up():
    offered = []
    guard = Guard(
        Budget(None),
        GuardConfig(loop_repeats=2),
        escalate=lambda t: offered.append(t.reason) or True,
    )
    same = StepRecord(1, D("0.01"), (ToolCallRecord("bash", "{}", False),))
    for step in (1, 2):
        guard.begin_step(step)
        guard.after_step(StepRecord(step, same.cost, same.calls), 100)
    assert offered == ["loop"] and guard.working and guard.trips[0].action == "escalate"


def test_per_agent_attribution_sums_each_subtree():
    entries = [
        {"agent": "main", "usage": {"input_tokens": 10}, "cost_usd": "1"},
        {"agent": "main/sub-1", "usage": {"input_tokens": 5}, "cost_usd": "0.5"},
        {"agent": "main/sub-1/sub-1", "usage": {}, "cost_usd": "0.25"},
        {"agent": "main", "usage": {}, "cost_usd": "1", "compaction": {"cost_usd": "0.1"}},
    ]
    rows = {r["agent"]: r for r in per_agent(entries)}
    assert rows["main"]["cost_usd"] == "2.1" and rows["main"]["subtree_cost_usd"] == "2.85"
    assert (
        rows["main/sub-1"]["parent"] == "main" and rows["main/sub-1"]["subtree_cost_usd"] == "0.75"
    )


def test_per_agent_reads_ledger_entries_as_records_and_as_json_alike():
    from stayer.ledger import LedgerEntry
    from stayer.records import from_json, to_json

    docs = [
        {
            "agent": "main",
            "step": 1,
            "model": "m",
            "usage": {"input_tokens": 7},
            "cost_usd": "0.10",
        },
        {"agent": "main/sub-1", "step": 1, "model": "m", "usage": {}, "cost_usd": "0.05"},
        {"agent": "main", "step": 2, "model": "m", "usage": {}, "cost_usd": "unknown"},
    ]
    entries = from_json(docs, list[LedgerEntry])
    rows = per_agent(entries)
    assert to_json(rows) == to_json(per_agent(to_json(entries)))
    main, sub = rows
    assert (main.agent, main.steps, main.input_tokens, main.cost) == ("main", 2, 7, "unknown")
    assert (sub.parent, sub.cost, sub.subtree_cost) == ("main", "0.05", "0.05")


def test_memory_store_is_isolated_per_budget():
    store = MemoryBudgetStore()
    a, b = Budget(D("1"), store=store, name="a"), Budget(D("1"), store=store, name="b")
    assert a.reserve(D("1")) is not None and b.reserve(D("1")) is not None

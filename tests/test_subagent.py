"""The `subagent` tool: a child agent with a fresh context and a carved budget; the tree and
its costs in the ledger; over-asking is a tool error the model sees."""

from __future__ import annotations

import asyncio
from decimal import Decimal

from stayer.agent import Agent, AgentSettings, Hooks, Limits
from stayer.delegation import ChildAgents, ChildSettings
from stayer.events import event_record
from stayer.guard.attribution import per_agent
from stayer.guard.budget import Budget
from stayer.models.scripted import COUNTER, Prices, ScriptedModel, bash, call, rates, text
from stayer.sandbox.local import LocalSandbox
from stayer.tools import default_tools
from stayer.tools.base import ToolContext

D = Decimal
PRICES = Prices(
    {"m-strong": rates("3", "0.3", "3.75", "15"), "m-cheap": rates("1", "0.1", "1.25", "5")}
)


SIX_STEPS = ChildSettings(max_steps=6)


def parent_with_children(
    tmp_path, parent_model, child_model, limits, budget=None, settings=SIX_STEPS
):
    ctx = ToolContext(sandbox=LocalSandbox(tmp_path), workspace=str(tmp_path))
    parent = Agent(
        parent_model,
        default_tools(COUNTER.counter),
        ctx,
        AgentSettings(PRICES, COUNTER, limits, budget=budget),
    )
    children = ChildAgents(parent, child_model, lambda: default_tools(COUNTER.counter), settings)
    parent.add_tool(children.tool())
    return parent


def test_child_runs_with_a_fresh_context_and_its_cost_rolls_up(tmp_path):
    parent_model = ScriptedModel(
        replies=[
            call("subagent", {"task": "Write the word done to sub.txt", "budget_usd": 0.05}, 1),
            call("submit", {"summary": "delegated"}, 2),
        ]
    )
    child_model = ScriptedModel(
        "m-cheap",
        [bash("echo done > sub.txt", 1), call("submit", {"summary": "sub.txt written"}, 2)],
    )
    budget = Budget(D("1"))
    parent = parent_with_children(tmp_path, parent_model, child_model, Limits(max_steps=10), budget)
    result = asyncio.run(parent.run("Parent task", "run-1"))

    assert result.status == "submitted" and (tmp_path / "sub.txt").read_text() == "done\n"
    # The child saw only its subtask; the parent saw the child's concise result.
    first_child_request = child_model.requests[0]
    assert [m.content for m in first_child_request.messages] == ["Write the word done to sub.txt"]
    tool_reply = parent_model.requests[1].messages[-1]
    assert tool_reply.role == "tool" and not tool_reply.is_error
    assert (
        tool_reply.content.startswith("sub-agent main/sub-1: submitted after 2 step(s)")
        and "sub.txt written" in tool_reply.content
    )
    # The tree and the money: entries per agent, totals roll up, the budget agrees.
    agents = [e.agent for e in result.ledger]
    assert agents.count("main/sub-1") == 2 and agents.count("main") == 2
    assert result.cost_usd == sum(e.cost.total for e in result.ledger) == budget.spent
    rows = {r["agent"]: r for r in per_agent(e.to_dict() for e in result.ledger)}
    child_cost = sum(e.cost.total for e in result.ledger if e.agent == "main/sub-1")
    assert (
        D(rows["main/sub-1"]["cost_usd"]) == child_cost and rows["main/sub-1"]["parent"] == "main"
    )
    assert D(rows["main"]["subtree_cost_usd"]) == result.cost_usd


def test_asking_for_more_than_is_left_is_a_tool_error_the_model_sees(tmp_path):
    parent_model = ScriptedModel(
        replies=[
            call("subagent", {"task": "Do a big part", "budget_usd": 5}, 1),
            call("submit", {"summary": "gave up on delegating"}, 2),
        ]
    )
    child_model = ScriptedModel("m-cheap", [text("never called")])
    parent = parent_with_children(
        tmp_path, parent_model, child_model, Limits(max_steps=10, max_cost=D("0.5"))
    )
    result = asyncio.run(parent.run("Parent task", "run-1"))
    reply = parent_model.requests[1].messages[-1]
    assert (
        reply.is_error
        and "asked for $5 but this agent has $" in reply.content
        and "left to delegate" in reply.content
    )
    assert not child_model.requests and result.status == "submitted" and result.cost_usd <= D("0.5")


def test_a_child_that_runs_out_of_its_slice_wraps_up_within_it(tmp_path):
    parent_model = ScriptedModel(
        replies=[
            call("subagent", {"task": "Keep working", "budget_usd": 0.01}, 1),
            call("submit", {"summary": "ok"}, 2),
        ]
    )
    child_model = ScriptedModel(
        "m-cheap", [lambda r: bash(f"echo {len(r.messages)} >> log")], output_tokens=400
    )
    parent = parent_with_children(
        tmp_path,
        parent_model,
        child_model,
        Limits(max_steps=10, max_cost=D("1")),
        settings=ChildSettings(max_steps=50),
    )
    result = asyncio.run(parent.run("Parent task", "run-1"))
    child_entries = [e for e in result.ledger if e.agent == "main/sub-1"]
    child_cost = sum(e.cost.total for e in child_entries)
    assert 0 < child_cost <= D("0.01")
    assert any(t["reason"] == "max_cost" for e in child_entries for t in e.breakers)
    reply = parent_model.requests[1].messages[-1].content
    assert "budget_exhausted" in reply and "Stopped before the task was finished" in reply


def test_default_share_and_depth_limit(tmp_path):
    parent_model = ScriptedModel(
        replies=[call("subagent", {"task": "part"}, 1), call("submit", {}, 2)]
    )
    child_model = ScriptedModel(
        "m-cheap", [call("submit", {"summary": "part done, nothing else"}, 1)]
    )
    budget = Budget(D("1"))
    parent = parent_with_children(
        tmp_path,
        parent_model,
        child_model,
        Limits(max_steps=5),
        budget,
        ChildSettings(budget_fraction=0.1),
    )
    asyncio.run(parent.run("Parent task", "run-1"))
    child_tools = {t.name for t in child_model.requests[0].tools}
    assert "subagent" not in child_tools and "bash" in child_tools  # depth 1: no grandchildren
    events = []
    parent2 = parent_with_children(
        tmp_path,
        ScriptedModel(replies=[call("subagent", {"task": "part"}, 1), call("submit", {}, 2)]),
        child_model,
        Limits(max_steps=5),
        Budget(D("1")),
        ChildSettings(budget_fraction=0.1),
    )
    parent2.observers.append(Hooks(event=lambda e: events.append(event_record(e))))
    result = asyncio.run(parent2.run("Parent task", "run-2"))
    started = next(p for k, p in events if k == "subagent_started")
    # A tenth of what the parent could delegate: its budget less the wrap-up reserve (20 %)
    # less what its first call (the one that asked) cost.
    first = next(e for e in result.ledger if e.agent == "main").cost.total
    assert started["parent"] == "main" and D(started["budget_usd"]) == (
        (D("0.8") - first) / 10
    ).quantize(D("1e-9"))

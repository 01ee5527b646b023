"""Child agents for the ``subagent`` tool: the parent–child tree and its money.

A child is a full ``Agent`` with a fresh context, its own tools (the run's MCP tools too,
through a view of its own: ``mcp``), its model (the router's
``subagent`` role) and a budget *carved* from the parent's working budget: the slice is
held in the parent for the child's whole run, so neither can overspend the other, and
when the child ends its real spend is settled into the parent (the roll-up). Its ledger
entries carry its path in the tree (``main/sub-1``, ``main/sub-1/sub-1``) and are adopted
into the parent's result, so every dollar is attributable to the agent that spent it.

This module sits beside ``agent`` (it builds agents), above the tool that calls it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from decimal import Decimal

from stayer.agent import Agent, AgentSettings, Observer, ToolUpdates
from stayer.events import Event, SubagentFinished, SubagentStarted
from stayer.models.base import Model
from stayer.tools.base import Tool
from stayer.tools.subagent import DelegationRefused, SubagentTool, Subtask, SubtaskOutcome


class _Events(Observer):
    """A child's observer: its events go to the parent's observers."""

    def __init__(self, parent: Agent) -> None:
        self.parent = parent

    def on_event(self, event: Event) -> None:
        self.parent.emit(event)


@dataclass(frozen=True)
class ChildSettings:
    max_steps: int = 20
    budget_fraction: float = 0.25  # of the parent's delegable budget, when none is asked
    max_depth: int = 1  # 1: children cannot delegate further


class ChildAgents:
    """The ``Delegator`` behind a parent's ``subagent`` tool."""

    def __init__(
        self,
        parent: Agent,
        model: Model,
        tools: Callable[[], list[Tool]],
        settings: ChildSettings = ChildSettings(),
        depth: int = 1,
        mcp: Callable[[], tuple[list[Tool], ToolUpdates] | None] = lambda: None,
    ) -> None:
        self.parent = parent
        self.model = model
        self.tools = tools
        self.settings = settings
        self.depth = depth
        self.mcp = mcp  # each child's MCP tools and its view of their changes (the run's)
        self.spawned = 0

    def tool(self) -> SubagentTool:
        return SubagentTool(self)

    async def delegate(self, subtask: Subtask) -> SubtaskOutcome:
        parent = self.parent
        guard = parent.guard
        if guard is None or not guard.working:
            raise DelegationRefused(
                "the run is wrapping up; finish and submit instead of delegating"
            )
        left = guard.delegable
        amount = subtask.budget_usd
        if amount is not None and left is not None and amount > left:
            raise DelegationRefused(
                f"asked for ${amount} but this agent has ${left:.6f} left to delegate; ask for at most that"
            )
        if amount is None and left is not None:
            amount = (left * Decimal(str(self.settings.budget_fraction))).quantize(Decimal("1e-9"))
        self.spawned += 1
        path = f"{parent.path}/sub-{self.spawned}"
        budget = guard.budget.carve(amount, path.rpartition("/")[2])
        if budget is None:
            raise DelegationRefused(f"the budget cannot spare ${amount} now; ask for less")
        steps = min(subtask.max_steps or self.settings.max_steps, self.settings.max_steps)
        # A fresh copy of a dataclass policy (its state is the child's own), else none.
        policy = replace(parent.policy) if hasattr(parent.policy, "__dataclass_fields__") else None  # type: ignore[type-var]
        mcp = self.mcp()
        tools, updates = self.tools() + (mcp[0] if mcp else []), mcp[1] if mcp else None
        settings = AgentSettings(
            parent.prices,
            parent.counter,
            replace(parent.limits, max_steps=steps, max_cost=amount),
            policy=policy,
            summarizer=parent.summarizer,  # compacts as its parent does (a model-written summary is billed)
            budget=budget,
            path=path,
            probe=parent.probe,  # the parent's probe and clock are the journaled ones
            clock=parent.clock,
            tool_updates=updates,
        )
        # The child's events are the parent's; its steps and messages are its own.
        child = Agent(self.model, tools, parent.tool_context, settings, [_Events(parent)])
        if self.depth < self.settings.max_depth:
            child.add_tool(
                ChildAgents(
                    child, self.model, self.tools, self.settings, self.depth + 1, self.mcp
                ).tool()
            )
        parent.emit(
            SubagentStarted(
                agent=path,
                parent=parent.path,
                task=subtask.task,
                budget_usd=None if amount is None else str(amount),
                max_steps=steps,
            )
        )
        try:
            result = await child.run(subtask.task, f"{parent.run_id}/{path}")
        finally:
            budget.close()
        parent.child_finished(result)
        cost = result.cost_usd
        parent.emit(
            SubagentFinished(
                agent=path,
                status=result.status,
                steps=result.steps,
                cost_usd=None if cost is None else str(cost),
            )
        )
        return SubtaskOutcome(
            path, result.status, result.steps, cost, result.summary or "(no summary)"
        )

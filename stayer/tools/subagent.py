"""The ``subagent`` tool: delegate a subtask to a child agent with a fresh context.

The child gets its own context (only the subtask, not the parent's history), its own tools
and model, and a budget carved from what its parent has left; it returns a concise result
(its status, cost and summary). Delegation keeps the parent's context small and lets a
cheaper model do bounded work.

The tool does not build agents itself (tools sit below the agent loop); a ``Delegator``
does (``stayer.delegation``). A request the parent cannot fund — more budget than it has
left to give — comes back as a tool error the model reads and can correct, never as a
silent overspend.
"""

from __future__ import annotations

from dataclasses import dataclass
from decimal import Decimal
from typing import Protocol

import msgspec

from stayer.messages import ToolSpec
from stayer.tools.base import ToolContext, ToolResult, TypedTool

#: The result the parent sees is cut to this many characters: concise by construction.
MAX_RESULT_CHARS = 2000


@dataclass(frozen=True)
class Subtask:
    task: str
    budget_usd: Decimal | None = None  # None: the delegator's default share
    max_steps: int | None = None


@dataclass(frozen=True)
class SubtaskOutcome:
    agent: str  # the child's path in the agent tree, e.g. main/sub-1
    status: str
    steps: int
    cost_usd: Decimal | None
    summary: str


class DelegationRefused(Exception):
    """The subtask cannot be funded or run; the message is shown to the model."""


class Delegator(Protocol):
    async def delegate(self, subtask: Subtask) -> SubtaskOutcome: ...


class SubagentArgs(msgspec.Struct, kw_only=True):
    task: str
    budget_usd: int | float | None = None  # as the model wrote it: an error quotes it
    max_steps: int | None = None


class SubagentTool(TypedTool[SubagentArgs]):
    spec = ToolSpec(
        name="subagent",
        description=(
            "Delegate a self-contained subtask to a sub-agent with a fresh context and its own "
            "tools, working in the same /app workspace. Describe the subtask completely: the "
            "sub-agent sees nothing of this conversation. It returns its status, cost and a "
            "short summary. Its budget is taken from yours; asking for more than you have "
            "left is refused."
        ),
        parameters={
            "type": "object",
            "properties": {
                "task": {"type": "string", "description": "The subtask, fully specified."},
                "budget_usd": {
                    "type": "number",
                    "description": "Most the sub-agent may spend, in USD (default: a share of what you have left).",
                },
                "max_steps": {
                    "type": "integer",
                    "minimum": 1,
                    "description": "Most model calls it may make.",
                },
            },
            "required": ["task"],
            "additionalProperties": False,
        },
    )

    def __init__(self, delegator: Delegator) -> None:
        self.delegator = delegator

    async def run(self, args: SubagentArgs, ctx: ToolContext) -> ToolResult:
        task = args.task.strip()
        if not task:
            return ToolResult("subagent: `task` is empty; describe the subtask", is_error=True)
        budget = None if args.budget_usd is None else Decimal(str(args.budget_usd))
        if budget is not None and (not budget.is_finite() or budget <= 0):
            return ToolResult(
                f"subagent: budget_usd must be a positive amount, got {args.budget_usd!r}",
                is_error=True,
            )
        try:
            out = await self.delegator.delegate(Subtask(task, budget, args.max_steps))
        except DelegationRefused as e:
            return ToolResult(f"subagent: {e}", is_error=True)
        cost = "unknown" if out.cost_usd is None else f"${out.cost_usd:.6f}"
        text = f"sub-agent {out.agent}: {out.status} after {out.steps} step(s), cost {cost}.\n{out.summary.strip()}"
        if len(text) > MAX_RESULT_CHARS:
            text = text[: MAX_RESULT_CHARS - 20].rstrip() + "\n[result cut]"
        return ToolResult(text, kind="result")

"""The ledger: one entry per model call of a run, and the run's result. These are the one
shape of a step that the journal stores, reports total and ``--json`` prints; their JSON
field names are a contract.

``LedgerEntry`` is a step the loop made; ``lost_entry`` is an attempt lost in flight at a
crash (billed by the provider, its reply never seen), shaped alike so that totals and
reports treat both the same way.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from stayer.guard.breakers import ToolCallRecord
from stayer.money import Usd
from stayer.pricing import Cost
from stayer.tokens import PromptEstimate
from stayer.usage import Usage


@dataclass
class LedgerEntry:
    step: int
    model: str
    usage: Usage
    cost: Cost
    context_tokens: int
    latency_s: float
    tool_calls: list[dict[str, Any]]  # id, name, is_error, exit_code
    cache_break: dict[str, Any] | None = None
    compaction: dict[str, Any] | None = None
    agent: str = "main"  # the agent's path in the tree: main, main/sub-1, ...
    breakers: list[dict[str, Any]] = field(default_factory=list)  # trips decided at this step
    route: dict[str, Any] | None = None  # a model switch, or a switch weighed and declined
    # What the budget expected the provider to count for this prompt (``tokens``) and the
    # bound it reserved for (``upper``); the usage's input_tokens is what it did count.
    prompt_estimate: PromptEstimate | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "agent": self.agent,
            "step": self.step,
            "model": self.model,
            "usage": self.usage.to_dict(),
            "cost_usd": self.cost.to_json(),
            "cache_hit_ratio": round(self.usage.cache_hit_ratio, 4),
            "context_tokens": self.context_tokens,
            "latency_s": round(self.latency_s, 4),
            "tool_calls": self.tool_calls,
            # Failed as the breakers count it: an error, or a command that exited non-zero.
            "tool_errors": sum(
                1
                for c in self.tool_calls
                if ToolCallRecord(c["name"], "", c["is_error"], c.get("exit_code")).failed
            ),
            "cache_break": self.cache_break,
            "compaction": self.compaction,
            "breakers": self.breakers,
            "route": self.route,
            "prompt_estimate": None
            if self.prompt_estimate is None
            else {"tokens": self.prompt_estimate.tokens, "upper": self.prompt_estimate.upper},
        }


def lost_entry(step: int, model: str, usage: Usage, cost_usd: str) -> dict[str, Any]:
    """The ledger entry (``kind: lost_in_flight``) of a call attempt lost at a crash, whose
    usage and cost are estimated as the re-issued call's."""
    return {
        "step": step,
        "kind": "lost_in_flight",
        "model": model,
        "usage": usage.to_dict(),
        "cost_usd": cost_usd,
        "estimated": True,
        "cache_hit_ratio": round(usage.cache_hit_ratio, 4),
        "context_tokens": None,
        "latency_s": None,
        "tool_calls": [],
        "tool_errors": 0,
        "cache_break": None,
    }


@dataclass
class RunResult:
    status: str  # running; then submitted, budget_exhausted, error (``stayer.errors.RunEnded``)
    steps: int = 0
    usage: Usage = field(default_factory=Usage)
    cost_usd: Decimal | None = Decimal(0)  # None: some step's price is unknown
    ledger: list[LedgerEntry] = field(default_factory=list)
    summary: str = ""
    error: str | None = None
    stop_reason: str = ""
    peak_context_tokens: int = 0
    breakers: list[dict[str, Any]] = field(default_factory=list)

    def add_cost(self, amount: Decimal | None) -> None:
        """Unknown stays unknown: one unpriced call makes the total unknown, never 0."""
        self.cost_usd = (Usd(self.cost_usd) + amount).amount

    def adopt(self, child: RunResult) -> None:
        """Roll a sub-agent's usage, cost and ledger (entries keep its path) into this run."""
        self.usage += child.usage
        self.add_cost(child.cost_usd)
        self.ledger.extend(child.ledger)

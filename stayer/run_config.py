"""A run's configuration: what ``stayer run`` was asked to do, as the journal keeps it.

Apart from ``stayer.run`` (which imports the agent and everything it runs with), so that an
evaluation that only re-renders its report can name its configurations without them.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from decimal import Decimal
from typing import Any


@dataclass(frozen=True)
class RunConfig:
    task_dir: str
    model: str
    max_steps: int = 50
    max_cost: Decimal | None = None
    run_id: str | None = None
    base_url: str | None = None
    sim_policy: str | None = None
    sim_latency: float = 0.0
    sandbox: str | None = None  # None: task.toml's, else its image's (Dockerfile), else bwrap
    output_token_budget: int = 4096
    command_timeout: float = 120.0
    service_tier: str | None = None
    policy: str = "auto"
    max_context: int | None = None
    config_file: str | None = None  # stayer.toml: routing, sub-agents, breakers
    team_file: str | None = None  # team.toml: a team of agents instead of one (stayer.teams)
    team: dict[str, Any] | None = None  # or the same inline (the runtime's ``team`` field)
    mcp_servers: dict[str, Any] | None = None  # [mcp.servers] inline (the runtime's field)
    mcp_tools: str = "auto"  # eager | lazy | auto (stayer.mcp.lazy)
    # Per-run sandbox limits; None keeps the task's (task.toml [environment]).
    memory_mb: int | None = None
    storage_mb: int | None = None
    max_processes: int | None = None

    def sandbox_overrides(self) -> dict[str, Any]:
        return {
            "memory_mb": self.memory_mb,
            "storage_mb": self.storage_mb,
            "max_processes": self.max_processes,
        }

    def to_record(self) -> dict[str, Any]:
        """JSON-ready, for the journal (a resume rebuilds the run from it)."""
        d = asdict(self)
        d["max_cost"] = None if self.max_cost is None else str(self.max_cost)
        return d

    @classmethod
    def from_record(cls, d: dict[str, Any]) -> RunConfig:
        known = {f.name for f in fields(cls)}
        kw = {k: v for k, v in d.items() if k in known}
        if kw.get("max_cost") is not None:
            kw["max_cost"] = Decimal(kw["max_cost"])
        return cls(**kw)

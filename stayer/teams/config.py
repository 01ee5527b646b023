"""``team.toml``: who is on the team, what each may use and spend, and who may talk to whom.

Sections: ``entry`` (the agent that gets the task); ``[agents.NAME]`` with ``model``,
``system_prompt``, ``tools``, ``budget_share``, ``max_steps``, ``talks_to``; ``[handoff]``
with ``relevance``, ``rediscovery_steps``, ``expected_steps`` (docs/teams.md shows the
file). Validated whole before anything runs: one line naming the file and field, exit 2.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Literal, get_args

from pydantic import Field

from stayer.errors import ConfigError
from stayer.settings import Fraction, Settings, StepCount, Steps, check_file, read_toml

#: The built-in tools an agent may be given (``submit`` is always there: it ends a thread).
BuiltinTool = Literal["bash", "read_file", "write_file", "edit_file", "memory"]
BUILTIN_TOOLS: tuple[BuiltinTool, ...] = get_args(BuiltinTool)
Name = Annotated[str, Field(pattern=r"^[a-z][a-z0-9_-]{0,31}$")]


class AgentSpec(Settings):
    model: str = Field(min_length=1)
    system_prompt: str | None = None
    tools: list[BuiltinTool] = Field(default_factory=lambda: list(BUILTIN_TOOLS))
    budget_share: Fraction | None = None  # None: an even split of what the others leave
    max_steps: Steps = 20
    talks_to: list[Name] = Field(default_factory=list)


class HandoffSpec(Settings):
    relevance: Fraction = 0.3
    rediscovery_steps: StepCount = 5
    expected_steps: Steps = 10


class TeamSpec(Settings):
    entry: Name
    agents: dict[Name, AgentSpec] = Field(min_length=1)
    handoff: HandoffSpec = HandoffSpec()


def load_team(path: str | Path) -> TeamSpec:
    """``path`` as a team; ConfigError (one line naming the file and field) otherwise."""
    file = Path(path)
    if not file.is_file():
        raise ConfigError(f"--team {file}: no such file")
    return team_from(read_toml(file, "--team "), str(file))


def team_from(data: Mapping[str, Any], source: str) -> TeamSpec:
    """``data`` (a parsed team.toml) as a team; ConfigError naming ``source`` and the field."""
    team = check_file(TeamSpec, data, source)
    problem = _inconsistency(team)
    if problem is not None:
        raise ConfigError(f"{source}: {problem}")
    return team


def _inconsistency(team: TeamSpec) -> str | None:
    """What the fields say together that none says alone (``field: why``), or None."""
    if team.entry not in team.agents:
        return f"entry: {team.entry!r} is not one of the agents ({', '.join(team.agents)})"
    for name, a in team.agents.items():
        for other in a.talks_to:
            if other not in team.agents or other == name:
                return f"agents.{name}.talks_to: {other!r} is not another agent of the team"
    given = sum(a.budget_share or 0 for a in team.agents.values())
    if given > 1 + 1e-9:
        return (
            f"agents: the budget_share values add up to {given:g}, more than the whole budget (1)"
        )
    if given >= 1 - 1e-9 and any(a.budget_share is None for a in team.agents.values()):
        return "agents: the budget_share values given leave nothing for the agents without one"
    return None


def shares(team: TeamSpec) -> dict[str, float]:
    """Each agent's share of the team's budget: its own, or an even split of the rest."""
    given = sum(a.budget_share or 0 for a in team.agents.values())
    unset = [n for n, a in team.agents.items() if a.budget_share is None]
    rest = (1 - given) / len(unset) if unset else 0
    return {
        n: a.budget_share if a.budget_share is not None else rest for n, a in team.agents.items()
    }

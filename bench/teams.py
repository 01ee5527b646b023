"""A single agent against a team on one workload: what handing off with history costs.

    python bench/teams.py [--json] [--repeats N]

The workload has two phases: an exploration of ``EXPLORE`` steps (each reads an
observation of ``OBS`` tokens), then ``WORK`` steps of work (the same). Five ways serve it:

* ``single`` — one agent (claude-sonnet-4-5) does both phases in one context;
* ``team-full`` / ``team-summary`` / ``team-none`` — a coordinator (claude-sonnet-4-5)
  explores, then hands the work to a worker (claude-haiku-4-5) passing its whole history,
  a local summary of it, or the brief alone; the worker reports back and the coordinator
  submits;
* ``team-priced`` — the same, with the history left for stayer to choose by price
  (``stayer.teams.handoff``, the worker's expected steps = ``WORK``).

Every call goes through the offline provider simulator with each provider's caching
rules and is priced with genai-prices; the team runs on ``stayer.teams.Team`` (threads,
carved budgets, messages) with a no-op observation tool and no sandbox. The simulator has
no intelligence, so the worker does the same steps whatever history it is given: the
figures are what each form costs, not what it is worth (a brief-only worker may need more
steps in reality; ``rediscovery_steps`` in team.toml is that guess). Cost and steps are
deterministic; wall time is the min and median of ``--repeats`` interleaved runs.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from typing import Any

from _stdout import json_only  # bench/: --json prints one document on stdout

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from stayer.agent import Agent, AgentSettings, Limits  # noqa: E402
from stayer.context.policies import make_policy  # noqa: E402
from stayer.guard.budget import Budget  # noqa: E402
from stayer.ledger import RunResult  # noqa: E402
from stayer.models.base import Message, ModelRequest, ToolCall, ToolSpec  # noqa: E402
from stayer.models.sim import SimModel  # noqa: E402
from stayer.models.sim_policies import filler  # noqa: E402
from stayer.pricing import PriceBook  # noqa: E402
from stayer.teams.config import load_team  # noqa: E402
from stayer.teams.runner import Team, TeamServices  # noqa: E402
from stayer.tokens import MessageCounter, TiktokenCounter  # noqa: E402
from stayer.tools.base import ToolContext, ToolResult  # noqa: E402
from stayer.tools.submit import SubmitTool  # noqa: E402

EXPLORE, WORK, OBS, OUT = 12, 8, 1500, 120
LEAD, WORKER = "claude-sonnet-4-5", "claude-haiku-4-5"
VARIANTS = ["single", "team-full", "team-summary", "team-none", "team-priced"]


def _step(request: ModelRequest) -> int:
    return 1 + sum(1 for m in request.messages if m.role == "assistant")


def _call(step: int, name: str, **args: Any) -> Message:
    return Message(
        "assistant",
        filler(OUT, random.Random(step)),
        (ToolCall(f"c{step}", name, json.dumps(args)),),
    )


@dataclass
class Workload:
    history: str | None  # the coordinator's handoff choice; None: left to the price

    def next_message(self, request: ModelRequest) -> Message:
        step = _step(request)
        tools = {t.name for t in request.tools}
        task = next((m.content for m in request.messages if m.kind == "task"), "")
        if task.startswith("Handoff from "):  # the worker
            return (
                _call(step, "observe", n=step)
                if step <= WORK
                else _call(step, "submit", summary="work done")
            )
        if "handoff" not in tools:  # a single agent: both phases
            return (
                _call(step, "observe", n=step)
                if step <= EXPLORE + WORK
                else _call(step, "submit", summary="done")
            )
        if step <= EXPLORE:
            return _call(step, "observe", n=step)
        if step == EXPLORE + 1:
            args = {"to": "worker", "brief": "Do the work phase on what I explored."}
            return _call(
                step, "handoff", **args, **({"history": self.history} if self.history else {})
            )
        if any("[report worker#" in m.content for m in request.messages):
            return _call(step, "submit", summary="team done")
        return _call(step, "wait_for_message", **{"from": "worker", "timeout": 600})


class Observe:
    spec = ToolSpec(
        "observe", "An observation.", {"type": "object", "properties": {"n": {"type": "integer"}}}
    )

    async def __call__(self, args: dict[str, Any], ctx: ToolContext) -> ToolResult:
        return ToolResult(filler(OBS, random.Random(args.get("n", 0))))


TEAM = f"""
entry = "coordinator"
[agents.coordinator]
model = "sim:{LEAD}"
budget_share = 0.5
max_steps = 40
talks_to = ["worker"]
[agents.worker]
model = "sim:{WORKER}"
max_steps = 40
talks_to = ["coordinator"]
[handoff]
expected_steps = {WORK}
"""


async def run(
    variant: str, prices: PriceBook, counter: MessageCounter, team_file: Path
) -> tuple[RunResult, float]:
    history = {"team-full": "full", "team-summary": "summary", "team-none": "none"}.get(variant)
    ctx = ToolContext(sandbox=None, workspace="")  # type: ignore[arg-type]
    t0 = time.perf_counter()
    if variant == "single":
        model = SimModel(LEAD, Workload(None), counter)
        agent = Agent(
            model,
            [Observe(), SubmitTool()],
            ctx,
            AgentSettings(prices, counter, Limits(max_steps=60), policy=make_policy("none")),
        )
        result = await agent.run("Explore, then do the work.", "single")
    else:
        spec = load_team(team_file)
        models = {
            name: SimModel(a.model.removeprefix("sim:"), Workload(history), counter)
            for name, a in spec.agents.items()
        }
        services = TeamServices(
            prices=prices,
            counter=counter,
            tool_context=ctx,
            budget=Budget(None),
            limits=Limits(),
            models=models,  # type: ignore[arg-type]
            tools=lambda: [Observe(), SubmitTool()],
            policy=lambda: make_policy("none"),
        )
        result = await Team(spec, services).run("Explore, then do the work.", variant)
    return result, time.perf_counter() - t0


def handoff_of(result: RunResult) -> dict[str, Any] | None:
    return next(
        ((e.route or {}).get("handoff") for e in result.ledger if (e.route or {}).get("handoff")),
        None,
    )


async def main(repeats: int, as_json: bool) -> int:
    emit = json_only(as_json)
    prices, counter = PriceBook.load(), MessageCounter(TiktokenCounter())
    with tempfile.TemporaryDirectory() as tmp:
        team_file = Path(tmp) / "team.toml"
        team_file.write_text(TEAM)
        walls: dict[str, list[float]] = {v: [] for v in VARIANTS}
        results: dict[str, RunResult] = {}
        for _ in range(repeats):  # interleaved: each round runs every variant once
            for v in VARIANTS:
                results[v], wall = await run(v, prices, counter, team_file)
                walls[v].append(wall)
    rows = []
    for v in VARIANTS:
        r = results[v]
        per_agent: dict[str, Decimal] = {}
        for e in r.ledger:
            per_agent[e.agent] = per_agent.get(e.agent, Decimal(0)) + (e.cost.total or Decimal(0))
        quote = handoff_of(r)
        rows.append(
            {
                "variant": v,
                "status": r.status,
                "steps": r.steps,
                "cost_usd": str(r.cost_usd),
                "cost_by_agent_usd": {k: str(c) for k, c in sorted(per_agent.items())},
                "history_passed": quote["passed"] if quote else None,
                "handoff_quote_usd": quote["expected_cost_usd"] if quote else None,
                "wall_s_min": round(min(walls[v]), 4),
                "wall_s_median": round(statistics.median(walls[v]), 4),
            }
        )
    doc = {
        "bench": "teams",
        "workload": {
            "explore_steps": EXPLORE,
            "work_steps": WORK,
            "obs_tokens": OBS,
            "out_tokens": OUT,
            "lead": LEAD,
            "worker": WORKER,
        },
        "repeats": repeats,
        "rows": rows,
    }
    if as_json:
        emit(doc)
        return 0
    print(f"{'variant':14} {'steps':>5} {'cost USD':>10}  {'history':8} by agent")
    for row in rows:
        agents = ", ".join(f"{k} {Decimal(c):.4f}" for k, c in row["cost_by_agent_usd"].items())
        print(
            f"{row['variant']:14} {row['steps']:>5} {Decimal(row['cost_usd']):>10.4f}  {row['history_passed'] or '-':8} {agents}"
        )
    return 0


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--json", action="store_true", help="Print one JSON document of the figures.")
    ap.add_argument(
        "--repeats", type=int, default=3, help="Interleaved rounds (wall time min and median)."
    )
    args = ap.parse_args()
    sys.exit(asyncio.run(main(args.repeats, args.json)))

"""One task, one model, one run: workspace → agent → verifier → result (``stayer run``,
``stayer resume``, each eval trial and each run of the hosted service).

``execute`` runs a ``PreparedRun`` (``stayer.prepare``) and returns its ``--json``
document (also ``result.json`` in the run's directory; ``trajectory.jsonl`` holds every
message). The run is wired by observers (``stayer.agent.Observer``): the journal first,
then whoever runs it (``Controls.observers``: telemetry, the runtime), the trajectory and
the caller's step line. Every step is journaled, so ``execute`` can also continue a run
that was killed; it is the one place that enforces the task's agent time limit.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path
from typing import IO

import msgspec

from stayer.agent import (
    Agent,
    AgentSettings,
    Hooks,
    LedgerEntry,
    Limits,
    Observer,
    RunResult,
    ToolUpdates,
)
from stayer.context.summarizer import ModelSummarizer
from stayer.delegation import ChildAgents, ChildSettings
from stayer.eval.verify import Verdict, passes, verify
from stayer.events import Event, McpOffered
from stayer.guard.attribution import per_agent
from stayer.guard.breakers import GuardConfig, TreeFingerprint
from stayer.guard.budget import Budget
from stayer.journal import (
    JournaledModel,
    JournaledProbe,
    JournaledTool,
    ReplayingSandbox,
    RunJournal,
    lost_ledger_entries,
)
from stayer.journal.codec import MessageRecord
from stayer.ledger import (  # noqa: F401  (RunReport, TokenTotals: re-exported)
    BreakerTrip,
    RunReport,
    TokenTotals,
    VerifierReport,
    ledger_order,
)
from stayer.messages import Message
from stayer.models.base import Model
from stayer.models.sim import SimModel
from stayer.money import Usd
from stayer.prepare import (  # noqa: F401  (re-exported: a run's names in one place)
    McpTools,
    PreparedRun,
    RunSettings,
    build_model,
    check_model,
    check_policies,
    delete_run_dir,
    link_workspace,
    make_run_dir,
    mcp_offer,
    mcp_view,
    new_workspace,
    prepare,
    run_header,
    run_mcp,
    run_tools,
    run_workspace,
)
from stayer.records import Record, from_json, to_json
from stayer.sandbox import released
from stayer.teams.runner import Team, TeamServices
from stayer.tools.base import Tool, ToolContext


async def execute(
    prepared: PreparedRun,
    on_step: Callable[[LedgerEntry], None] | None = None,
    *,
    journal: RunJournal | None = None,
    controls: Controls | None = None,
) -> RunReport:
    """Run the agent on the task, verify, and return its ``RunReport``.

    With ``journal`` (``RunJournal.reopen``), continue that run instead: the workspace comes
    back from its latest snapshot and the loop replays the journal up to where it stopped.
    ``controls``: what the runtime adds (people in the loop, pausing at the cap, observers);
    ``on_step`` sees each finished step, after the journal and the observers."""
    try:
        return await _execute(prepared, on_step, journal, controls or Controls())
    finally:
        if prepared.close_store and prepared.store is not None:
            prepared.store.close()


async def _execute(
    p: PreparedRun,
    on_step: Callable[[LedgerEntry], None] | None,
    journal: RunJournal | None,
    controls: Controls,
) -> RunReport:
    journal = _journal(p) if journal is None else _reopened(p, journal)
    started = datetime.fromisoformat(journal.started)
    kind = p.task.kind(p.config.sandbox)  # prepare() resolved it already: the same kind
    limits = p.task.sandbox_limits(**p.config.sandbox_overrides())
    sandbox = ReplayingSandbox(p.task.make_sandbox(kind, journal.workspace, **limits), journal)
    # Rewritten from the start on resume: the replay emits every message again. The agent's
    # sandbox is gone, every process of it, when the loop ends (paused at its cap too), and
    # so before the verifier's sandbox starts.
    async with journal.leased(), released(sandbox), run_mcp(p, sandbox) as mcp:
        with (p.run_dir / "trajectory.jsonl").open("w") as trajectory:
            local = [_Trajectory(trajectory), Hooks(step=on_step)]
            wiring = Wiring(p, journal, controls, local, mcp)
            agent = wiring.agent(sandbox)
            result, cut_short = await _within_time_limit(agent, p, journal)
            journal.flush()
    # Always verified: the tests decide success, however and wherever the agent stopped.
    verdict = await verify(
        p.task, p.task.make_sandbox(kind, journal.workspace, allow_net=p.task.allow_internet)
    )
    extra = lost_ledger_entries(journal.lost) + cut_short
    report = result_document(p, result, verdict, started, extra)
    if p.mcp_servers:
        report.mcp_tools = wiring.mcp_mode
    if journal.unknown:
        report.outcome_unknown = list(journal.unknown)
    journal.finish(report)
    write_result(p.run_dir, report)
    return report


def _journal(p: PreparedRun) -> RunJournal:
    """A new run's journal, its directory and its workspace, materialised and snapshotted."""
    assert p.store is not None
    workspace = new_workspace()
    journal = RunJournal.create(
        p.store,
        p.run_id,
        run_header(p),
        workspace,
        p.prices,
        owner=p.lease_owner,
        ttl_s=p.lease_ttl_s,
    )
    make_run_dir(p.run_dir, exist_ok=False)
    link_workspace(p.run_dir, workspace)
    p.task.materialise(workspace, p.task.kind(p.config.sandbox))
    journal.take_snapshot(0)
    return journal


def _reopened(p: PreparedRun, journal: RunJournal) -> RunJournal:
    """A resumed run's journal, its workspace back from the latest snapshot."""
    make_run_dir(p.run_dir, exist_ok=True)
    kind = p.task.kind(p.config.sandbox)
    journal.restore_workspace(lambda ws: p.task.materialise(ws, kind))
    return journal


async def _within_time_limit(
    agent: Agent | Team, p: PreparedRun, journal: RunJournal
) -> tuple[RunResult, list[LedgerEntry]]:
    """The task's time limit for the agent, enforced here for `stayer run`, `resume` and
    every eval trial alike: at the limit the loop is cancelled wherever it is, which kills
    the command in flight and its sandbox."""
    limit = asyncio.timeout(p.task.agent_timeout_s)
    try:
        async with limit:
            return await agent.run(p.task.instruction, p.run_id), []
    except TimeoutError:
        if not limit.expired():
            raise
        return timed_out(agent, journal, p.task.agent_timeout_s)


class Journaling(Observer):
    """The journal, the first observer: a step is journaled before anyone is shown it."""

    def __init__(self, journal: RunJournal) -> None:
        self.journal = journal

    def on_step(self, entry: LedgerEntry) -> None:
        self.journal.on_step(entry)

    def on_event(self, event: Event) -> None:
        self.journal.on_event(event)


class _Trajectory(Observer):
    """``trajectory.jsonl``: every message, as it enters the context."""

    def __init__(self, file: IO[str]) -> None:
        self.file = file

    def on_message(self, message: Message) -> None:
        self.file.write(json.dumps(to_json(MessageRecord.of(message))) + "\n")
        self.file.flush()


@dataclass
class Wiring:
    """What a run's agent (or team) is built with: the run's observers (``controls``' and
    the run's own, ``local``) wrap its model and tools inside the journal, so they see live
    calls, never replayed ones; the journal observes first."""

    p: PreparedRun
    journal: RunJournal
    controls: Controls
    local: list[Observer]
    mcp: McpTools | None = None  # the run's MCP servers' tools (every agent's)
    mcp_mode: str = "eager"  # how they are offered (--mcp-tools, auto decided)

    @property
    def observers(self) -> list[Observer]:
        return [*self.controls.observers, *self.local]

    def model(self, m: Model) -> Model:
        for o in self.observers:
            m = o.model(m)
        return JournaledModel(m, self.journal)

    def wrap(self, ts: list[Tool]) -> list[Tool]:
        for o in self.observers:
            ts = o.tools(ts)
        return [JournaledTool(t, self.journal) for t in ts]

    def tools(self) -> list[Tool]:
        return self.wrap(run_tools(self.p.counter))

    def child_mcp(self) -> tuple[list[Tool], ToolUpdates] | None:
        """A sub-agent's MCP tools and its view of them (the run's servers, its mode)."""
        if self.mcp is None:
            return None
        view = mcp_view(self.mcp, self.mcp_mode, self.wrap)
        return self.wrap(view.offered()), view

    def offer_mcp(self) -> None:
        """How the MCP tools are offered (``mcp_offer``: ``mcp_mode``), told to the journal
        and the observers. Every agent of the run sees them so (``mcp_view``)."""
        if self.mcp is None:
            return
        self.mcp_mode = mcp_offer(self.p, self.mcp)
        if self.mcp.tools:
            event = McpOffered(mode=self.mcp_mode, tools=len(self.mcp.tools))
            for o in [Journaling(self.journal), *self.observers]:
                o.on_event(event)

    def agent(self, sandbox: ReplayingSandbox) -> Agent | Team:
        p, cfg, controls = self.p, self.p.config, self.controls
        tool_ctx = ToolContext(
            sandbox=sandbox,
            workspace=str(self.journal.workspace),
            output_token_budget=cfg.output_token_budget,
            command_timeout=cfg.command_timeout,
        )
        guard = p.routing.guard if p.routing else GuardConfig()
        limits = Limits(
            cfg.max_steps,
            cfg.max_cost,
            service_tier=cfg.service_tier,
            max_context=cfg.max_context,
            guard=guard.model_copy(update={"pause_at_cap": controls.pause_at_cap}),
        )
        budget = Budget(cfg.max_cost, top_up=controls.top_up(self.journal))
        self.offer_mcp()
        if p.team is not None:
            return self.team(tool_ctx, limits, budget)
        view = mcp_view(self.mcp, self.mcp_mode, self.wrap) if self.mcp is not None else None
        model = self.model(p.model)  # every call journaled, the summariser's included
        router = (
            p.routing.router(model, self.model, p.prices, cfg.service_tier) if p.routing else None
        )
        tools = self.wrap([*run_tools(p.counter), *(view.offered() if view else [])])
        settings = AgentSettings(
            p.prices,
            p.counter,
            limits,
            policy=p.policy,
            # A summarising policy with a real provider has the model write its summaries.
            summarizer=None
            if isinstance(p.model, SimModel)
            else ModelSummarizer(router.role("summariser") if router else model, p.prices),
            probe=JournaledProbe(TreeFingerprint(self.journal.workspace), self.journal),
            clock=self.journal.clock,
            router=router,
            inbox=controls.inbox.reader(self.journal) if controls.inbox else None,
            budget=budget,
            tool_updates=view,
        )
        gated = controls.gate(tools) if controls.gate else tools
        agent = Agent(model, gated, tool_ctx, settings, [Journaling(self.journal), *self.observers])
        if p.routing and router and p.routing.subagents:
            children = ChildAgents(
                agent,
                router.role("subagent"),
                self.tools,
                ChildSettings(**p.routing.subagents.model_dump()),
                mcp=self.child_mcp,
            )
            agent.add_tool(self.wrap([children.tool()])[0])
        return agent

    def team(self, tool_ctx: ToolContext, limits: Limits, budget: Budget) -> Team:
        """The run's team (``--team``): its threads journal themselves; the run's observers
        watch them as they would a single agent."""
        p, journal = self.p, self.journal
        assert p.team is not None
        workspace = Path(tool_ctx.workspace)
        services = TeamServices(
            prices=p.prices,
            counter=p.counter,
            tool_context=tool_ctx,
            budget=budget,
            limits=limits,
            models=p.team_models,
            tools=lambda: run_tools(p.counter),
            policy=p.new_policy,
            journal=journal,
            probe=lambda j: (
                JournaledProbe(TreeFingerprint(workspace), j) if j is not None else None
            ),
            observers=self.observers,
            mcp=self.mcp,
            mcp_mode=self.mcp_mode,
        )
        return Team(p.team, services)


@dataclass
class Controls:
    """What whoever runs the run (the CLI, the runtime) adds to it."""

    gate: Callable[[list[Tool]], list[Tool]] | None = None  # wraps the (journaled) tools
    inbox: Inbox | None = None  # what people say to the agent
    pause_at_cap: bool = False  # a call the cap cannot afford raises BudgetReached
    cap: Callable[[], Decimal | None] | None = None  # the run's cap now (raised while it paused)
    observers: list[Observer] = dataclasses.field(default_factory=list)

    def top_up(self, journal: RunJournal) -> Callable[[Decimal | None], Decimal | None] | None:
        """The budget's source of a raised cap, read through the journal at the point the
        run paused: a resumed run replays the raise where it happened."""
        if self.cap is None:
            return None
        source = self.cap

        def raised(current: Decimal | None) -> Decimal | None:
            def larger(value: str | None) -> bool:
                return value is not None and (current is None or Decimal(value) > current)

            def read() -> str | None:
                cap = source()
                return None if cap is None else str(cap)

            value = journal.read_outside(read, keep=larger)
            return None if value is None else Decimal(value)

        return raised


class InboxMessage(Record, kw_only=True):
    """A message a person sent a running agent: its number in the run (from 1) and text."""

    n: int
    content: str
    created_at: str | msgspec.UnsetType = msgspec.UNSET


class Inbox:
    """Messages people send a running agent (``fetch(after)``: those numbered after
    ``after``), delivered at the agent's next step. What each step received is journaled,
    so a resumed run replays the same messages at the same steps and then continues with
    the ones it has not seen."""

    def __init__(self, fetch: Callable[[int], list[InboxMessage]]) -> None:
        self.fetch = fetch

    def reader(self, journal: RunJournal) -> Callable[[], list[Message]]:
        seen = 0

        def read() -> list[Message]:
            nonlocal seen
            got = journal.read_outside(lambda: to_json(self.fetch(seen)))
            messages = from_json(got, list[InboxMessage])
            seen = max((m.n for m in messages), default=seen)
            return [Message("user", m.content, kind="person") for m in messages]

        return read


def timed_out(
    agent: Agent | Team, journal: RunJournal, limit_s: float
) -> tuple[RunResult, list[LedgerEntry]]:
    """The result of a run stopped by the task's agent time limit: its finished steps, and
    the steps the stop cut short (their model calls were billed; a team's threads journal
    their own calls, so each thread stopped in mid-step has one), as ``budget_exhausted``
    with ``stop_reason`` ``agent_timeout``."""
    result = agent.result or RunResult(status="budget_exhausted")
    journals: list[RunJournal]
    if isinstance(agent, Team):
        journals = [t.journal for t in agent.threads.values() if t.journal is not None]
    else:
        journals = [journal]
    cuts = [cut for j in journals if (cut := j.cut_short()) is not None]
    result.steps += len(cuts)  # a cut step is the one after its journal's last finished step
    detail = f"the task's agent time limit of {limit_s:g} s ran out during step {result.steps + (not cuts)}"
    result.status, result.stop_reason = "budget_exhausted", "agent_timeout"
    result.breakers.append(
        BreakerTrip(
            agent="main",
            reason="agent_timeout",
            detail=detail,
            step=result.steps,
            action="stop",
            soft=False,
        )
    )
    result.summary = (
        result.summary or f"Stopped: {detail}. The workspace holds the work done until then."
    )
    return result, cuts


def write_result(run_dir: Path, report: RunReport) -> None:
    """The run's ``result.json`` (``report.to_json()``, indented), replaced whole."""
    tmp = run_dir / "result.json.tmp"
    tmp.write_text(json.dumps(report.to_json(), indent=2))
    tmp.replace(run_dir / "result.json")


def status_of(result: RunResult, verdict: Verdict | None) -> str:
    """succeeded whenever the tests pass, whatever limit the agent reached on the way; else
    error when the tests could not judge (or the agent errored), budget_exhausted when a
    limit stopped the agent, failed otherwise. Why the agent stopped is ``stop_reason``."""
    if verdict is not None and passes(verdict.reward):
        return "succeeded"
    if verdict is not None and verdict.infrastructure:
        return "error"
    if result.status in ("error", "budget_exhausted"):
        return result.status
    return "failed"


def result_document(
    p: PreparedRun,
    result: RunResult,
    verdict: Verdict | None,
    started: datetime,
    lost: Sequence[LedgerEntry] = (),
) -> RunReport:
    """The run's report. ``lost`` are ledger entries the loop did not make:
    ``lost_in_flight`` (model calls in flight at a crash) and ``cut_short`` (the step a time
    limit stopped): billed, so they count in the ledger, the usage and the cost."""
    u = result.usage
    cost = Usd(result.cost_usd)
    for entry in lost:
        u += entry.usage
        cost += entry.cost.total
    ledger = sorted([*result.ledger, *lost], key=ledger_order)
    counter = p.counter.counter
    return RunReport(
        run_id=p.run_id,
        task=p.task.name,
        task_path=str(p.task.path),
        model=p.config.model,
        status=status_of(result, verdict),
        reward=verdict.reward if verdict else None,
        steps=result.steps,
        usage=TokenTotals.of(u),
        cost_usd=str(cost),
        stop_reason=result.stop_reason,
        stop_detail=stop_detail(result.stop_reason, result.breakers),
        policy=p.config.policy,
        peak_context_tokens=result.peak_context_tokens,
        compactions=sum(1 for e in result.ledger if e.compaction),
        summary=result.summary,
        breakers=list(result.breakers),
        agents=per_agent(ledger),
        error=result.error or (verdict.infrastructure if verdict else None),
        ledger=ledger,
        started=started.isoformat(),
        finished=datetime.now(UTC).isoformat(),
        run_dir=str(p.run_dir),
        tokenizer=getattr(counter, "encoding_name", None),
        rewards=verdict.rewards if verdict is not None else msgspec.UNSET,
        verifier=(verdict.report() if verdict is not None else msgspec.UNSET),
    )


def stop_detail(reason: str | None, breakers: list[BreakerTrip]) -> str | None:
    """Why the run stopped, in the words of the limit or breaker that stopped it (the last
    trip of the stop reason: the one that began the wrap-up, or that ended the run)."""
    trip = next((b for b in reversed(breakers) if b.reason == reason), None)
    return None if trip is None else trip.detail or None

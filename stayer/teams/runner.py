"""A team run: one thread per agent, all in one workspace, under one budget.

Each agent of ``team.toml`` is a thread: a full ``Agent`` with its own context, model,
tools (the run's MCP servers' too, through a view of its own), journal stream
(``ThreadJournal``) and a budget carved from the run's (its ``budget_share``, held for
its whole run: the cap is never overshot). The entry agent
starts with the task; any other starts at its first message, and reports its summary back
to that message's sender when it finishes. The run ends when the entry agent does; the
others stop at the end of their step, so every call billed is a step on the ledger.

Messages are appended at the receiver's next step, never before its cached prefix; what a
thread reads from the others goes through its journal, so a resume reads the same. Tools
that touch the workspace hold one lock. The run's observers see every thread
(``TeamServices.observers``). More: docs/teams.md.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, replace
from decimal import Decimal
from typing import Any, TypeVar

import msgspec

from stayer.agent import SYSTEM_PROMPT, Agent, AgentSettings, Limits, Observer
from stayer.context.policies import ContextPolicy
from stayer.errors import Stopped
from stayer.events import CompactionEvent, Event, Handoff, MessageReceived, MessageSent
from stayer.guard.breakers import WorkspaceProbe
from stayer.guard.budget import Budget
from stayer.journal.log import SnapshotRecord, ThreadStartedRecord
from stayer.journal.replay import JournaledModel, JournaledTool, ReplayingSandbox
from stayer.journal.session import RunJournal
from stayer.journal.store import RunUpdate
from stayer.ledger import LedgerEntry, RunResult
from stayer.mcp.config import SEPARATOR
from stayer.mcp.tools import McpTools
from stayer.mcp.views import McpView
from stayer.models.base import Message, Model
from stayer.money import usd_sum
from stayer.pricing import PriceBook
from stayer.records import Record, from_json, to_json
from stayer.routing.router import RouteRecord
from stayer.teams.bus import MessageBus, TeamMessage
from stayer.teams.config import BUILTIN_TOOLS, TeamSpec, shares
from stayer.teams.handoff import HandoffSizes, price_handoff
from stayer.teams.journal import ThreadJournal
from stayer.tokens import MessageCounter
from stayer.tools.base import Tool, ToolContext, ToolResult
from stayer.tools.messaging import (
    HandoffTool,
    MessagingRefused,
    SendMessageTool,
    WaitForMessageTool,
)
from stayer.usage import Usage

T = TypeVar("T")

#: Tools that read or write the workspace: run one at a time across the team.
WORKSPACE_TOOLS = frozenset({"bash", "read_file", "write_file", "edit_file"})
#: Why a thread stopped that was still working when the entry agent finished.
TEAM_FINISHED = "team_finished"
#: Each line of a history summary is cut to this many characters.
SUMMARY_LINE_CHARS = 200


@dataclass
class TeamServices:
    """What the run gives its team."""

    prices: PriceBook
    counter: MessageCounter
    tool_context: ToolContext
    budget: Budget  # the run's: every thread's share is carved from it
    limits: Limits  # tier, context limit, breakers; steps and cost come per agent
    models: dict[str, Model]  # per agent, as built (each its own simulator state)
    tools: Callable[[], list[Tool]]  # the built-in tools, fresh
    policy: Callable[[], ContextPolicy]
    journal: RunJournal | None = None
    probe: Callable[[RunJournal | None], WorkspaceProbe | None] = lambda j: None
    # The run's observers (not the journal): they wrap each thread's model and tools
    # inside its journal, and see its steps (after its journal), messages and events.
    observers: Sequence[Observer] = ()
    # The run's MCP servers, shared by every thread; each has its own view, offered so.
    mcp: McpTools | None = None
    mcp_mode: str = "eager"


class Team:
    def __init__(self, spec: TeamSpec, services: TeamServices) -> None:
        self.spec = spec
        self.s = services
        self.bus = MessageBus()
        self.workspace_lock = asyncio.Lock()
        share = shares(spec)
        self.threads = {name: Thread(self, name, share[name]) for name in spec.agents}
        self.run_id = ""
        self.stopping = False  # the entry agent has finished: the others end their step and stop
        journal = services.journal
        self._snapshots = (
            1 + max((s.step for s in journal.log.snapshots), default=0) if journal else 0
        )
        if journal is not None:
            self._restore_cursors(journal)

    @property
    def result(self) -> RunResult:
        """The team's result so far: the entry agent's, with every other thread's adopted
        (its usage, cost and ledger entries, which keep the agent's name)."""
        entry = self.threads[self.spec.entry]
        result = replace(entry.result or RunResult(status="budget_exhausted"))
        result.usage, result.ledger, result.breakers = (
            Usage() + result.usage,
            list(result.ledger),
            list(result.breakers),
        )
        for t in self.threads.values():
            if t is not entry and t.result is not None:
                result.adopt(t.result)
                result.breakers.extend(t.result.breakers)
                result.steps += t.result.steps
                result.peak_context_tokens = max(
                    result.peak_context_tokens, t.result.peak_context_tokens
                )
        return result

    async def run(self, instruction: str, run_id: str) -> RunResult:
        self.run_id = run_id
        entry = self.threads[self.spec.entry]
        try:
            entry.task = asyncio.create_task(entry.run(instruction))
            await entry.task
        except BaseException:
            for t in self.threads.values():
                if t.task is not None:
                    t.task.cancel()
            raise
        finally:
            self.stopping = True
            self.bus.wake()
            others = [
                t.task for t in self.threads.values() if t.task is not None and t is not entry
            ]
            ended = await asyncio.gather(*others, return_exceptions=True)
        failed = [
            e
            for e in ended
            if isinstance(e, BaseException) and not isinstance(e, asyncio.CancelledError)
        ]
        if failed:  # a thread's journal or store failed: the run stops as a single agent's would
            raise failed[0]
        return self.result

    # --- messages -------------------------------------------------------------------

    def post(self, sender: Thread, to: str, content: str, kind: str) -> TeamMessage:
        sender.sent += 1
        message = TeamMessage(f"{sender.name}#{sender.sent}", sender.name, to, content, kind)
        self.bus.post(message)
        tokens = self.s.counter.counter.count(content)
        sender.event(
            MessageSent(agent=sender.name, **msgspec.structs.asdict(message), tokens=tokens)
        )
        target = self.threads[to]
        if target.task is None and not self.bus.finished(to) and self._starts(target, message):
            target.start(message)
        return message

    def _starts(self, target: Thread, message: TeamMessage) -> bool:
        """Whether ``message`` starts ``target``'s thread: the journal's answer on replay
        (which message did first), else yes, journaled."""
        journal = self.s.journal
        if journal is None:
            return True
        recorded = journal.log.thread_starts.get(target.name)
        if recorded is not None:
            return recorded == message.id
        journal.log.thread_starts[target.name] = message.id
        journal.record("thread_started", ThreadStartedRecord(target.name, message.id))
        return True

    # --- the journal ---------------------------------------------------------------------

    def _restore_cursors(self, journal: RunJournal) -> None:
        """After the run's workspace came back from a team snapshot: where each thread's
        tool calls and steps stood when it was taken."""
        snap = next((s for s in journal.log.snapshots if s.step == journal.snapshot_step), None)
        threads = (snap.threads or {}) if snap is not None else {}
        thread_steps = (snap.thread_steps or {}) if snap is not None else {}
        # The run's own cursors never move (its threads replay, each by its own), so the
        # run's sandbox must not hold commands back as replayed: each thread's does.
        journal.restored_step = journal.restored_tools_done = 0
        for name, t in self.threads.items():
            assert t.journal is not None
            t.journal.restored_tools_done = threads.get(name, 0)
            t.journal.restored_step = thread_steps.get(name, 0)

    def row_update(self) -> RunUpdate:
        steps = sum(t.journal.steps_done for t in self.threads.values() if t.journal is not None)
        return RunUpdate(steps=steps, cost=self._cost_text())

    def _cost_text(self) -> str:
        threads = self.threads.values()
        return str(
            usd_sum(t.journal.steps_cost if t.journal is not None else None for t in threads)
        )

    def _replaying(self) -> bool:
        """Whether some thread has yet to catch up with the restored workspace: a snapshot
        now would pair that later workspace with its earlier cursors."""
        return any(
            t.journal is not None
            and (t.journal.in_restored_step or t.journal.t < t.journal.restored_tools_done)
            for t in self.threads.values()
        )

    def snapshot(self) -> None:
        """The workspace as it stands, with every thread's cursors; skipped while a tool
        is working in it (the next step takes one)."""
        journal = self.s.journal
        if journal is None or self.workspace_lock.locked() or self._replaying():
            return
        snapshot_id = journal.snapshots.snapshot(journal.workspace)
        cursors = {n: t.journal.t for n, t in self.threads.items() if t.journal is not None}
        steps = {n: t.journal.steps_done for n, t in self.threads.items() if t.journal is not None}
        step, self._snapshots = self._snapshots, self._snapshots + 1
        journal.record(
            "snapshot",
            SnapshotRecord(
                step=step,
                id=snapshot_id,
                tools_done=0,
                model_calls=0,
                threads=cursors,
                thread_steps=steps,
            ),
        )
        journal.snapshot_step = step


class _Waited(Record):
    """What waiting for a message got: the messages, and whether the sender waited for
    has finished."""

    messages: list[TeamMessage]
    finished: bool


class _ThreadHooks(Observer):
    """What a thread's agent reports goes through its thread (journal, then observers)."""

    def __init__(self, thread: Thread) -> None:
        self.thread = thread

    def on_step(self, entry: LedgerEntry) -> None:
        self.thread._on_step(entry)

    def on_message(self, message: Message) -> None:
        self.thread._on_message(message)

    def on_event(self, event: Event) -> None:
        self.thread.event(event)


class Thread:
    """One agent of the team: its context, journal stream, budget and mailbox."""

    def __init__(self, team: Team, name: str, share: float) -> None:
        self.team = team
        self.name = name
        self.spec = team.spec.agents[name]
        self.share = share
        run = team.s.journal
        self.journal = (
            ThreadJournal(run, name, team.row_update, team.snapshot) if run is not None else None
        )
        self.seen: set[str] = set()
        self.sent = 0
        self.delegator: str | None = None
        self.transcript: list[Message] = []
        self.agent: Agent | None = None
        self.task: asyncio.Task[RunResult] | None = None
        self.quote: Handoff | None = None  # a handoff priced during the step in progress

    @property
    def result(self) -> RunResult | None:
        return self.agent.result if self.agent is not None else None

    def start(self, first: TeamMessage) -> None:
        self.delegator = first.sender
        self.seen.add(first.id)
        self.event(self._receipt(first))
        heading = "Handoff" if first.kind == "handoff" else "Message"
        self.task = asyncio.create_task(
            self.run(f"{heading} from {first.sender}:\n{first.content}")
        )

    async def run(self, instruction: str) -> RunResult:
        s = self.team.s
        cap = s.budget.cap
        amount = None if cap is None else (cap * Decimal(str(self.share))).quantize(Decimal("1e-9"))
        budget = s.budget.carve(amount, self.name)
        if budget is None:  # cannot happen while shares add up to at most 1; refuse loudly
            raise RuntimeError(
                f"team agent {self.name}: the budget cannot spare its share ${amount}"
            )
        journal = self.journal
        model = s.models[self.name]
        for o in s.observers:
            model = o.model(model)
        context = (
            replace(s.tool_context, sandbox=ReplayingSandbox(s.tool_context.sandbox, journal))
            if journal
            else s.tool_context
        )
        view = McpView(s.mcp, s.mcp_mode, self._wrap) if s.mcp is not None else None
        settings = AgentSettings(
            s.prices,
            s.counter,
            replace(s.limits, max_steps=self.spec.max_steps, max_cost=amount),
            system_prompt=self._system_prompt(),
            policy=s.policy(),
            budget=budget,
            path=self.name,
            probe=s.probe(journal),
            clock=journal.clock if journal else time.time,
            inbox=self._inbox,
            tool_updates=view,
        )
        self.agent = Agent(
            JournaledModel(model, journal) if journal else model,
            self._tools(view.offered() if view else []),
            context,
            settings,
            [_ThreadHooks(self)],
        )
        try:
            result = await self.agent.run(instruction, f"{self.team.run_id}/{self.name}")
        finally:
            budget.close()
            self.team.bus.finish(self.name)
        if self.delegator is not None and result.stop_reason != TEAM_FINISHED:
            cost = "unknown" if result.cost_usd is None else f"${result.cost_usd:.6f}"
            report = f"{self.name} finished ({result.status}, {result.steps} step(s), {cost}):\n{result.summary or '(no summary)'}"
            self.team.post(self, self.delegator, report, "report")
        return result

    def _system_prompt(self) -> str:
        peers = ", ".join(self.spec.talks_to) or "nobody"
        roster = (
            f"\n\nYou are {self.name}, one agent of a team working in the same /app workspace. "
            f"You may message: {peers}. When you finish, `submit` a summary: "
            "if another agent handed you this work, the summary is sent to it."
        )
        return (self.spec.system_prompt or SYSTEM_PROMPT) + roster

    def _tools(self, mcp: list[Tool]) -> list[Tool]:
        s = self.team.s
        # ``tools`` chooses among the built-in ones; whatever else the run gives is kept.
        chosen = [
            t
            for t in s.tools()
            if t.spec.name not in BUILTIN_TOOLS or t.spec.name in self.spec.tools
        ]
        tools = self._wrap([*chosen, *mcp])
        if self.spec.talks_to:
            # Not journaled: they are run again on replay (sends are deduplicated by id,
            # and what they read comes back from the journal), so the bus is rebuilt.
            peers = list(self.spec.talks_to)
            tools += [
                SendMessageTool(self, peers),
                WaitForMessageTool(self, peers),
                HandoffTool(self, peers),
            ]
        return tools

    def _wrap(self, tools: list[Tool]) -> list[Tool]:
        """Tools as the thread runs them: observed, journaled, and those that may touch
        the workspace under the team's lock (a stdio MCP server's may: it runs in /app)."""
        s, journal = self.team.s, self.journal
        for o in s.observers:
            tools = o.tools(tools)
        tools = [JournaledTool(t, journal) for t in tools] if journal else tools
        local = {c.name for c in s.mcp.connections if c.server.url is None} if s.mcp else set()
        return [
            Locked(t, self.team.workspace_lock) if _touches_workspace(t.spec.name, local) else t
            for t in tools
        ]

    # --- hooks ------------------------------------------------------------------------

    def event(self, event: Event) -> None:
        """``event`` into the thread's journal, then to the run's observers. Every event of
        a thread names its agent (a compaction's too)."""
        if isinstance(event, CompactionEvent) and event.agent is None:
            event = msgspec.structs.replace(event, agent=self.name)
        if self.journal is not None:
            self.journal.on_event(event)
        for o in self.team.s.observers:
            o.on_event(event)

    def _on_step(self, entry: LedgerEntry) -> None:
        if self.quote is not None:  # on the ledger like a route switch
            route = entry.route or RouteRecord()
            entry.route = msgspec.structs.replace(route, handoff=self.quote.priced())
            self.quote = None
        if self.journal is not None:
            self.journal.on_step(entry)
        for o in self.team.s.observers:
            o.on_step(entry)

    def _on_message(self, m: Message) -> None:
        self.transcript.append(m)
        for o in self.team.s.observers:
            o.on_message(m)

    def _observe(self, compute: Callable[[], T], type_: type[T]) -> T:
        """What ``compute`` reads from outside the thread: journaled (as JSON) live, the
        journaled one on replay."""
        if self.journal is None:
            return compute()
        return from_json(self.journal.read_outside(lambda: to_json(compute())), type_)

    async def _observe_waiting(self, compute: Callable[[], Awaitable[T]], type_: type[T]) -> T:
        """``_observe`` for what takes waiting for."""
        if self.journal is None:
            return await compute()

        async def journaled() -> Any:  # the record's JSON builtins
            return to_json(await compute())

        return from_json(await self.journal.observe_waiting(journaled), type_)

    def _inbox(self) -> list[Message]:
        """Messages that arrived since the last step, appended to the context. Read at the
        top of every step: where a thread stops once the team has finished."""
        if self.team.stopping and self.name != self.team.spec.entry:
            raise Stopped(TEAM_FINISHED)  # like a limit: its wrap-up slice is given back, not spent
        got = self._observe(lambda: self.team.bus.unread(self.name, self.seen), list[TeamMessage])
        return [Message("user", self._text(m), kind="message") for m in self._read(got)]

    def _read(self, messages: Sequence[TeamMessage]) -> list[TeamMessage]:
        out = []
        for m in messages:
            self.seen.add(m.id)
            self.event(self._receipt(m))
            out.append(m)
        return out

    def _receipt(self, m: TeamMessage) -> MessageReceived:
        """What reading ``m`` costs this agent: its tokens read cold once, on its model."""
        s = self.team.s
        tokens = s.counter.message(Message("user", self._text(m)))
        model = s.models[self.name]
        rates = s.prices.rates(model.model_id, model.provider, None, tokens)
        first = (
            None
            if rates is None
            else (rates.cache_write_5m if rates.cache_write_5m > 0 else rates.input)
        )
        cost = (
            None
            if first is None
            else (first * tokens / Decimal(1_000_000)).quantize(Decimal("1e-9"))
        )
        return MessageReceived(
            agent=self.name,
            **msgspec.structs.asdict(m),
            tokens=tokens,
            read_cost_usd="unknown" if cost is None else str(cost),
        )

    @staticmethod
    def _text(m: TeamMessage) -> str:
        return f"[{m.kind} {m.id} from {m.sender}]\n{m.content}"

    # --- Messaging (the tools) ---------------------------------------------------------

    def _peer(self, name: str) -> str:
        if name not in self.spec.talks_to:
            raise MessagingRefused(
                f"{name!r} is not an agent you may talk to ({', '.join(self.spec.talks_to)})"
            )
        return name

    async def send(self, to: str, content: str) -> str:
        m = self.team.post(self, self._peer(to), content, "message")
        return f"sent {m.id} to {to}"

    async def wait(self, sender: str | None, timeout: float) -> str:
        if sender is not None:
            self._peer(sender)
        bus = self.team.bus

        async def waited() -> _Waited:
            got = await bus.wait(
                self.name, self.seen, sender, timeout, until=lambda: self.team.stopping
            )
            return _Waited(got, sender is not None and bus.finished(sender))

        waited_for = await self._observe_waiting(waited, _Waited)
        got = self._read(waited_for.messages)
        if got:
            return "\n\n".join(self._text(m) for m in got)
        if waited_for.finished:
            return f"no message: {sender} has finished"
        return f"no message within {timeout:g} s"

    async def handoff(self, to: str, brief: str, history: str | None) -> str:
        receiver = self.team.threads[self._peer(to)]
        s, cfg = self.team.s, self.team.spec.handoff
        full, summary = transcript(self.transcript), digest(self.transcript)
        count = s.counter.counter.count
        sizes = HandoffSizes(count(brief), count(summary), count(full))
        model = s.models[to]
        rates = s.prices.rates(model.model_id, model.provider, None, sizes.brief + sizes.full)
        quote = price_handoff(
            rates,
            sizes,
            cfg.expected_steps,
            model.spec,
            relevance=cfg.relevance,
            rediscovery_steps=cfg.rediscovery_steps,
        )
        passed = history or quote.chosen
        self.quote = quote.event(self.name, to, history, passed)
        self.event(self.quote)
        body = {
            "none": brief,
            "summary": f"{brief}\n\nWhat {self.name} did so far (summary):\n{summary}",
            "full": f"{brief}\n\n{self.name}'s conversation so far:\n{full}",
        }[passed]
        m = self.team.post(self, receiver.name, body, "handoff")
        return f"handed off to {to} as {m.id} (history: {passed}); it reports back to you when it finishes"


def _touches_workspace(name: str, local_servers: set[str]) -> bool:
    """Whether a tool of that name may write the workspace: stayer's own that do, and the
    tools of an MCP server that runs on this machine (``tool_search`` may call one)."""
    if name in WORKSPACE_TOOLS:
        return True
    if name == "tool_search":
        return bool(local_servers)
    return SEPARATOR in name and name.split(SEPARATOR, 1)[0] in local_servers


class Locked:
    """A workspace tool run under the team's lock (see ``Team.snapshot``)."""

    def __init__(self, inner: Tool, lock: asyncio.Lock) -> None:
        self.inner = inner
        self.lock = lock
        self.spec = inner.spec

    async def __call__(self, args: dict[str, Any], ctx: ToolContext) -> ToolResult:
        async with self.lock:
            return await self.inner(args, ctx)


def transcript(messages: Sequence[Message]) -> str:
    """A conversation as text: each message with its role and tool calls."""
    lines = []
    for m in messages:
        calls = "".join(f"\n-> {c.name}({c.arguments})" for c in m.tool_calls)
        lines.append(f"{m.role}: {m.content}{calls}")
    return "\n\n".join(lines)


def digest(messages: Sequence[Message]) -> str:
    """A short local summary of a conversation (no model call): the first line of each
    message, cut, with the tools called."""
    lines = []
    for m in messages:
        first = (m.content.strip().splitlines() or [""])[0][:SUMMARY_LINE_CHARS]
        calls = ", ".join(c.name for c in m.tool_calls)
        lines.append(f"- {m.role}: {first}" + (f" [{calls}]" if calls else ""))
    return "\n".join(lines)

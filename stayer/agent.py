"""The agent loop: compact → call → act → record, one step at a time, until a ``RunEnded``.

Everything that decides cost lives below this file: the prompt layout and its compaction
(``context``), prices (``pricing``), the budget (``guard``), the model adapters
(``models``) and the sandboxed tools (``tools``). This file only wires them together.

A run ends by an exception (``stayer.errors``), raised where the end is decided and caught
in ``Agent.run``: ``Submitted`` (the agent called submit), ``Stopped`` (a limit or breaker,
raised by the guard, or the wrap-up's summary is in), ``Failed`` (the model failed past
failover; the context policy cannot fit ``--max-context``). A step that cannot go on as
planned (a call the budget cannot hold, a failover) starts over at the guard instead.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from typing import Protocol

from stayer.context.compactor import Compacted, Compactor, ToolsTaken
from stayer.context.forensics import CacheBreak, CacheForensics
from stayer.context.layout import Context
from stayer.context.policies import AutoPolicy, ContextPolicy, StepView
from stayer.context.summarizer import ModelSummarizer
from stayer.errors import Failed, RunEnded, Stopped, Submitted
from stayer.events import Breaker, Event, Failover, Said, ToolsChanged
from stayer.guard.breakers import (
    GuardConfig,
    StepRecord,
    ToolCallRecord,
    TreeFingerprint,
    WorkspaceProbe,
)
from stayer.guard.budget import Budget
from stayer.guard.guard import Guard
from stayer.guard.reserve import MIN_OUTPUT_TOKENS, TOKEN_MARGIN  # noqa: F401  (re-exported)
from stayer.ledger import BreakerTrip, LedgerEntry, RunResult, ToolCallEntry
from stayer.models.base import Message, Model, ModelError, ModelResponse, ToolCall, lost_attempts
from stayer.pricing import Cost, PriceBook, Rates
from stayer.routing.router import Route, Router, RouteView, rules_for
from stayer.settings import RunSettings
from stayer.tokens import MessageCounter, PromptEstimate, PromptEstimator
from stayer.tools import run_tool
from stayer.tools.base import Tool, ToolContext, ToolResult
from stayer.tools.effects import CallRef

SYSTEM_PROMPT = """\
You are an autonomous software agent working in a Linux sandbox without network access.
The task's workspace is /app; your commands run there. Work step by step with the tools:
inspect before you change, keep command output short (use head, tail, grep), and check your
work by running it. Tool output that is too long is cut, and the full text is saved in a
file whose path the cut marker names. When the task is done, call `submit` with a one-line
summary. You cannot ask questions: decide, act, and verify."""

NUDGE = (
    "No tool was called. Continue working with the tools, or call `submit` when the task is done."
)

# The answer to every tool call of a reply cut off at max_tokens. Such a call may be
# incomplete however well-formed it looks (Anthropic returns the partial input it parsed),
# and the provider does not say which calls were finished, so none of them is run.
CUT_OFF_ANSWER = ToolResult(
    "not run: your reply was cut off at its max_tokens limit before it was complete; "
    "send the call again with shorter text or arguments (split a long file into several writes)",
    is_error=True,
)


class ToolUpdates(Protocol):
    """Tools whose source changed them mid-run (an MCP server's ``list_changed``): the
    new list is ``take``n (``(tools, names they replace, what changed)``) at the next
    compaction, or at once when a call (its name and JSON arguments) ``needs`` it, priced
    as the cache break it is (``cache_break.reason = tools_changed`` on the next ledger
    entry, which then says what changed in ``tools_changed``)."""

    @property
    def pending(self) -> bool: ...

    async def needs(self, name: str, arguments: str) -> bool: ...

    async def take(self, when: str) -> tuple[list[Tool], set[str], ToolsTaken]: ...


@dataclass(frozen=True)
class Limits:
    max_steps: int = RunSettings.max_steps
    max_cost: Decimal | None = None
    max_output_tokens: int = 8192  # per model call
    service_tier: str | None = None
    max_context: int | None = None  # prompt tokens; never exceeded (context policy)
    guard: GuardConfig = GuardConfig()  # breakers, soft threshold, wrap-up


def _tree_probe(workspace: str | None) -> WorkspaceProbe | None:
    """The breakers' default view of the workspace: its tree's fingerprint, if it exists."""
    path = Path(workspace) if workspace else None
    return TreeFingerprint(path) if path and path.is_dir() else None


class _StepAgain(Exception):  # noqa: N818 - a control-flow signal
    """The step starts over at the guard: a call or compaction the budget cannot hold has
    begun the wrap-up (or stopped the run), or a failover has changed the model."""


@dataclass
class RunState:
    """One run's moving parts, carried from step to step."""

    ctx: Context
    guard: Guard
    forensics: CacheForensics
    compactor: Compactor
    result: RunResult
    steps: int = 0  # steps done
    compactions: int = 0
    last_output: int = 0  # the last reply's output tokens (what the policy plans with)


@dataclass(frozen=True)
class SettledCall:
    """A step's model call, made and settled."""

    response: ModelResponse
    cost: Cost
    context_tokens: int  # the prompt as we counted it
    estimate: PromptEstimate  # what the budget expected the provider to count
    cache_break: CacheBreak | None


class Observer:
    """Watches a run from outside the loop: the journal, telemetry, the CLI's step line,
    the runtime. ``model`` and ``tools`` wrap what the run is built with (inside the
    journal: live calls only, never replayed ones); the loop calls ``on_step`` with each
    finished step's ledger entry, ``on_message`` with each message of the context and
    ``on_event`` with each ``Event``, observers in their order. Override what you need."""

    def model(self, inner: Model) -> Model:
        return inner

    def tools(self, tools: list[Tool]) -> list[Tool]:
        return tools

    def on_step(self, entry: LedgerEntry) -> None:
        pass

    def on_message(self, message: Message) -> None:
        pass

    def on_event(self, event: Event) -> None:
        pass


@dataclass
class Hooks(Observer):
    """An observer made of plain functions; any left out does nothing."""

    step: Callable[[LedgerEntry], None] | None = None
    message: Callable[[Message], None] | None = None
    event: Callable[[Event], None] | None = None

    def on_step(self, entry: LedgerEntry) -> None:
        if self.step is not None:
            self.step(entry)

    def on_message(self, message: Message) -> None:
        if self.message is not None:
            self.message(message)

    def on_event(self, event: Event) -> None:
        if self.event is not None:
            self.event(event)


@dataclass
class AgentSettings:
    """What the loop runs with besides its model, tools and sandbox:

    * ``summarizer`` writes summaries for summarising policies with a real model; None
      keeps the policy's local digest (the simulator, what-if replays).
    * ``router`` picks the model of each call (by default always the agent's); ``budget``
      is None for a fresh one of ``limits.max_cost``, or a slice carved for a sub-agent.
    * ``clock``: every reading of the time goes through it, so that a journal can record it
      and a resumed run decides (TTLs, wall-time breakers, routing) as the original did.
    * ``inbox`` gives what people said to the agent since the last step; ``nudge`` the
      text that answers a reply without tool calls (a replay gives its recording's).
    * ``tool_updates``: tools whose source changes them mid-run (MCP servers).
    """

    prices: PriceBook
    counter: MessageCounter
    limits: Limits = Limits()
    system_prompt: str = SYSTEM_PROMPT
    policy: ContextPolicy | None = None
    summarizer: ModelSummarizer | None = None
    router: Router | None = None
    budget: Budget | None = None
    path: str = "main"
    probe: WorkspaceProbe | None = None
    clock: Callable[[], float] = time.time
    inbox: Callable[[], Sequence[Message]] | None = None
    nudge: Callable[[], str] | None = None
    tool_updates: ToolUpdates | None = None


class Agent:
    """The loop over one model, its tools and the sandbox they act in (``tool_context``),
    watched by ``observers``. ``guard`` is the running run's (sub-agents carve their budget
    from it); ``result`` the running run's result, complete up to its last finished step
    (what a caller that stops the run from outside, a time limit, reports); ``estimator``
    the provider's count of the next prompt, learned from its reports (per model)."""

    def __init__(
        self,
        model: Model,
        tools: Sequence[Tool],
        tool_context: ToolContext,
        settings: AgentSettings,
        observers: Sequence[Observer] = (),
    ) -> None:
        s, limits = settings, settings.limits
        self.model, self.rules, self.service_tier = model, rules_for(model), limits.service_tier
        self.tools = {t.spec.name: t for t in tools}
        self.settings, self.prices, self.counter = s, s.prices, s.counter
        self.tool_context, self.limits, self.observers = tool_context, limits, list(observers)
        self.system_prompt, self.path, self.budget, self.clock = (
            s.system_prompt,
            s.path,
            s.budget,
            s.clock,
        )
        self.inbox = s.inbox or (lambda: ())
        self.nudge = s.nudge or (lambda: NUDGE)
        self.policy, self.summarizer = s.policy or AutoPolicy(), s.summarizer
        self.router = s.router or Router(model, s.prices, service_tier=limits.service_tier)
        self.probe = s.probe or _tree_probe(tool_context.workspace)
        self.guard: Guard | None = None
        self.result: RunResult | None = None
        self.run_id = ""
        self._children: list[RunResult] = []
        self.estimator = PromptEstimator()
        self.tool_updates = s.tool_updates
        self._taken: ToolsTaken | None = None  # taken for a call: on the next entry's break

    def emit(self, event: Event) -> None:
        """``event`` to every observer, in order."""
        for o in self.observers:
            o.on_event(event)

    def _said(self, message: Message) -> None:
        for o in self.observers:
            o.on_message(message)

    def add_tool(self, tool: Tool) -> None:
        """Before ``run``: the tool schemas are part of the cached prefix from the start."""
        self.tools[tool.spec.name] = tool

    def child_finished(self, child: RunResult) -> None:
        """A sub-agent's finished run, folded into this run's result after the step."""
        self._children.append(child)

    def rates_at(self, prompt_tokens: int):  # noqa: ANN201 - Rates | None
        return self.prices.rates(
            self.model.model_id, self.model.provider, self.service_tier, prompt_tokens
        )

    def worst_rates_at(self, prompt_tokens: int) -> Rates | None:
        """The rates a call's reservation holds: the requested tier's, or the standard
        tier's where those are dearer, since a provider bills the tier it served and some
        serve a cheaper tier's request at standard (Anthropic's Messages API has no batch
        tier and is sent none; OpenAI-compatible servers ignore ``service_tier``). None
        when the requested tier has no price (a capped budget then refuses the call)."""
        tiered = self.rates_at(prompt_tokens)
        if tiered is None or self.service_tier is None:
            return tiered
        standard = self.prices.rates(self.model.model_id, self.model.provider, None, prompt_tokens)
        return tiered if standard is None else tiered.dearest(standard)

    async def run(
        self, instruction: str, run_id: str, history: Sequence[Message] = ()
    ) -> RunResult:
        """Run until a ``RunEnded``: submit, a limit, or an error. ``history`` continues an
        earlier context."""
        s = self._start(instruction, run_id, history)
        try:
            while True:
                with contextlib.suppress(_StepAgain):
                    await self._step(s)
        except RunEnded as end:
            s.result.status, s.result.stop_reason = end.status, end.stop_reason
            if isinstance(end, Failed):
                s.result.error = end.detail
        self._finish(s)
        return s.result

    def _start(self, instruction: str, run_id: str, history: Sequence[Message]) -> RunState:
        ctx = Context(
            self.system_prompt, [t.spec for t in self.tools.values()], instruction, self.counter
        )
        for m in history:
            ctx.append(m)
        for m in ctx.messages:
            self._said(m)
        self.run_id = run_id
        guard = self.guard = Guard(
            self.budget or Budget(self.limits.max_cost),
            self.limits.guard,
            max_steps=self.limits.max_steps,
            max_output_tokens=self.limits.max_output_tokens,
            probe=self.probe,
            escalate=self.router.on_trip,
            clock=self.clock,
        )
        compactor = Compactor(
            self.rates_at,
            self.counter,
            self.prices,
            self.summarizer,
            self.tool_context.sandbox,
            self.tool_context.command_timeout,
            self.emit,
            self.path,
        )
        self.result = RunResult(status="running")
        return RunState(ctx, guard, CacheForensics(self.counter), compactor, self.result)

    async def _step(self, s: RunState) -> None:
        """One step: compact, call (reserve, complete, settle, fail over), act, record."""
        step = s.steps + 1
        self._admit(s, step)
        now = self.clock()
        route = self._route(s.ctx, step, s.compactions, now)
        compaction = await self._compact(s, step)
        call = await self._call(s, now, compaction)
        taken, self._taken = self._taken, None
        s.steps, s.last_output = step, call.response.usage.output_tokens
        reply = call.response.message
        s.ctx.append(reply)
        self._said(reply)
        tool_calls, observed, submitted = await self._act(
            s.ctx, reply.tool_calls, s.result, call.response.cut_off, step
        )
        planned_miss = compaction is not None or route.switched
        record = StepRecord(
            step, call.cost.total, observed, reply.content, s.last_output, planned_miss=planned_miss
        )
        wrapping_up = not s.guard.working
        s.guard.after_step(
            record, call.response.usage.input_tokens + call.response.usage.output_tokens
        )
        self.router.record_step(record)
        self._record(s, call, tool_calls, compaction, route, taken)
        if wrapping_up and not tool_calls and reply.content.strip():
            s.result.summary = reply.content.strip()  # a summary given as text
        if submitted and not wrapping_up:
            raise Submitted()
        if wrapping_up and (submitted or s.result.summary):
            raise Stopped(s.guard.stop_reason)

    def _admit(self, s: RunState, step: int) -> None:
        """The guard's leave for the step (``Stopped`` when there is none), then what was
        said since the last one: the wrap-up's instruction and people's messages, appended
        at the end so that the cached prefix stays as it is."""
        instruction = s.guard.admit(step)
        if instruction is not None:  # the wrap-up has begun
            s.ctx.append(instruction)
            self._said(instruction)
        for said in self.inbox():
            s.ctx.append(said)
            self._said(said)
            self.emit(Said(agent=self.path, role=said.role, content=said.content))

    async def _compact(self, s: RunState, step: int) -> Compacted | None:
        """The context policy's compaction for this step, if any, funded and carried out;
        its record for the ledger. A policy that cannot fit ``--max-context`` ends the run
        (``ContextOverflow``); a summary call the budget cannot hold starts the wrap-up."""
        view = StepView(
            step=step,
            max_steps=self.limits.max_steps,
            max_context=self.limits.max_context,
            rates_at=self.rates_at,
            explicit_cache=self.rules.mode == "explicit",
            output_tokens=s.last_output,
        )
        compaction = self.policy.plan(s.ctx, view)
        if compaction is None:
            return None
        held = s.guard.hold_call(*s.compactor.worst_case(s.ctx, compaction))
        if held is None:
            s.guard.unaffordable(
                "max_cost", "the compaction's summary call does not fit the budget"
            )
            raise _StepAgain
        record = await s.compactor.apply(s.ctx, compaction, step)
        if (changed := await self._take_tools(s.ctx, "compaction")) is not None:
            record.tools_changed = changed
        cost = record.spent
        s.guard.budget.settle(held, cost)
        s.result.add_cost(
            cost
        )  # spent now, whether or not this step's own call can then be afforded
        s.compactions += 1
        return record

    async def _call(self, s: RunState, now: float, compaction: Compacted | None) -> SettledCall:
        """Hold the call's worst case, make it, and settle its real cost. A call the budget
        cannot hold starts the step again (the guard has begun the wrap-up or stopped); a
        model that failed past its retries is replaced by another provider's, if one is
        configured (the step starts again), or ends the run."""
        context_tokens = s.ctx.tokens
        estimate = await self._estimate(s.ctx, s.guard, context_tokens, self.run_id, now)
        attempts = 1 + lost_attempts(self.model)
        held = s.guard.reserve(
            self.worst_rates_at, context_tokens, attempts=attempts, upper=estimate.upper
        )
        if held is None:
            raise _StepAgain
        request = s.ctx.request(
            max_tokens=held.max_tokens,
            cache_key=self.run_id,
            service_tier=self.service_tier,
            now=now,
        )
        try:
            response = await self.model.complete(request)
        except ModelError as e:
            s.guard.release(held)
            raise self._fail_over(e) from e
        self.estimator.calibrate(context_tokens, response.usage.input_tokens, len(request.messages))
        cost = self.prices.cost(
            response.usage, self.model.model_id, self.model.provider, response.service_tier
        )
        s.guard.settle(held, self._with_lost(cost.total, response))
        cache_break = s.forensics.observe(
            request,
            response.usage,
            self.model.spec,
            self.rules,
            now,
            compaction_at=compaction.first_index if compaction else None,
        )
        return SettledCall(response, cost, context_tokens, estimate, cache_break)

    def _record(
        self,
        s: RunState,
        call: SettledCall,
        tool_calls: list[ToolCallEntry],
        compaction: Compacted | None,
        route: Route,
        taken: ToolsTaken | None = None,
    ) -> None:
        """The step's ledger entry, into the result and out to ``on_step``; then the
        sub-agents that finished during the step, rolled into the result. ``taken``: tools
        taken for a call of the step before (this step's call paid for it)."""
        entry = LedgerEntry.made(
            step=s.steps,
            model=self.model.spec,
            usage=call.response.usage,
            cost=call.cost,
            context_tokens=call.context_tokens,
            latency_s=call.response.latency_s,
            tool_calls=tool_calls,
            cache_break=call.cache_break,
            compaction=compaction,
            agent=self.path,
            breakers=self._trips(s.guard),
            route=route.record() if route.switched or route.quote else None,
            prompt_estimate=call.estimate,
        )
        if taken is not None:
            entry.tools_changed = taken
        result = s.result
        result.steps = s.steps
        result.usage += call.response.usage
        result.add_cost(call.cost.total)
        result.peak_context_tokens = max(result.peak_context_tokens, call.context_tokens)
        result.ledger.append(entry)
        for o in self.observers:
            o.on_step(entry)
        for child in self._children:
            result.adopt(child)
        self._children.clear()

    async def _estimate(
        self, ctx: Context, guard: Guard, counted: int, run_id: str, now: float
    ) -> PromptEstimate:
        """The provider's likely count of the prompt and its bound. Under a cap, where the
        provider has a count endpoint, its own count is asked for when the bound is not yet
        backed by a report (the first call) or would decide the call (the budget cannot
        hold its usual worst case): the error is then zero."""
        estimate = self.estimator.estimate(counted, len(ctx.messages))
        count = getattr(self.model, "count_tokens", None)
        if count is None or guard.budget.available is None:
            return estimate
        if self.estimator.anchored and not guard.tight(self.rates_at, counted, estimate.upper):
            return estimate
        exact = await count(
            ctx.request(max_tokens=self.limits.max_output_tokens, cache_key=run_id, now=now)
        )
        return estimate if exact is None else self.estimator.exact(exact)

    def _with_lost(self, cost: Decimal | None, response: ModelResponse) -> Decimal | None:
        """What this call spent from the budget: its own cost and that of attempts lost in
        a crash (the run's result reports those apart, as ``lost_in_flight``)."""
        if response.lost_usage is None or cost is None:
            return cost
        lost = self.prices.cost(
            response.lost_usage, self.model.model_id, self.model.provider, response.service_tier
        )
        return None if lost.total is None else cost + lost.total

    def _route(self, ctx: Context, step: int, compactions: int, now: float) -> Route:
        """Ask the router which model and tier make this step's call, and use them."""
        prefix = ctx.tokens_before(ctx.prefix_messages)
        view = RouteView(
            step, self.limits.max_steps, ctx.tokens, prefix, compactions, now, len(ctx.messages)
        )
        route = self.router.choose(view)
        if route.model is not self.model:
            self.model, self.rules = route.model, rules_for(route.model)
            self.estimator.reset()  # another tokenizer: what was learned does not carry over
        self.service_tier = route.tier
        return route

    def _fail_over(self, error: ModelError) -> Exception:
        """After the adapter's retries failed: another provider's model, if configured (the
        step starts again with it); else the run ends. Returns what to raise."""
        replacement = self.router.failover(self.model)
        if replacement is None:
            return Failed("model_error", str(error))
        self.emit(
            Failover(
                agent=self.path, from_model=self.model.spec, to=replacement.spec, error=str(error)
            )
        )
        return _StepAgain()

    async def _take_tools(self, ctx: Context, when: str) -> ToolsTaken | None:
        """Take the changed tool lists now, if any: the context's schemas are replaced
        (a cache break, priced on the next call); what changed, for the ledger."""
        updates = self.tool_updates
        if updates is None or not updates.pending:
            return None
        tools, replaced, taken = await updates.take(when)
        for name in replaced:
            self.tools.pop(name, None)
        for tool in tools:
            self.tools[tool.spec.name] = tool
        ctx.replace_tools(t.spec for t in self.tools.values())
        self.emit(
            ToolsChanged(
                agent=self.path,
                when=when,
                added=taken.added,
                removed=taken.removed,
                changed=taken.changed or [],
            )
        )
        return taken

    def _trips(self, guard: Guard) -> list[BreakerTrip]:
        """Breaker trips since the last step, journaled as events and kept on the ledger."""
        trips = guard.take_trips()
        for t in trips:
            self.emit(Breaker(agent=self.path, **dataclasses.asdict(t)))
        return [BreakerTrip.of(t, self.path) for t in trips]

    def _finish(self, s: RunState) -> None:
        guard, result = s.guard, s.result
        guard.finish()
        result.stop_reason = result.stop_reason or guard.stop_reason
        left = self._trips(guard)
        if left and result.ledger:
            result.ledger[-1].trips.extend(left)
        result.breakers = [BreakerTrip.of(t, self.path) for t in guard.trips]
        if result.status == "budget_exhausted":
            result.summary = guard.final_summary(
                result.summary, s.ctx.messages, result.steps, result.cost_usd
            )

    async def _act(
        self,
        ctx: Context,
        calls: tuple[ToolCall, ...],
        result: RunResult,
        cut_off: bool = False,
        step: int = 0,
    ) -> tuple[list[ToolCallEntry], tuple[ToolCallRecord, ...], bool]:
        if not calls:
            nudge = Message(role="user", content=self.nudge(), kind="nudge")
            ctx.append(nudge)
            self._said(nudge)
            return [], (), False
        records: list[ToolCallEntry] = []
        observed: list[ToolCallRecord] = []
        submitted = False
        for index, call in enumerate(calls):
            updates = self.tool_updates
            if (
                not cut_off
                and updates
                and updates.pending
                and await updates.needs(call.name, call.arguments)
            ):
                self._taken = await self._take_tools(ctx, "call") or self._taken
            # The one place a model's tool call is executed. The context names the call
            # (run, agent, step, id): its idempotency key, and how the journal knows a
            # side-effecting call again on resume (stayer.tools.effects).
            ref = CallRef(self.run_id, self.path, step, call.id, index)
            call_ctx = dataclasses.replace(self.tool_context, call=ref)
            out = CUT_OFF_ANSWER if cut_off else await run_tool(self.tools, call, call_ctx)
            message = Message(
                role="tool",
                content=out.output,
                tool_call_id=call.id,
                is_error=out.is_error,
                kind="error" if out.is_error else out.kind,
            )
            ctx.append(message)
            self._said(message)
            seen = ToolCallRecord.of(call.name, call.arguments, out.is_error, out.output)
            observed.append(seen)
            records.append(
                ToolCallEntry(
                    id=call.id,
                    name=call.name,
                    is_error=out.is_error,
                    exit_code=seen.exit_code,
                    **({"outcome": out.outcome} if out.outcome else {}),
                )
            )
            if out.submitted:
                submitted = True
                result.summary = out.output
        return records, tuple(observed), submitted

"""The agent loop: assemble → reserve → call → record → act, until submit or a limit.

Everything that decides cost lives below this file: the prompt layout (``context``),
prices (``pricing``), the budget (``guard``), the model adapters (``models``) and the
sandboxed tools (``tools``). This file only wires them together, one step at a time.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from typing import Any

from stayer.context.forensics import CacheForensics
from stayer.context.layout import Context
from stayer.context.policies import (
    AutoPolicy,
    Compaction,
    ContextOverflow,
    ContextPolicy,
    StepView,
    policy_cost,
)
from stayer.context.summarizer import ModelSummarizer
from stayer.guard.breakers import (
    GuardConfig,
    StepRecord,
    ToolCallRecord,
    TreeFingerprint,
    WorkspaceProbe,
)
from stayer.guard.budget import Budget, Reservation
from stayer.guard.guard import Guard
from stayer.guard.reserve import MIN_OUTPUT_TOKENS, TOKEN_MARGIN, quote  # noqa: F401  (re-exported)
from stayer.ledger import LedgerEntry, RunResult
from stayer.models.base import Message, Model, ModelError, ModelResponse, ToolCall
from stayer.pricing import PriceBook, Rates
from stayer.routing.router import Route, Router, RouteView, rules_for
from stayer.tokens import MessageCounter, PromptEstimate, PromptEstimator
from stayer.tools import run_tool
from stayer.tools.base import Tool, ToolContext, ToolResult

SYSTEM_PROMPT = """\
You are an autonomous software agent working in a Linux sandbox without network access.
The task's workspace is /app; your commands run there. Work step by step with the tools:
inspect before you change, keep command output short (use head, tail, grep), and check your
work by running it. Tool output that is too long is cut, and the full text is saved in a
file whose path the cut marker names. When the task is done, call `submit` with a one-line
summary. You cannot ask questions: decide, act, and verify."""

NUDGE = "No tool was called. Continue working with the tools, or call `submit` when the task is done."

# The answer to every tool call of a reply cut off at max_tokens. Such a call may be
# incomplete however well-formed it looks (Anthropic returns the partial input it parsed),
# and the provider does not say which calls were finished, so none of them is run.
CUT_OFF_ANSWER = ToolResult(
    "not run: your reply was cut off at its max_tokens limit before it was complete; "
    "send the call again with shorter text or arguments (split a long file into several writes)",
    is_error=True,
)


@dataclass(frozen=True)
class Limits:
    max_steps: int = 50
    max_cost: Decimal | None = None
    max_output_tokens: int = 8192  # per model call
    service_tier: str | None = None
    max_context: int | None = None  # prompt tokens; never exceeded (context policy)
    guard: GuardConfig = GuardConfig()  # breakers, soft threshold, wrap-up


class Agent:
    def __init__(
        self,
        model: Model,
        tools: Sequence[Tool],
        prices: PriceBook,
        tool_context: ToolContext,
        counter: MessageCounter,
        limits: Limits = Limits(),
        *,
        system_prompt: str = SYSTEM_PROMPT,
        on_step: Callable[[LedgerEntry], None] | None = None,
        on_message: Callable[[Message], None] | None = None,
        on_event: Callable[[str, dict[str, Any]], None] | None = None,
        policy: ContextPolicy | None = None,
        summarizer: ModelSummarizer | None = None,
        router: Router | None = None,
        budget: Budget | None = None,
        path: str = "main",
        probe: WorkspaceProbe | None = None,
        clock: Callable[[], float] = time.time,
        inbox: Callable[[], Sequence[Message]] | None = None,
    ) -> None:
        self.model = model
        self.tools = {t.spec.name: t for t in tools}
        self.prices = prices
        self.tool_context = tool_context
        self.counter = counter
        self.limits = limits
        self.system_prompt = system_prompt
        self.on_step = on_step or (lambda e: None)
        self.on_message = on_message or (lambda m: None)
        # Structured events for the journal and observers: compaction, breaker, ... Each
        # carries the data needed to rebuild the context exactly on resume.
        self.on_event = on_event or (lambda kind, payload: None)
        self.policy = policy or AutoPolicy()
        # Writes summaries for summarising policies with a real model; None keeps the
        # policy's local digest (the simulator, what-if replays).
        self.summarizer = summarizer
        self.rules = rules_for(model)
        self.service_tier = limits.service_tier
        # Which model makes each call; by default always ``model``.
        self.router = router or Router(model, prices, service_tier=limits.service_tier)
        self.budget = budget  # None: a fresh one of ``limits.max_cost``; a carved slice for sub-agents
        self.path = path
        workspace = Path(tool_context.workspace) if tool_context.workspace else None
        # Every reading of the time goes through here, so that a journal can record it and
        # a resumed run decides (TTLs, wall-time breakers, routing) as the original did.
        self.clock = clock
        # What people said to the agent since the last step (the runtime's messages).
        self.inbox = inbox or (lambda: ())
        self.probe = probe or (TreeFingerprint(workspace) if workspace and workspace.is_dir() else None)
        self.guard: Guard | None = None  # the running step's guard (sub-agents carve from it)
        # The running run's result, complete up to its last finished step: what a caller
        # that stops the run from outside (a time limit) reports.
        self.result: RunResult | None = None
        self.run_id = ""
        self._children: list[RunResult] = []
        # The provider's count of the next prompt, learned from its reports (per model).
        self.estimator = PromptEstimator()

    def add_tool(self, tool: Tool) -> None:
        """Before ``run``: the tool schemas are part of the cached prefix from the start."""
        self.tools[tool.spec.name] = tool

    def adopt(self, child: RunResult) -> None:
        """A sub-agent's finished run, folded into this run's result after the step."""
        self._children.append(child)

    def rates_at(self, prompt_tokens: int):  # noqa: ANN201 - Rates | None
        return self.prices.rates(self.model.model_id, self.model.provider, self.service_tier, prompt_tokens)

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

    async def run(self, instruction: str, run_id: str, history: Sequence[Message] = ()) -> RunResult:
        """Run until submit or a limit. ``history`` continues an earlier context."""
        ctx = Context(self.system_prompt, [t.spec for t in self.tools.values()], instruction, self.counter)
        for m in history:
            ctx.append(m)
        for m in ctx.messages:
            self.on_message(m)
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
        forensics = CacheForensics(self.counter)
        result = self.result = RunResult(status="budget_exhausted")
        last_output, compactions, step = 0, 0, 0
        while (gate := guard.begin_step(step + 1)).go:
            if gate.instruction is not None:  # the wrap-up has begun
                ctx.append(gate.instruction)
                self.on_message(gate.instruction)
            for said in self.inbox():  # appended at the end: the cached prefix stays as it is
                ctx.append(said)
                self.on_message(said)
                self.on_event("message", {"agent": self.path, "role": said.role, "content": said.content})
            now = self.clock()
            route = self._route(ctx, step + 1, compactions, now)
            view = StepView(
                step=step + 1,
                max_steps=self.limits.max_steps,
                max_context=self.limits.max_context,
                rates_at=self.rates_at,
                explicit_cache=self.rules.mode == "explicit",
                output_tokens=last_output,
            )
            try:
                compaction = self.policy.plan(ctx, view)
            except ContextOverflow as e:
                result.status, result.error, result.stop_reason = "error", str(e), "max_context"
                break
            compaction_record = None
            if compaction is not None:
                held_summary = self._fund_compaction(guard.budget, compaction, ctx)
                if held_summary is None:
                    guard.unaffordable("max_cost", "the compaction's summary call does not fit the budget")
                    continue
                compaction_record = await self._compact(ctx, compaction, step + 1)
                compaction_cost = Decimal(compaction_record["cost_usd"])
                guard.budget.settle(held_summary, compaction_cost)
                # Spent now, whether or not this step's own call can then be afforded.
                result.add_cost(compaction_cost)
                compactions += 1
            context_tokens = ctx.tokens
            estimate = await self._estimate(ctx, guard, context_tokens, run_id, now)
            lost_attempts = getattr(self.model, "pending_lost_attempts", lambda: 0)()
            held = guard.reserve(self.worst_rates_at, context_tokens, attempts=1 + lost_attempts, upper=estimate.upper)
            if held is None:
                continue  # not affordable: the wrap-up begins (or the run stops) at the top
            request = ctx.request(
                max_tokens=held.max_tokens,
                cache_key=run_id,
                service_tier=self.service_tier,
                now=now,
            )
            try:
                response = await self.model.complete(request)
            except ModelError as e:
                guard.release(held)
                if self._fail_over(e):
                    continue
                result.status, result.error, result.stop_reason = "error", str(e), "model_error"
                break
            step += 1
            self.estimator.observe(context_tokens, response.usage.input_tokens, len(request.messages))
            cost = self.prices.cost(
                response.usage, self.model.model_id, self.model.provider, response.service_tier
            )
            guard.settle(held, self._with_lost(cost.total, response))
            cache_break = forensics.observe(
                request,
                response.usage,
                self.model.spec,
                self.rules,
                request.now if request.now is not None else now,
                compaction_at=compaction_record["first_index"] if compaction_record else None,
            )
            last_output = response.usage.output_tokens
            ctx.append(response.message)
            self.on_message(response.message)

            calls, observed, submitted = await self._act(ctx, response.message.tool_calls, result, response.cut_off)
            record = StepRecord(
                step,
                cost.total,
                observed,
                response.message.content,
                response.usage.output_tokens,
                planned_miss=compaction is not None or route.switched,
            )
            wrapping_up = not guard.working
            guard.after_step(record, response.usage.input_tokens + response.usage.output_tokens)
            self.router.observe(record)
            entry = LedgerEntry(
                step=step,
                model=self.model.spec,
                usage=response.usage,
                cost=cost,
                context_tokens=context_tokens,
                latency_s=response.latency_s,
                tool_calls=calls,
                cache_break=cache_break,
                compaction=compaction_record,
                agent=self.path,
                breakers=self._trips(guard),
                route=route.to_dict() if route.switched or route.quote else None,
                prompt_estimate=estimate,
            )
            result.steps = step
            result.usage += response.usage
            result.add_cost(cost.total)
            result.peak_context_tokens = max(result.peak_context_tokens, context_tokens)
            result.ledger.append(entry)
            self.on_step(entry)
            for child in self._children:
                result.adopt(child)
            self._children.clear()
            if wrapping_up and not calls and response.message.content.strip():
                result.summary = response.message.content.strip()  # a summary given as text
            if submitted or (wrapping_up and result.summary):
                if not wrapping_up:
                    result.status, result.stop_reason = "submitted", "submit"
                break
        self._finish(guard, ctx, result)
        return result

    async def _estimate(self, ctx: Context, guard: Guard, counted: int, run_id: str, now: float) -> PromptEstimate:
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
        exact = await count(ctx.request(max_tokens=self.limits.max_output_tokens, cache_key=run_id, now=now))
        return estimate if exact is None else self.estimator.exact(exact)

    def _with_lost(self, cost: Decimal | None, response: ModelResponse) -> Decimal | None:
        """What this call spent from the budget: its own cost and that of attempts lost in
        a crash (the run's result reports those apart, as ``lost_in_flight``)."""
        if response.lost_usage is None or cost is None:
            return cost
        lost = self.prices.cost(response.lost_usage, self.model.model_id, self.model.provider, response.service_tier)
        return None if lost.total is None else cost + lost.total

    def _route(self, ctx: Context, step: int, compactions: int, now: float) -> Route:
        """Ask the router which model and tier make this step's call, and use them."""
        prefix = ctx.tokens_before(ctx.prefix_messages)
        view = RouteView(step, self.limits.max_steps, ctx.tokens, prefix, compactions, now, len(ctx.messages))
        route = self.router.choose(view)
        if route.model is not self.model:
            self.model, self.rules = route.model, rules_for(route.model)
            self.estimator.reset()  # another tokenizer: what was learned does not carry over
        self.service_tier = route.tier
        return route

    def _fail_over(self, error: ModelError) -> bool:
        """After the adapter's retries failed: another provider's model, if configured."""
        replacement = self.router.failover(self.model)
        if replacement is not None:
            self.on_event("failover", {"agent": self.path, "from": self.model.spec, "to": replacement.spec, "error": str(error)})
        return replacement is not None

    def _trips(self, guard: Guard) -> list[dict[str, Any]]:
        """Breaker trips since the last step, journaled as events and kept on the ledger."""
        trips = [{"agent": self.path, **t.to_dict()} for t in guard.take_trips()]
        for t in trips:
            self.on_event("breaker", t)
        return trips

    def _finish(self, guard: Guard, ctx: Context, result: RunResult) -> None:
        guard.finish()
        result.stop_reason = result.stop_reason or guard.stop_reason
        left = self._trips(guard)
        if left and result.ledger:
            result.ledger[-1].breakers.extend(left)
        result.breakers = [{"agent": self.path, **t.to_dict()} for t in guard.trips]
        if result.status == "budget_exhausted":
            result.summary = guard.final_summary(result.summary, ctx.messages, result.steps, result.cost_usd)

    def _fund_compaction(self, budget: Budget, c: Compaction, ctx: Context) -> Reservation | None:
        """A summarising compaction is a model call: hold its worst case from the budget.
        A model-written summary's is that of the summariser's request exactly as it will be
        sent (its instructions and the span, its tier, its ``max_tokens``); the local
        digest is priced as the policy planned it, on the current model. None: the budget
        cannot hold it."""
        if not c.summary_input_tokens:
            return budget.reserve(Decimal(0))
        if self.summarizer is not None:
            request = self.summarizer.request(self._summary_span(ctx, c))
            prompt = self.counter.text(request.system) + sum(self.counter.message(m) for m in request.messages)
            m, tier = self.summarizer.model, request.service_tier
            q = quote(lambda n: self.prices.rates(m.model_id, m.provider, tier, n), prompt)
            out = request.max_tokens
        else:
            q, out = quote(self.rates_at, c.summary_input_tokens), c.summary_output_tokens
        if q is None:  # unpriced: only an uncapped budget may let it through
            return budget.reserve(Decimal(0)) if budget.cap is None else None
        return budget.reserve(q.cost(out))

    async def _compact(self, ctx: Context, c: Compaction, step: int) -> dict[str, Any]:
        await self._archive(c.archive)
        cost = policy_cost(c, self.rates_at(c.summary_input_tokens)) or Decimal(0)
        if self.summarizer is not None and c.summary_input_tokens:
            cost = await self._summarize(ctx, c, cost)
        first = c.apply(ctx)
        event = {"step": step, **c.to_event(), "cost_usd": str(cost)}
        self.on_event("compaction", event)
        return {
            "reason": c.reason,
            "first_index": first,
            "tokens_before": c.tokens_before,
            "tokens_after": c.tokens_after,
            "cost_usd": str(cost),
        }

    @staticmethod
    def _summary_span(ctx: Context, c: Compaction) -> list[Message]:
        return [ctx.messages[i] for i in sorted(c.changes)]

    async def _summarize(self, ctx: Context, c: Compaction, planned: Decimal) -> Decimal:
        """Replace the planned digest with a model-written summary of the evicted span.
        If the summariser's call fails (after its retries), the digest stays: the
        compaction still happens, and a failed call bills nothing."""
        first = min(c.changes)
        try:
            text, _usage, cost = await self.summarizer(self._summary_span(ctx, c))  # type: ignore[misc]
        except ModelError as e:
            self.on_event("summary_failed", {"agent": self.path, "model": self.summarizer.model.spec, "error": str(e)})  # type: ignore[union-attr]
            return Decimal(0)
        stub = c.changes[first]
        marker = stub.content.splitlines()[-1]
        c.changes[first] = Message(stub.role, f"{text}\n{marker}", (), stub.tool_call_id, False, "summary")
        return cost.total if cost.total is not None else planned

    async def _archive(self, files: dict[str, str]) -> None:
        """Save elided tool output in the workspace (the stubs name these files). Written
        from inside the sandbox, so a path the agent planted cannot lead outside /app."""
        if not files or self.tool_context.sandbox is None:
            return
        # Paths relative to /app (the working directory), so that every sandbox kind works.
        payload = b"".join(
            f"{path.removeprefix('/app/')}\n{len(body.encode())}\n".encode() + body.encode()
            for path, body in files.items()
        )
        script = (
            "export LC_ALL=C; mkdir -p .stayer/outputs; "
            'while IFS= read -r path && IFS= read -r len; do '
            'IFS= read -r -d "" -N "$len" body; printf %s "$body" > "$path"; done'
        )
        await self.tool_context.sandbox.exec(script, stdin=payload, timeout=self.tool_context.command_timeout)

    async def _act(
        self, ctx: Context, calls: tuple[ToolCall, ...], result: RunResult, cut_off: bool = False
    ) -> tuple[list[dict[str, Any]], tuple[ToolCallRecord, ...], bool]:
        if not calls:
            nudge = Message(role="user", content=NUDGE, kind="nudge")
            ctx.append(nudge)
            self.on_message(nudge)
            return [], (), False
        records: list[dict[str, Any]] = []
        observed: list[ToolCallRecord] = []
        submitted = False
        for call in calls:
            out = CUT_OFF_ANSWER if cut_off else await run_tool(self.tools, call, self.tool_context)
            message = Message(
                role="tool",
                content=out.output,
                tool_call_id=call.id,
                is_error=out.is_error,
                kind="error" if out.is_error else out.kind,
            )
            ctx.append(message)
            self.on_message(message)
            seen = ToolCallRecord.of(call.name, call.arguments, out.is_error, out.output)
            observed.append(seen)
            records.append({"id": call.id, "name": call.name, "is_error": out.is_error, "exit_code": seen.exit_code})
            if out.submitted:
                submitted = True
                result.summary = out.output
        return records, tuple(observed), submitted


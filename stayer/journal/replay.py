"""The journaled model, tools, sandbox and workspace probe: each wraps the live one, writes
what it does to the run's :class:`~stayer.journal.session.RunJournal`, and on a resume
answers from the journal instead (the rules are in ``stayer.journal.session``'s docstring).

The wrappers of one run share the journal's replay cursors (the n-th model call, t-th tool
call, …), so a sub-agent's model and the main agent's are counted in one sequence, as the
loop makes the calls.
"""

from __future__ import annotations

import json
import time
from typing import Any, Protocol, runtime_checkable

from stayer.guard.breakers import WorkspaceProbe
from stayer.journal.blobs import digest
from stayer.journal.codec import MessageRecord, canonical
from stayer.journal.effects import call_once
from stayer.journal.log import (
    ModelFailedRecord,
    ModelFinishedRecord,
    ModelStartedRecord,
    ToolDivergedRecord,
    ToolFinishedRecord,
    ToolStartedRecord,
)
from stayer.journal.session import RunJournal
from stayer.journal.store import JournalError
from stayer.ledger import LostCall
from stayer.messages import ToolCall
from stayer.models.base import Model, ModelError, ModelRequest, ModelResponse
from stayer.records import from_json, to_json
from stayer.sandbox.base import ExecResult, Sandbox
from stayer.tools import run_tool
from stayer.tools.base import Tool, ToolContext, ToolResult
from stayer.tools.effects import call_spec, effects_of, side_effecting


@runtime_checkable
class CacheStateful(Protocol):
    """A model whose answers depend on state built by earlier requests (the simulator's
    provider cache). Replay shows it each journaled request in order, without asking for a
    reply, so the calls after a resume are billed exactly as in an uninterrupted run."""

    def account(self, request: ModelRequest) -> object: ...


class ReplayDiverged(JournalError):
    """Replaying the run produced a request the journal does not hold: the code, the
    configuration or the task changed since the run started."""


class JournaledModel:
    """The run's model, journaled: a call the journal holds a reply for is answered from
    it (its request digest checked first); the first one it does not is made live, after
    its start is written, and its reply is written before the loop acts on it."""

    def __init__(self, inner: Model, journal: RunJournal) -> None:
        self.inner = inner
        self.journal = journal
        self.spec, self.provider, self.model_id = inner.spec, inner.provider, inner.model_id

    async def complete(self, request: ModelRequest) -> ModelResponse:
        journal, inner = self.journal, self.inner
        t0 = time.perf_counter()
        n, journal.n = journal.n, journal.n + 1
        request_digest = journal.request_digest(request)
        rec = journal.log.calls.get(n)
        if rec is not None and rec.digest != request_digest:
            raise ReplayDiverged(
                f"run {journal.run_id}: replay diverged at model call {n + 1} (step {journal.steps_done + 1}): "
                "the request differs from the journaled one, so the code, configuration or task "
                "changed since the run started; it cannot be resumed exactly"
            )
        if rec is not None and rec.finished is not None:
            # The request's ``now`` is the journaled one already: it is read from the
            # loop's clock, which replays the journaled time (``clock``).
            if isinstance(inner, CacheStateful):
                inner.account(request)
            response = self._response(rec.finished)
            journal.answered(inner, response)
            journal.stats.replayed_calls += 1
            journal.stats.seconds += time.perf_counter() - t0
            return response
        if rec is not None and rec.failed is not None:
            raise ModelError(rec.failed.error)
        lost_attempts = rec.attempts if rec is not None else 0
        # Written before the call, so that a crash mid-call is known to have been billed.
        # Not fsynced: the fsync of this call's result, before anything acts on it, covers
        # it; only a power cut mid-call could lose it (and with it the lost call's estimate).
        started = ModelStartedRecord(
            n=n, digest=request_digest, now=request.now, attempt=lost_attempts + 1
        )
        journal.record("model_started", started, durable=True, sync=False)
        journal.stats.seconds += time.perf_counter() - t0
        try:
            response = await inner.complete(request)
        except ModelError as e:
            journal.record("model_failed", ModelFailedRecord(n, str(e)), durable=True)
            raise
        t1 = time.perf_counter()
        journal.stats.live_calls += 1
        said = [self._record_lost(n, attempt, response) for attempt in range(1, lost_attempts + 1)]
        if lost_attempts:
            lost = response.usage
            for _ in range(lost_attempts - 1):
                lost = lost + response.usage
            response.lost_usage = lost
        raw = canonical(MessageRecord.of(response.message))
        address = digest(raw)
        finished = ModelFinishedRecord(
            n=n,
            message=address,
            usage=response.usage,
            raw_usage=response.raw_usage,
            model=response.model,
            latency_s=response.latency_s,
            stop_reason=response.stop_reason,
            service_tier=response.service_tier,
        )
        journal.record("model_finished", finished, {address: raw}, durable=True)
        # Said once written: a journal that lost its lease meanwhile (LeaseLost above) wrote
        # none of them, and its successor says its own.
        for line in said:
            journal.warn(line)
        journal.answered(inner, response)
        journal.stats.seconds += time.perf_counter() - t1
        return response

    def pending_lost_attempts(self) -> int:
        """Attempts at the next model call that were in flight at a crash: each was billed,
        so the loop must hold budget for them as well as for the call it is about to make."""
        rec = self.journal.log.calls.get(self.journal.n)
        return (
            rec.attempts if rec is not None and rec.finished is None and rec.failed is None else 0
        )

    async def count_tokens(self, request: ModelRequest) -> int | None:
        """The provider's own count of a prompt, where it has a count endpoint (not a
        billed call, so not journaled)."""
        count = getattr(self.inner, "count_tokens", None)
        return None if count is None else await count(request)

    def _record_lost(self, n: int, attempt: int, reissued: ModelResponse) -> str:
        """The attempt in flight at a crash: billed by the provider, its reply never seen.
        Its usage is estimated as the re-issued call's (the same request). Returns the
        line to say once the record is written."""
        journal, inner = self.journal, self.inner
        cost = journal.prices.cost(
            reissued.usage, inner.model_id, inner.provider, reissued.service_tier
        )
        call = LostCall(
            agent=journal.agent,
            n=n,
            attempt=attempt,
            step=journal.steps_done + 1,
            model=inner.spec,
            usage=reissued.usage,
            cost=cost,
        )
        journal.lost.append(from_json(to_json(call), LostCall))  # as a reload will read it
        journal.record("model_lost", call)
        return (
            f"run {journal.run_id}: model call {n + 1} was in flight at the crash; issued again, and the lost "
            f"attempt is in the ledger as lost_in_flight (estimated ${cost.to_json()})"
        )

    def _response(self, d: ModelFinishedRecord) -> ModelResponse:
        # json, not msgspec, reads the blob: it may hold a lone surrogate (see ``canonical``)
        record = from_json(json.loads(self.journal.log.blobs[d.message]), MessageRecord)
        return ModelResponse(
            message=record.message(),
            usage=d.usage,
            raw_usage=d.raw_usage,
            model=d.model,
            latency_s=d.latency_s,
            stop_reason=d.stop_reason,
            service_tier=d.service_tier,
        )


class JournaledTool:
    """A tool, journaled: a call recorded before the restored workspace snapshot is
    answered from the journal; one recorded after it is executed again (to rebuild the
    workspace) and answered with the recorded output, so the context is byte-identical.
    A side-effecting call (``stayer.tools.effects``) is never executed again once recorded,
    and goes through ``stayer.journal.effects.call_once`` when it is not."""

    def __init__(self, inner: Tool, journal: RunJournal) -> None:
        self.inner = inner
        self.journal = journal
        self.spec = inner.spec

    async def __call__(self, args: dict[str, Any], ctx: ToolContext) -> ToolResult:
        journal, tool = self.journal, self.inner
        t, journal.t = journal.t, journal.t + 1
        before = journal.cursors()
        rec = journal.log.tools.get(t)
        runs = call_spec(tool, args)  # the tool's spec, or that of the tool it runs
        effects = effects_of(runs, ctx.sandbox)
        once = side_effecting(effects)
        if rec is not None:
            recorded = rec.result(ToolResult.text(journal.log.blobs[rec.output]))
            # A tool that made journaled calls of its own (a sub-agent) is run again even
            # before the snapshot: its calls replay from the journal, and whatever it does
            # to the agent (adopting the sub-agent's ledger) happens again. A plain tool is
            # run again only after the snapshot, to redo its effect on the workspace; a
            # side-effecting one never (its effect is outside the workspace).
            if rec.nested or (t >= journal.restored_tools_done and not once):
                live = await _invoke(tool, args, ctx)
                if live != recorded:
                    output = digest(live.raw())
                    journal.record("tool_diverged", ToolDivergedRecord(t, tool.spec.name, output))
                    journal.warn(
                        f"run {journal.run_id}: re-executed {tool.spec.name} call #{t + 1} gave a different result "
                        "than journaled; the journaled one is kept in the context"
                    )
            return recorded
        t0 = time.perf_counter()
        journal.record("tool_started", ToolStartedRecord(t, tool.spec.name))
        journal.stats.seconds += time.perf_counter() - t0
        if once:  # sent at most once, whatever crashes (stayer.journal.effects)
            result = await call_once(
                journal, runs.name, effects, args, ctx, t, lambda c: _invoke(tool, args, c)
            )
        else:
            result = await _invoke(tool, args, ctx)
        t1 = time.perf_counter()
        raw = result.raw()
        address = digest(raw)
        nested = journal.cursors() != before
        finished = ToolFinishedRecord.of(t, tool.spec.name, address, nested, result.fields())
        journal.record("tool_finished", finished, {address: raw})
        journal.stats.seconds += time.perf_counter() - t1
        return result


async def _invoke(tool: Tool, args: dict[str, Any], ctx: ToolContext) -> ToolResult:
    # Through run_tool, so that a tool that raises gives the same error result as unwrapped.
    return await run_tool(
        {tool.spec.name: tool}, ToolCall("", tool.spec.name, json.dumps(args)), ctx
    )


class ReplayingSandbox:
    """The agent's sandbox, for commands the loop runs itself (not through a tool, e.g.
    archiving compacted output). While replaying a step the restored workspace snapshot
    already covers, such a command is not run again: its effect is in the snapshot, and
    re-running it over the later state could undo what later steps did."""

    def __init__(self, inner: Sandbox, journal: RunJournal) -> None:
        self.inner = inner
        self.journal = journal

    async def exec(self, command: str, **kw: Any) -> ExecResult:
        if self.journal.in_restored_step:
            return ExecResult(0, "", "")
        return await self.inner.exec(command, **kw)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


class JournaledProbe:
    """The breakers' view of the workspace, journaled: on replay the workspace is the
    restored snapshot, not the state each replayed step saw."""

    def __init__(self, inner: WorkspaceProbe, journal: RunJournal) -> None:
        self.inner = inner
        self.journal = journal

    def fingerprint(self) -> str:
        return str(self.journal.read_outside(self.inner.fingerprint))

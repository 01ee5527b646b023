"""One run's journal while it runs: the wrappers and hooks that write it, and exact replay.

The agent loop is not changed to be durable; it is *wrapped*. ``RunJournal.model()`` wraps
the model, ``RunJournal.tools()`` wraps each tool, and ``on_step`` / ``on_event`` are the
loop's hooks. Resume is deterministic replay, as in a workflow engine: the loop runs again
from the start, and

* a model call the journal holds a result for is answered from the journal (its request
  digest checked first), never sent to the provider again; a stateful model (the
  simulator's provider cache) is shown the recorded request so its state is rebuilt;
* a tool call recorded before the restored workspace snapshot is answered from the
  journal; one recorded after it is executed again (that rebuilds the workspace) and
  answered with the recorded output, so the context is byte-identical;
* the first call with no recorded result continues live. A model call that was started
  but has no result (in flight at the crash) is issued again once, and the lost attempt is
  journaled as ``model_lost`` with its estimated usage and cost, because the provider bills
  it anyway.

The loop must therefore be deterministic given what it reads through the journal: model
and tool results, and ``observe``d inputs (the breakers' workspace fingerprint). Agent
events (compaction, breakers, …) are journaled as emitted and compared on replay, so a loop
that re-derives a different event is reported rather than silently trusted; a request that
differs from the journaled one stops the resume (``ReplayDiverged``). A tool that made
journaled calls of its own (a sub-agent) is re-run on replay, its calls answered from the
journal, so its effects on the agent happen again. Commands the loop runs in the sandbox
itself are skipped while replaying steps the restored snapshot covers.

Durability: an event is written before anything that depends on it happens. A model call
is journaled as started before it is sent (so a crash mid-call is known to have been
billed) and as finished, fsynced, before its reply is acted on (so it is never paid for
twice). Tool results, steps, snapshots and observations ride along with the next write:
losing them costs only re-running tools from the last snapshot, never a model call.
"Started" is written without an fsync of its own (the next one covers it), so only a power
cut mid-call, not a killed process, could lose the record of a lost call.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import hashlib
import json
import sys
import time
from collections.abc import AsyncIterator, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from stayer.errors import OrderlyStop
from stayer.guard.breakers import WorkspaceProbe
from stayer.journal.blobs import BlobError, digest
from stayer.journal.codec import canonical, message_from_record, message_record
from stayer.journal.lease import new_owner, owner_is_dead
from stayer.journal.log import JOURNAL_KINDS, RunLog, load_log
from stayer.journal.snapshot import clear_workspace
from stayer.journal.sql import utc_now
from stayer.journal.store import JournalError, RunRow, Store
from stayer.ledger import lost_entry
from stayer.messages import Message, ToolCall
from stayer.models.base import Model, ModelError, ModelRequest, ModelResponse
from stayer.money import Usd, usd_sum
from stayer.pricing import PriceBook
from stayer.sandbox.base import ExecResult, Sandbox
from stayer.sandbox.snapshot import SnapshotNotFound, SnapshotStore
from stayer.tokens import ToolsText
from stayer.tools import run_tool
from stayer.tools.base import Tool, ToolContext, ToolResult
from stayer.usage import Usage

#: A lease lives this long without renewal; a running journal renews it every third of it.
LEASE_TTL_S = 30.0
# Everything a tool result says besides its text (is_error, submitted, kind, …), journaled
# as is so that the replayed result is the same object.
_RESULT_FIELDS = tuple(f.name for f in dataclasses.fields(ToolResult) if f.name != "output")


@runtime_checkable
class CacheStateful(Protocol):
    """A model whose answers depend on state built by earlier requests (the simulator's
    provider cache). Replay shows it each journaled request in order, without asking for a
    reply, so the calls after a resume are billed exactly as in an uninterrupted run."""

    def account(self, request: ModelRequest) -> object: ...


class ReplayDiverged(JournalError):
    """Replaying the run produced a request the journal does not hold: the code, the
    configuration or the task changed since the run started."""


class RunFinished(JournalError):
    """The run already finished; ``result`` is its result document."""

    def __init__(self, message: str, result: dict[str, Any]) -> None:
        super().__init__(message)
        self.result = result


@dataclass
class JournalStats:
    seconds: float = 0.0  # wall time spent journaling (hashing, encoding, writing, snapshots)
    events: int = 0
    writes: int = 0  # durable appends
    replayed_calls: int = 0
    live_calls: int = 0


class RunJournal:
    """Writes one run's journal and replays its past. Create with :meth:`create` (a new run)
    or :meth:`reopen` (a resume)."""

    def __init__(
        self,
        store: Store,
        run_id: str,
        owner: str,
        log: RunLog,
        workspace: Path,
        prices: PriceBook,
        *,
        started: str,
        snapshots: SnapshotStore | None = None,
        ttl_s: float = LEASE_TTL_S,
        warn: Callable[[str], None] | None = None,
    ) -> None:
        self.store = store
        self.run_id = run_id
        self.owner = owner
        self.log = log
        self.workspace = Path(workspace)
        self.prices = prices
        self.started = started
        self.snapshots = snapshots or store.snapshots()
        self.ttl_s = ttl_s
        self.warn = warn or (lambda msg: print(f"stayer: {msg}", file=sys.stderr))
        self.stats = JournalStats()
        self.seq = log.next_seq
        self._events: list[tuple[str, dict[str, Any]]] = []
        self._blobs: dict[str, bytes] = {}
        self._update: dict[str, Any] = {}
        self._stored: set[str] = set(log.blobs)  # addresses known to be in the store
        # Replay cursors: the n-th model call, t-th tool call, e-th agent event and o-th
        # observation of the run, counted the same way on every replay.
        self.n = self.t = self.e = self.o = 0
        self.steps_done = 0
        self.restored_tools_done = 0
        self.restored_step = 0  # the step whose snapshot the workspace was restored from
        self.snapshot_step = max((s["step"] for s in log.snapshots), default=-1)
        self.steps_cost = Usd()
        self.lost: list[dict[str, Any]] = list(log.lost)
        # Model calls answered since the last step was recorded (the step's own call, its
        # sub-agents' and summariser's): see ``cut_short``.
        self._unstepped: list[tuple[Model, ModelResponse]] = []
        self._message_hashes: dict[Message, bytes] = {}
        self._digest_prefix: tuple[tuple[str, str], list[Message], Any] = (("", ""), [], None)
        self._tools_text = ToolsText()

    # --- opening --------------------------------------------------------------------

    @classmethod
    def create(
        cls,
        store: Store,
        run_id: str,
        header: dict[str, Any],
        workspace: Path,
        prices: PriceBook,
        **kw: Any,
    ) -> RunJournal:
        owner, now = new_owner(), utc_now()
        ttl_s = kw.get("ttl_s", LEASE_TTL_S)
        row = RunRow(run_id, header["task"], header["model"], "running", 0, "0", now, now, header)
        store.create_run(row, owner, ttl_s)
        journal = cls(store, run_id, owner, RunLog(run_id, header=header), workspace, prices, started=now, **kw)
        journal._record("run_created", {"header": header}, durable=True)
        return journal

    @staticmethod
    def load(store: Store, run_id: str) -> tuple[RunRow, RunLog]:
        """A run's row and journal, read-only. JournalError for an unknown run, RunFinished
        (carrying its result) for one that has finished."""
        row = store.run(run_id)
        if row is None:
            raise JournalError(f"run {run_id}: no such run in {store.location}; `stayer runs` lists the runs there")
        log = load_log(store, run_id)
        if log.finished is not None:
            result = json.loads(log.blobs[log.finished["result"]])
            raise RunFinished(f"run {run_id} already finished ({log.finished['status']}); nothing to resume", result)
        if not log.events:
            raise JournalError(f"run {run_id}: its journal in {store.location} is empty or unreadable; start it again")
        return row, log

    @classmethod
    def reopen(
        cls, store: Store, row: RunRow, log: RunLog, workspace: Path, prices: PriceBook, **kw: Any
    ) -> RunJournal:
        """Take the lease of a run :meth:`load` returned, to continue it. JournalError if
        another live process holds it."""
        owner = new_owner()
        holder = store.claim(row.id, owner, kw.get("ttl_s", LEASE_TTL_S), owner_is_dead)
        if holder is not None:
            raise JournalError(
                f"run {row.id} is being run by another process ({holder}); wait for it to finish, "
                "or for its lease to expire if that process is gone"
            )
        journal = cls(store, row.id, owner, log, workspace, prices, started=row.started, **kw)
        if log.torn:
            store.truncate(row.id, owner, log.next_seq - 1)
            journal.warn(f"run {row.id}: dropped {log.torn} torn event(s) at the end of the journal")
        journal._record("resumed", {"owner": owner, "from_seq": log.next_seq, "torn": log.torn}, durable=True)
        return journal

    def release(self) -> None:
        """Give the lease up without finishing (a resume that could not start)."""
        self.store.release(self.run_id, self.owner)

    def restore_workspace(self, materialise: Callable[[Path], None]) -> None:
        """Put the workspace back as of the newest usable snapshot (or lay it out afresh)."""
        t0 = time.perf_counter()
        for snap in reversed(self.log.snapshots):
            try:
                self.snapshots.restore(snap["id"], self.workspace)
            except (BlobError, SnapshotNotFound, OSError, ValueError, KeyError) as e:
                self.warn(f"run {self.run_id}: snapshot of step {snap['step']} unusable ({e}); trying an older one")
                continue
            self.restored_tools_done, self.snapshot_step = int(snap["tools_done"]), int(snap["step"])
            self.restored_step = self.snapshot_step
            break
        else:
            clear_workspace(self.workspace)
            materialise(self.workspace)
            self.restored_tools_done, self.snapshot_step, self.restored_step = 0, -1, 0
        self.stats.seconds += time.perf_counter() - t0

    # --- writing --------------------------------------------------------------------

    def _record(
        self,
        kind: str,
        data: dict[str, Any],
        blobs: Mapping[str, bytes] | None = None,
        *,
        durable: bool = False,
        sync: bool = True,
        update: Mapping[str, Any] | None = None,
    ) -> None:
        """Queue an event; ``durable`` writes it (and everything queued) now."""
        self._events.append((kind, data))
        for address, raw in (blobs or {}).items():
            if address not in self._stored:
                self._blobs[address] = raw
        if update:
            self._update.update(update)
        if durable:
            self.flush(sync=sync)

    def flush(self, *, sync: bool = True) -> None:
        """Write every pending event, in one transaction (``sync``: see ``Store.append``)."""
        if not self._events:
            return
        self.store.append(self.run_id, self.owner, self.seq, self._events, self._blobs, self._update or None, sync=sync)
        self.seq += len(self._events)
        self.stats.events += len(self._events)
        self.stats.writes += 1
        self._stored.update(self._blobs)
        self._events, self._blobs, self._update = [], {}, {}

    @contextlib.asynccontextmanager
    async def leased(self) -> AsyncIterator[None]:
        """Keep the run's lease alive while the body runs; give it up if the body fails."""

        async def beat() -> None:
            while True:
                await asyncio.sleep(self.ttl_s / 3)
                if not self.store.renew(self.run_id, self.owner, self.ttl_s):
                    self.warn(f"run {self.run_id}: lost its lease to another process")
                    return

        task = asyncio.create_task(beat())
        try:
            yield
        except BaseException as e:
            # Failed or cancelled in this process (which lives on): resumable at once. An
            # orderly stop first writes what is buffered (finished tools, recorded steps).
            if isinstance(e, OrderlyStop):
                with contextlib.suppress(Exception):
                    self.flush()
            with contextlib.suppress(Exception):
                self.release()
            raise
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    def finish(self, result: dict[str, Any]) -> None:
        raw = canonical(result)
        address = digest(raw)
        self._record(
            "run_finished",
            {"status": result["status"], "result": address},
            {address: raw},
            durable=True,
            update={"status": result["status"], "steps": result["steps"], "cost_usd": result["cost_usd"]},
        )
        self.store.release(self.run_id, self.owner)

    # --- wrappers and hooks ------------------------------------------------------------

    def model(self, inner: Model) -> Model:
        return JournaledModel(inner, self)

    def tools(self, tools: Iterable[Tool]) -> list[Tool]:
        return [JournaledTool(t, self) for t in tools]

    def sandbox(self, inner: Sandbox) -> Sandbox:
        return ReplayingSandbox(inner, self)

    def probe(self, inner: WorkspaceProbe) -> WorkspaceProbe:
        return JournaledProbe(inner, self)

    def observe(self, compute: Callable[[], Any], keep: Callable[[Any], bool] | None = None) -> Any:
        """A value the loop reads from outside itself (a workspace fingerprint, …): computed
        and journaled live, the journaled one on replay, so decisions taken on it (breakers)
        come out the same. The value must be JSON.

        ``keep``: journal a live value only if ``keep(value)``. For a reading that, when
        not kept, ends the run (a cap checked at a pause): the resumed run reads it again,
        live, at the same point, and journals what it then acts on."""
        i = self.o
        if i in self.log.observations:
            self.o += 1
            return self.log.observations[i]
        value = compute()
        if keep is None or keep(value):
            self.o += 1
            self._record("observed", {"i": i, "value": value})
        return value

    def clock(self) -> float:
        """The loop's clock: live time, journaled; the journaled time on replay."""
        return self.observe(time.time)

    @property
    def in_restored_step(self) -> bool:
        """True while replaying a step whose effects on the workspace the restored
        snapshot already holds."""
        return self.steps_done < self.restored_step

    def on_step(self, entry: Any) -> None:
        """The loop's ``on_step``: the step's ledger entry, then a workspace snapshot."""
        t0 = time.perf_counter()
        self.steps_done = entry.step
        self._unstepped.clear()
        self.steps_cost += entry.cost.total
        if entry.step not in self.log.steps:
            self._record(
                "step",
                {"step": entry.step, "entry": entry.to_dict()},
                update={"steps": entry.step, "cost_usd": self.cost_text()},
            )
        if entry.step > self.snapshot_step:
            self.take_snapshot(entry.step)
        self.stats.seconds += time.perf_counter() - t0

    def cut_short(self) -> dict[str, Any] | None:
        """The step a stop in mid-step (the task's agent time limit) cut short, as a ledger
        entry (``kind: cut_short``), journaled like any step: its model calls were answered
        and billed although the step never finished. None if it had made none. (A call still
        in flight at the stop has no reply to price; it stays journaled as started.)"""
        if not self._unstepped:
            return None
        step = self.steps_done + 1
        if step in self.log.steps:  # stopped while replaying a step the journal holds whole
            self._unstepped.clear()
            self.steps_done = step
            return dict(self.log.steps[step])
        usage, cost = Usage(), Usd()
        for inner, response in self._unstepped:
            usage += response.usage
            cost += self.prices.cost(response.usage, inner.model_id, inner.provider, response.service_tier).total
        first_model, first = self._unstepped[0]
        calls = [{"id": c.id, "name": c.name, "is_error": True, "exit_code": None} for c in first.message.tool_calls]
        entry = {
            "agent": "main",
            "step": step,
            "kind": "cut_short",
            "model": first_model.spec,
            "model_calls": len(self._unstepped),
            "usage": usage.to_dict(),
            "cost_usd": str(cost),
            "cache_hit_ratio": round(usage.cache_hit_ratio, 4),
            "context_tokens": None,
            "latency_s": round(sum(r.latency_s for _, r in self._unstepped), 4),
            "tool_calls": calls,
            "tool_errors": len(calls),
            "cache_break": None,
        }
        self._unstepped.clear()
        self.steps_done = step
        self.steps_cost += cost
        self._record("step", {"step": step, "entry": entry}, update={"steps": step, "cost_usd": self.cost_text()})
        return entry

    def take_snapshot(self, step: int) -> None:
        snapshot_id = self.snapshots.snapshot(self.workspace)
        self._record("snapshot", {"step": step, "id": snapshot_id, "tools_done": self.t, "model_calls": self.n})
        self.snapshot_step = step

    def on_event(self, kind: str, payload: dict[str, Any]) -> None:
        """The loop's ``on_event``: any structured event, stored as given (its payload in a
        blob) and, on replay, checked against the journaled one."""
        t0 = time.perf_counter()
        i, self.e = self.e, self.e + 1
        raw = canonical(payload)
        address = digest(raw)
        stored_kind = f"agent:{kind}" if kind in JOURNAL_KINDS else kind
        recorded = self.log.agent_events.get(i)
        if recorded is None:
            self._record(stored_kind, {"i": i, "payload": address}, {address: raw})
        elif recorded != (stored_kind, address):
            self.warn(f"run {self.run_id}: replay emitted a different {kind!r} event than the journal holds (#{i})")
        self.stats.seconds += time.perf_counter() - t0

    def cost_text(self) -> str:
        return str(self.steps_cost + usd_sum(Usd.parse(lost["cost_usd"]) for lost in self.lost))

    # --- model calls -----------------------------------------------------------------

    def request_digest(self, request: ModelRequest) -> str:
        """What the request says, hashed; excludes ``now`` (a timestamp, not content).

        Requests grow by appending, so the hash of the previous request's leading part is
        kept and continued: a step costs its new messages, not the whole history."""
        head = (request.system, self._tools_text(request.tools))
        prev_head, prev_messages, prev_state = self._digest_prefix
        messages = request.messages
        keep = 0
        if head == prev_head and len(prev_messages) <= len(messages):
            while keep < len(prev_messages) and prev_messages[keep] is messages[keep]:
                keep += 1
        if keep == len(prev_messages) and prev_state is not None:
            h = prev_state.copy()
        else:
            keep = 0
            h = hashlib.sha256()
            h.update(hashlib.sha256(head[0].encode()).digest())
            h.update(hashlib.sha256(head[1].encode()).digest())
        for m in messages[keep:]:
            mh = self._message_hashes.get(m)
            if mh is None:
                mh = self._message_hashes[m] = hashlib.sha256(canonical(message_record(m))).digest()
            h.update(mh)
        self._digest_prefix = (head, list(messages), h.copy())
        tail = [request.max_tokens, request.cache_breakpoints, request.cache_key, request.cache_ttl, request.service_tier]
        h.update(json.dumps(tail).encode())
        return h.hexdigest()

    async def complete(self, inner: Model, request: ModelRequest) -> ModelResponse:
        t0 = time.perf_counter()
        n, self.n = self.n, self.n + 1
        request_digest = self.request_digest(request)
        rec = self.log.calls.get(n)
        if rec is not None and rec.digest != request_digest:
            raise ReplayDiverged(
                f"run {self.run_id}: replay diverged at model call {n + 1} (step {self.steps_done + 1}): "
                "the request differs from the journaled one, so the code, configuration or task "
                "changed since the run started; it cannot be resumed exactly"
            )
        if rec is not None and rec.finished is not None:
            # The request's ``now`` is the journaled one already: it is read from the
            # loop's clock, which replays the journaled time (``clock``).
            if isinstance(inner, CacheStateful):
                inner.account(request)
            response = self._response(rec.finished)
            self._unstepped.append((inner, response))
            self.stats.replayed_calls += 1
            self.stats.seconds += time.perf_counter() - t0
            return response
        if rec is not None and rec.failed is not None:
            raise ModelError(rec.failed["error"])
        lost_attempts = rec.attempts if rec is not None else 0
        # Written before the call, so that a crash mid-call is known to have been billed.
        # Not fsynced: the fsync of this call's result, before anything acts on it, covers
        # it; only a power cut mid-call could lose it (and with it the lost call's estimate).
        self._record(
            "model_started",
            {"n": n, "digest": request_digest, "now": request.now, "attempt": lost_attempts + 1},
            durable=True,
            sync=False,
        )
        self.stats.seconds += time.perf_counter() - t0
        try:
            response = await inner.complete(request)
        except ModelError as e:
            self._record("model_failed", {"n": n, "error": str(e)}, durable=True)
            raise
        t1 = time.perf_counter()
        self.stats.live_calls += 1
        for attempt in range(1, lost_attempts + 1):
            self._record_lost(inner, n, attempt, response)
        if lost_attempts:
            lost = response.usage
            for _ in range(lost_attempts - 1):
                lost = lost + response.usage
            response.lost_usage = lost
        raw = canonical(message_record(response.message))
        address = digest(raw)
        self._record(
            "model_finished",
            {
                "n": n,
                "message": address,
                "usage": response.usage.to_dict(),
                "raw_usage": response.raw_usage,
                "model": response.model,
                "latency_s": response.latency_s,
                "stop_reason": response.stop_reason,
                "service_tier": response.service_tier,
            },
            {address: raw},
            durable=True,
        )
        self._unstepped.append((inner, response))
        self.stats.seconds += time.perf_counter() - t1
        return response

    def pending_lost_attempts(self) -> int:
        """Attempts at the next model call that were in flight at a crash: each was billed,
        so the loop must hold budget for them as well as for the call it is about to make."""
        rec = self.log.calls.get(self.n)
        return rec.attempts if rec is not None and rec.finished is None and rec.failed is None else 0

    def _record_lost(self, inner: Model, n: int, attempt: int, reissued: ModelResponse) -> None:
        """The attempt in flight at a crash: billed by the provider, its reply never seen.
        Its usage is estimated as the re-issued call's (the same request)."""
        cost = self.prices.cost(reissued.usage, inner.model_id, inner.provider, reissued.service_tier)
        lost = {
            "n": n,
            "attempt": attempt,
            "step": self.steps_done + 1,
            "model": inner.spec,
            "usage": reissued.usage.to_dict(),
            "cost_usd": cost.to_json(),
            "estimated": True,
        }
        self.lost.append(lost)
        self._record("model_lost", lost)
        self.warn(
            f"run {self.run_id}: model call {n + 1} was in flight at the crash; issued again, and the lost "
            f"attempt is in the ledger as lost_in_flight (estimated ${lost['cost_usd']})"
        )

    def _response(self, d: dict[str, Any]) -> ModelResponse:
        message = message_from_record(json.loads(self.log.blobs[d["message"]]))
        return ModelResponse(
            message=message,
            usage=Usage.from_dict(d["usage"]),
            raw_usage=d["raw_usage"],
            model=d["model"],
            latency_s=float(d["latency_s"]),
            stop_reason=d.get("stop_reason", ""),
            service_tier=d.get("service_tier"),
        )

    # --- tool calls ------------------------------------------------------------------

    async def call_tool(self, tool: Tool, args: dict[str, Any], ctx: ToolContext) -> ToolResult:
        t, self.t = self.t, self.t + 1
        before = self._cursors()
        rec = self.log.tools.get(t)
        if rec is not None:
            recorded = ToolResult(self.log.blob_text(rec["output"]), **{k: rec[k] for k in _RESULT_FIELDS if k in rec})
            # A tool that made journaled calls of its own (a sub-agent) is run again even
            # before the snapshot: its calls replay from the journal, and whatever it does
            # to the agent (adopting the sub-agent's ledger) happens again. A plain tool is
            # run again only after the snapshot, to redo its effect on the workspace.
            if rec.get("nested") or t >= self.restored_tools_done:
                live = await _invoke(tool, args, ctx)
                if live != recorded:
                    self._record("tool_diverged", {"t": t, "name": tool.spec.name, "output": digest(live.output.encode())})
                    self.warn(
                        f"run {self.run_id}: re-executed {tool.spec.name} call #{t + 1} gave a different result "
                        "than journaled; the journaled one is kept in the context"
                    )
            return recorded
        t0 = time.perf_counter()
        self._record("tool_started", {"t": t, "name": tool.spec.name})
        self.stats.seconds += time.perf_counter() - t0
        result = await _invoke(tool, args, ctx)
        t1 = time.perf_counter()
        raw = result.output.encode()
        address = digest(raw)
        fields = {k: getattr(result, k) for k in _RESULT_FIELDS}
        self._record(
            "tool_finished",
            {"t": t, "name": tool.spec.name, "output": address, "nested": self._cursors() != before, **fields},
            {address: raw},
        )
        self.stats.seconds += time.perf_counter() - t1
        return result

    def _cursors(self) -> tuple[int, int, int, int]:
        return (self.n, self.t, self.e, self.o)


async def _invoke(tool: Tool, args: dict[str, Any], ctx: ToolContext) -> ToolResult:
    # Through run_tool, so that a tool that raises gives the same error result as unwrapped.
    return await run_tool({tool.spec.name: tool}, ToolCall("", tool.spec.name, json.dumps(args)), ctx)


class JournaledModel:
    """The run's model, journaled (see :class:`RunJournal`)."""

    def __init__(self, inner: Model, journal: RunJournal) -> None:
        self.inner = inner
        self.journal = journal
        self.spec, self.provider, self.model_id = inner.spec, inner.provider, inner.model_id

    async def complete(self, request: ModelRequest) -> ModelResponse:
        return await self.journal.complete(self.inner, request)

    def pending_lost_attempts(self) -> int:
        return self.journal.pending_lost_attempts()

    async def count_tokens(self, request: ModelRequest) -> int | None:
        """The provider's own count of a prompt, where it has a count endpoint (not a
        billed call, so not journaled)."""
        count = getattr(self.inner, "count_tokens", None)
        return None if count is None else await count(request)


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
        return str(self.journal.observe(self.inner.fingerprint))


class JournaledTool:
    """A tool, journaled (see :class:`RunJournal`)."""

    def __init__(self, inner: Tool, journal: RunJournal) -> None:
        self.inner = inner
        self.journal = journal
        self.spec = inner.spec

    async def __call__(self, args: dict[str, Any], ctx: ToolContext) -> ToolResult:
        return await self.journal.call_tool(self.inner, args, ctx)


def lost_ledger_entries(lost: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """``model_lost`` records as ledger entries (``kind: lost_in_flight``)."""
    return [lost_entry(rec["step"], rec["model"], Usage.from_dict(rec["usage"]), rec["cost_usd"]) for rec in lost]

"""One run's journal while it runs: its lifecycle (create, resume, lease, finish), its
writing, and the loop's hooks; exact replay through the wrappers in ``stayer.journal.replay``.

The agent loop is not changed to be durable; it is *wrapped*: ``JournaledModel`` wraps the
model, ``JournaledTool`` each tool (``ReplayingSandbox`` and ``JournaledProbe`` the sandbox
and the breakers' probe), and ``on_step`` / ``on_event`` are the loop's hooks. Resume is deterministic replay, as in a workflow engine: the loop runs again
from the start, and

Details and rationale: docs/notes.md, ``stayer/journal/session.py``.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from stayer.errors import OrderlyStop
from stayer.events import Event, event_record
from stayer.journal.blobs import BlobError, digest
from stayer.journal.codec import canonical
from stayer.journal.digest import RequestDigest
from stayer.journal.lease import new_owner, owner_is_dead
from stayer.journal.log import (
    JOURNAL_KINDS,
    AgentEventRecord,
    ObservedRecord,
    ResumedRecord,
    RunCreatedRecord,
    RunFinishedRecord,
    RunLog,
    SnapshotRecord,
    load_log,
)
from stayer.journal.snapshot import clear_workspace
from stayer.journal.sql import utc_now
from stayer.journal.steps import StepEntryRecord
from stayer.journal.store import JournalError, RunHeld, RunRow, RunUpdate, Store, Tagged
from stayer.ledger import LedgerEntry, LostCall, OutcomeUnknown, RunReport, ToolCallEntry
from stayer.models.base import Model, ModelResponse
from stayer.money import Usd, usd_sum
from stayer.pricing import Cost, PriceBook
from stayer.records import Record
from stayer.usage import Usage
from stayer.workspace.snapshot import SnapshotNotFound, SnapshotStore

#: A lease lives this long without renewal; a running journal renews it every third of it.
LEASE_TTL_S = 30.0


class RunFinished(JournalError):
    """The run already finished; ``result`` is its report."""

    def __init__(self, message: str, result: RunReport) -> None:
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
        self.agent = "main"  # whose calls this journal records (a team thread's: its name)
        self.seq = log.next_seq
        self._events: list[tuple[str, Record | Tagged]] = []
        self._blobs: dict[str, bytes] = {}
        self._update = RunUpdate()
        self._stored: set[str] = set(log.blobs)  # addresses known to be in the store
        # The journal whose queue this one's events join, and the keys they are tagged with:
        # a run's own queue, untagged; a team thread's go to the run's, tagged with the
        # thread's name (``teams.journal``).
        self.writer: RunJournal = self
        self.tags: dict[str, str] = {}
        # Replay cursors: the n-th model call, t-th tool call, e-th agent event and o-th
        # observation of the run, counted the same way on every replay.
        self.n = self.t = self.e = self.o = 0
        self.steps_done = 0
        self.restored_tools_done = 0
        self.restored_step = 0  # the step whose snapshot the workspace was restored from
        self.snapshot_step = max((s.step for s in log.snapshots), default=-1)
        self.steps_cost = Usd()
        self.lost: list[LostCall] = list(log.lost)
        # The run's outcome_unknown records, a team's threads' too (one per call: see
        # ``outcome_unknown``).
        self.unknown: list[OutcomeUnknown] = [
            *log.unknown,
            *(u for thread in log.threads.values() for u in thread.unknown),
        ]
        # Model calls answered since the last step was recorded (the step's own call, its
        # sub-agents' and summariser's): see ``cut_short``.
        self._unstepped: list[tuple[Model, ModelResponse]] = []
        self.request_digest = RequestDigest()

    # --- opening --------------------------------------------------------------------

    @classmethod
    def create(
        cls,
        store: Store,
        run_id: str,
        header: dict[str, Any],
        workspace: Path,
        prices: PriceBook,
        *,
        owner: str | None = None,
        ttl_s: float | None = None,
        **kw: Any,
    ) -> RunJournal:
        """``owner``: the lease owner id to write under (default: a new one of this
        process); a worker passes the one its run's claim leased. ``ttl_s``: the lease's
        length (default ``LEASE_TTL_S``)."""
        owner, now = owner or new_owner(), utc_now()
        ttl_s = LEASE_TTL_S if ttl_s is None else ttl_s
        row = RunRow(run_id, header["task"], header["model"], "running", 0, "0", now, now, header)
        store.create_run(row, owner, ttl_s)
        journal = cls(
            store,
            run_id,
            owner,
            RunLog(run_id, header=header),
            workspace,
            prices,
            started=now,
            ttl_s=ttl_s,
            **kw,
        )
        journal.record("run_created", RunCreatedRecord(header), durable=True)
        return journal

    @staticmethod
    def load(store: Store, run_id: str) -> tuple[RunRow, RunLog]:
        """A run's row and journal, read-only. JournalError for an unknown run, RunFinished
        (carrying its result) for one that has finished."""
        row = store.run(run_id)
        if row is None:
            raise JournalError(
                f"run {run_id}: no such run in {store.location}; `stayer runs` lists the runs there"
            )
        log = load_log(store, run_id)
        if log.finished is not None:
            result = RunReport.read(log.blobs[log.finished.result])
            raise RunFinished(
                f"run {run_id} already finished ({log.finished.status}); nothing to resume",
                result,
            )
        if not log.events:
            raise JournalError(
                f"run {run_id}: its journal in {store.location} is empty or unreadable; start it again"
            )
        return row, log

    @classmethod
    def reopen(
        cls,
        store: Store,
        row: RunRow,
        log: RunLog,
        workspace: Path,
        prices: PriceBook,
        *,
        owner: str | None = None,
        ttl_s: float | None = None,
        **kw: Any,
    ) -> RunJournal:
        """Take the lease of a run :meth:`load` returned, to continue it (as ``owner``, a
        lease the caller may already hold, for ``ttl_s``). RunHeld if another live process
        holds it."""
        owner, ttl_s = owner or new_owner(), LEASE_TTL_S if ttl_s is None else ttl_s
        holder = store.claim(row.id, owner, ttl_s, owner_is_dead)
        if holder is not None:
            raise RunHeld(
                f"run {row.id} is being run by another process ({holder}); wait for it to finish, "
                "or for its lease to expire if that process is gone",
                holder,
            )
        journal = cls(
            store, row.id, owner, log, workspace, prices, started=row.started, ttl_s=ttl_s, **kw
        )
        if log.torn:
            store.truncate(row.id, owner, log.next_seq - 1)
            journal.warn(
                f"run {row.id}: dropped {log.torn} torn event(s) at the end of the journal"
            )
        journal.record("resumed", ResumedRecord(owner, log.next_seq, log.torn), durable=True)
        return journal

    def release(self) -> None:
        """Give the lease up without finishing (a resume that could not start)."""
        self.store.release(self.run_id, self.owner)

    def restore_workspace(self, materialise: Callable[[Path], None]) -> None:
        """Put the workspace back as of the newest usable snapshot (or lay it out afresh)."""
        t0 = time.perf_counter()
        for snap in reversed(self.log.snapshots):
            try:
                self.snapshots.restore(snap.id, self.workspace)
            except (BlobError, SnapshotNotFound, OSError, ValueError, KeyError) as e:
                self.warn(
                    f"run {self.run_id}: snapshot of step {snap.step} unusable ({e}); trying an older one"
                )
                continue
            self.restored_tools_done, self.snapshot_step = snap.tools_done, snap.step
            self.restored_step = self.snapshot_step
            break
        else:
            clear_workspace(self.workspace)
            materialise(self.workspace)
            self.restored_tools_done, self.snapshot_step, self.restored_step = 0, -1, 0
        self.stats.seconds += time.perf_counter() - t0

    # --- writing --------------------------------------------------------------------

    def record(
        self,
        kind: str,
        data: Record,
        blobs: Mapping[str, bytes] | None = None,
        *,
        durable: bool = False,
        sync: bool = True,
        update: RunUpdate | None = None,
    ) -> None:
        """Queue an event (``data``: its record, encoded by the store);
        ``durable`` writes it (and everything queued) now. ``update``: what the write
        changes in the run's row."""
        w = self.writer
        w._events.append((kind, Tagged(data, self.tags) if self.tags else data))
        for address, raw in (blobs or {}).items():
            if address not in w._stored:
                w._blobs[address] = raw
        if update is not None:
            w._update = w._update.merged(update)
        if durable:
            self.flush(sync=sync)

    def flush(self, *, sync: bool = True) -> None:
        """Write every pending event, in one transaction (``sync``: see ``Store.append``)."""
        if not self._events:
            return
        self.store.append(
            self.run_id,
            self.owner,
            self.seq,
            self._events,
            self._blobs,
            self._update,
            sync=sync,
        )
        self.seq += len(self._events)
        self.stats.events += len(self._events)
        self.stats.writes += 1
        self._stored.update(self._blobs)
        self._events, self._blobs, self._update = [], {}, RunUpdate()

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
            # the renewals' own failure (a database away) must not replace the body's
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task

    def finish(self, report: RunReport | dict[str, Any]) -> None:
        """Journal the run's report (its JSON in a blob) and end the run with its status
        (a result document is read as a report first)."""
        if not isinstance(report, RunReport):
            report = RunReport.read(report)
        raw = canonical(report.to_json())
        address = digest(raw)
        self.record(
            "run_finished",
            RunFinishedRecord(report.status, address),
            {address: raw},
            durable=True,
            update=RunUpdate(status=report.status, steps=report.steps, cost=report.cost_usd),
        )
        self.store.release(self.run_id, self.owner)

    # --- what the wrappers (stayer.journal.replay) and the loop's hooks share -----------

    def cursors(self) -> tuple[int, int, int, int]:
        """Where replay stands: model calls, tool calls, agent events, observations."""
        return (self.n, self.t, self.e, self.o)

    def answered(self, inner: Model, response: ModelResponse) -> None:
        """A model call was answered (live or from the journal): it belongs to the step
        being taken, which ``on_step`` or ``cut_short`` records."""
        self._unstepped.append((inner, response))

    def read_outside(
        self, compute: Callable[[], Any], keep: Callable[[Any], bool] | None = None
    ) -> Any:
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
            self.record("observed", ObservedRecord(i, value))
        return value

    async def observe_waiting(self, compute: Callable[[], Awaitable[Any]]) -> Any:
        """``observe`` for a value that takes waiting for (a message from another agent):
        awaited and journaled live, the journaled one at once on replay."""
        i = self.o
        self.o += 1
        if i in self.log.observations:
            return self.log.observations[i]
        value = await compute()
        self.record("observed", ObservedRecord(i, value))
        return value

    def clock(self) -> float:
        """The loop's clock: live time, journaled; the journaled time on replay."""
        return float(self.read_outside(time.time))

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
            self.record(
                "step",
                StepEntryRecord(entry.step, entry),
                update=RunUpdate(steps=entry.step, cost=self.cost_text()),
            )
        if entry.step > self.snapshot_step:
            self.take_snapshot(entry.step)
        self.stats.seconds += time.perf_counter() - t0

    def cut_short(self) -> LedgerEntry | None:
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
            return self.log.steps[step]
        usage, cost = Usage(), Usd()
        for inner, response in self._unstepped:
            usage += response.usage
            cost += self.prices.cost(
                response.usage, inner.model_id, inner.provider, response.service_tier
            ).total
        first_model, first = self._unstepped[0]
        calls = [
            ToolCallEntry(id=c.id, name=c.name, is_error=True, exit_code=None)
            for c in first.message.tool_calls
        ]
        entry = LedgerEntry(
            agent=self.agent,
            step=step,
            kind="cut_short",
            model=first_model.spec,
            model_calls=len(self._unstepped),
            usage=usage,
            cost=Cost(cost.amount, None, None, first_model.spec),
            cache_hit_ratio=round(usage.cache_hit_ratio, 4),
            latency_s=round(sum(r.latency_s for _, r in self._unstepped), 4),
            tool_calls=calls,
            tool_errors=len(calls),
        )
        self._unstepped.clear()
        self.steps_done = step
        self.steps_cost += cost
        self.record(
            "step",
            StepEntryRecord(step, entry),
            update=RunUpdate(steps=step, cost=self.cost_text()),
        )
        return entry

    def take_snapshot(self, step: int) -> None:
        snapshot_id = self.snapshots.snapshot(self.workspace)
        self.record(
            "snapshot",
            SnapshotRecord(step=step, id=snapshot_id, tools_done=self.t, model_calls=self.n),
        )
        self.snapshot_step = step

    def on_event(self, event: Event) -> None:
        """The loop's ``on_event``: any structured event, stored as ``event_record`` gives
        it (its payload in a blob) and, on replay, checked against the journaled one."""
        t0 = time.perf_counter()
        kind, payload = event_record(event)
        i, self.e = self.e, self.e + 1
        raw = canonical(payload)
        address = digest(raw)
        stored_kind = f"agent:{kind}" if kind in JOURNAL_KINDS else kind
        recorded = self.log.agent_events.get(i)
        if recorded is None:
            self.record(stored_kind, AgentEventRecord(i, address), {address: raw})
        elif recorded != (stored_kind, address):
            self.warn(
                f"run {self.run_id}: replay emitted a different {kind!r} event than the journal holds (#{i})"
            )
        self.stats.seconds += time.perf_counter() - t0

    def outcome_unknown(self, rec: OutcomeUnknown) -> None:
        """Journal that a call's outcome is unknown: once per call (its idempotency key),
        however many resumes decide it again."""
        if any(u.idempotency_key == rec.idempotency_key for u in self.unknown):
            return
        self.unknown.append(rec)
        self.record("outcome_unknown", rec)

    def cost_text(self) -> str:
        return str(self.steps_cost + usd_sum(lost.cost.total for lost in self.lost))


def lost_ledger_entries(lost: Sequence[LostCall]) -> list[LedgerEntry]:
    """``model_lost`` records as ledger entries (``kind: lost_in_flight``), each with the
    agent (a team's thread) whose call it was."""
    return [rec.entry() for rec in lost]

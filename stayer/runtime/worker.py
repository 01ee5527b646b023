"""``stayer worker``: claim runs from the queue and run them, many at once, with leases.

A worker is an asyncio loop with ``concurrency`` slots. For each free slot it claims the
oldest queued run (or a running one whose worker died: its lease expired) and runs it
through the same code as ``stayer run`` (``stayer.run.prepare`` / ``execute``) on the
shared journal, so a run another worker started is resumed from its journal, exactly and
without paying again for its model calls. While a run executes, a heartbeat renews the
lease and reads the cancel flag; a cancelled run stops at its next step, and what it spent
is on its ledger and its result. Before a run starts, its cap is held in its tenant's
budget (``tenants``); a run that does not fit waits as ``paused``.

Details and rationale: docs/notes.md, ``stayer/runtime/worker.py``.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import sys
import time
import traceback
from collections.abc import Callable
from decimal import Decimal
from pathlib import Path
from typing import Any

from stayer import pgpool
from stayer.errors import BudgetReached, ConfigError, OrderlyStop
from stayer.journal import JournalError, open_store
from stayer.journal.lease import new_owner
from stayer.journal.run_report import journal_spend
from stayer.journal.sql import SqlStore
from stayer.journal.store import RunHeld, StoreUnavailable
from stayer.ledger import LedgerEntry, RunReport, RunResult
from stayer.money import Usd, usd_sum
from stayer.pricing import PriceBook
from stayer.records import Record, encode, to_json
from stayer.runtime.actions import (
    Actions,
    Gate,
    RunSuspended,
    Suspended,
    close_journal,
    last_context_tokens,
    note_in_journal,
    pause_price,
)
from stayer.runtime.db import (
    CANCELLED,
    ERROR,
    PAUSED,
    REQUIRES_ACTION,
    RUNNING,
    ServiceDB,
    ServiceRun,
)
from stayer.runtime.tenants import TenantBudgets, open_budget_store
from stayer.runtime.uploads import TaskUploads
from stayer.runtime.webhooks import RunStatusHook, Webhooks

#: How often an idle worker looks for holds of ended runs left open (``settle_ended``).
SWEEP_S = 5.0
TASK_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")


class RunCancelled(OrderlyStop):
    """Raised at a step boundary of a run whose cancel was requested."""


class RunHandedBack(OrderlyStop):
    """Raised at a step boundary of a run its draining worker gives back."""


class Backoff:
    """Waits that double from ``first`` up to ``most`` seconds, until reset."""

    def __init__(self, first: float = 0.2, most: float = 5.0) -> None:
        self.first, self.most, self.wait = first, most, first

    def next(self) -> float:
        wait, self.wait = self.wait, min(self.wait * 2, self.most)
        return wait

    def reset(self) -> None:
        self.wait = self.first


def resolve_task(
    tasks_dir: Path, name: str, uploads: TaskUploads | None = None, tenant: str = ""
) -> Path:
    """The task ``name``: the tenant's upload of that name (from the store, unpacked on
    this machine), else the one in the server's ``tasks_dir``; never a path outside it."""
    if not TASK_NAME.fullmatch(name) or name in (".", ".."):
        raise ConfigError(f"task {name!r}: a task name is letters, digits, '.', '_' and '-'")
    uploaded = uploads.path(tenant, name) if uploads is not None else None
    if uploaded is not None:
        return uploaded
    for root in (tasks_dir,):
        if not root.is_dir():
            continue
        base = root.resolve()
        path = (base / name).resolve()
        if path.parent == base and (path / "instruction.md").is_file():
            return path
    raise ConfigError(
        f"task {name!r}: no such task (upload it with POST /v1/tasks, or ask for one in the server's tasks)"
    )


class WorkerHealth(Record, kw_only=True):
    """The worker's ``/healthz`` document: ``ok`` or ``unavailable`` (and why), its runs
    and slots, whether it drains."""

    status: str
    store: str  # "ok", or why the database did not answer last time
    runs: int
    slots: int
    draining: bool


class Worker:
    def __init__(
        self,
        home: Path,
        tasks_dir: Path,
        *,
        concurrency: int = 4,
        lease_ttl_s: float = 30.0,
        drain_timeout_s: float = 30.0,
        poll_s: float = 0.2,
        sandbox: str = "bwrap",
        webhooks: Webhooks | None = None,
        log: Callable[[str], None] | None = None,
        otlp: str | None = None,
    ) -> None:
        self.home = Path(home)
        self.tasks_dir = Path(tasks_dir)
        self.concurrency = concurrency
        self.lease_ttl_s = lease_ttl_s
        self.drain_timeout_s = drain_timeout_s
        self.poll_s = poll_s
        self.draining = False  # stopping: runs are handed back at their next step boundary
        self.cut_short = False  # the drain's deadline passed: runs are handed back at once
        self.store_problem: str | None = None  # why the database did not answer last time
        self.sandbox = sandbox
        self.name = new_owner()
        self.webhooks = webhooks or Webhooks()
        self.log = log or (lambda msg: print(f"stayer worker: {msg}", file=sys.stderr))
        pgpool.limit_idle_transactions(lease_ttl_s)  # a stalled worker's locks go with its leases
        store = open_store(self.home)
        assert isinstance(store, SqlStore)
        self.store: SqlStore = store
        self.db: ServiceDB = ServiceDB(store)
        self.actions: Actions = Actions(store)
        self.uploads = TaskUploads(store, self.home)
        self.budgets: TenantBudgets = TenantBudgets(open_budget_store(self.home))
        self.prices: PriceBook = PriceBook.load()
        self.running: dict[str, asyncio.Task[None]] = {}
        self._next_sweep = 0.0  # when to look for holds a dead process left open
        from stayer.telemetry.metrics import WorkerMetrics

        self.metrics: WorkerMetrics = WorkerMetrics()
        self.tracing: Any = None  # an OpenTelemetry TracerProvider, when traces are configured
        from stayer.telemetry import tracing_configured

        if tracing_configured(otlp):
            from stayer.telemetry.tracing import provider

            self.tracing = provider(otlp, service_name="stayer-worker")

    def _forget(self, run_id: str) -> Callable[[asyncio.Task[None]], None]:
        """A done-callback dropping a finished run from ``running``."""

        def forget(_task: asyncio.Task[None]) -> None:
            self.running.pop(run_id, None)

        return forget

    def health(self) -> tuple[bool, WorkerHealth]:
        """Whether the worker can work (its database answered last time), and a summary."""
        ok = self.store_problem is None
        return ok, WorkerHealth(
            status="ok" if ok else "unavailable",
            store=self.store_problem or "ok",
            runs=len(self.running),
            slots=self.concurrency,
            draining=self.draining,
        )

    def _store_down(self, e: StoreUnavailable) -> None:
        if self.store_problem is None:
            self.log(f"{e}; retrying with backoff")
        self.store_problem = str(e)

    def _store_up(self) -> None:
        if self.store_problem is not None:
            self.log("the database answers again")
        self.store_problem = None

    async def serve(self, stop: asyncio.Event) -> None:
        """Claim and run until ``stop`` is set; then drain (see the module's docstring)."""
        backoff = Backoff()
        try:
            while not stop.is_set():
                wait = self.poll_s
                if len(self.running) < self.concurrency:
                    down = False
                    try:
                        claimed = self.db.claim_next(new_owner(), self.lease_ttl_s)
                    except StoreUnavailable as e:
                        self._store_down(e)
                        claimed, wait, down = None, backoff.next(), True
                    else:
                        self._store_up()
                        backoff.reset()
                    if claimed is not None:
                        task = asyncio.create_task(self._guarded(claimed))
                        self.running[claimed.id] = task
                        task.add_done_callback(self._forget(claimed.id))
                        continue
                    # Nothing queued: a hold a dead process left open? Room freed in a
                    # tenant's budget? (Not while the database is away: backoff first.)
                    try:
                        if not down and time.monotonic() >= self._next_sweep:
                            self._next_sweep = time.monotonic() + SWEEP_S
                            settle_ended(self.db, self.budgets)
                        if not down:
                            self._admit()
                    except StoreUnavailable as e:
                        self._store_down(e)
                        wait = backoff.next()
                with contextlib.suppress(TimeoutError):  # (not wait_for: see teams.bus)
                    async with asyncio.timeout(wait):
                        await stop.wait()
            await self._drain()
        finally:
            await self.webhooks.aclose()
            if self.tracing is not None:
                self.tracing.shutdown()
            self.store.close()

    async def _drain(self) -> None:
        """Hand every run back by ``drain_timeout_s``: at its next step boundary, or, for
        one still inside a step near the deadline, cut short there (the journal keeps
        every step done; a call in flight is issued again by the run's next worker)."""
        self.draining = True
        if not self.running:
            return
        # The last fifth (at most 5 s) is left to the runs cut short to clean up.
        grace = min(5.0, self.drain_timeout_s / 5)
        tasks = list(self.running.values())
        self.log(f"draining: handing {len(tasks)} run(s) back at their next step")
        _, pending = await asyncio.wait(tasks, timeout=self.drain_timeout_s - grace)
        if pending:
            self.log(f"draining: {len(pending)} run(s) still inside a step; cut short")
            self.cut_short = True
            for task in pending:
                task.cancel()
            await asyncio.wait(pending, timeout=grace)

    async def _guarded(self, run: ServiceRun) -> None:
        self.metrics.active.inc()
        try:
            await self._run(run)
        except StoreUnavailable as e:
            await self._hand_back_later(run, e)
        except Exception as e:  # a bug must not take the worker (and its other runs) down
            self.log(f"run {run.id} failed in the worker: {e}\n{traceback.format_exc()}")
            self._fail(run, f"{type(e).__name__}: {e}")
        finally:
            self.metrics.active.dec()

    def _hand_back(self, run: ServiceRun, why: str, *, after_journal_lease: bool = False) -> None:
        """Give the run up unfinished; its next worker resumes it from its journal (its
        budget hold stays with it)."""
        try:
            if self.db.hand_back(run.id, self._owner(run), after_journal_lease=after_journal_lease):
                self.log(f"run {run.id}: handed back ({why})")
        except StoreUnavailable as e:  # its lease expires instead
            self._store_down(e)

    async def _hand_back_later(self, run: ServiceRun, e: StoreUnavailable) -> None:
        """The database went away under the run: hand it back as soon as it answers (by
        then its lease may have expired, and another worker may hold it: nothing to do)."""
        self._store_down(e)
        backoff, give_up = Backoff(), time.monotonic() + self.lease_ttl_s
        while time.monotonic() < give_up and not self.cut_short:
            await asyncio.sleep(backoff.next())
            try:
                self.db.hand_back(run.id, self._owner(run))
            except StoreUnavailable as again:
                self._store_down(again)
                continue
            self._store_up()
            self.log(f"run {run.id}: handed back (the database was away)")
            return

    @staticmethod
    def _owner(run: ServiceRun) -> str:
        """The lease owner id the run was claimed under (its journal writes under it too)."""
        assert run.worker is not None
        return run.worker

    def _set(self, run: ServiceRun, *, release: bool = False, **values: Any) -> bool:
        """Write the run's row while this worker holds it; False if another took it over."""
        if not self.db.update(run.id, self._owner(run), release=release, **values):
            return False
        if "status" in values:
            self._notify(run, values["status"], values.get("stop_reason"))
        return True

    def _fail(self, run: ServiceRun, error: str) -> None:
        """The run ends in error; its hold is settled at what its journal says it spent
        (nothing, for a run that never started). A run another worker took over keeps its
        hold: that worker settles it."""
        if self._set(run, status=ERROR, stop_reason="error", error=error, release=True):
            settle_hold(self.budgets, run, store=self.store)
            self._admit()

    def _pause(self, run: ServiceRun, paused_on: str) -> None:
        """The run waits on a budget (``paused_on``: "tenant" or "run") holding only what it
        has spent: the rest of its cap goes back to its tenant, for other runs to start."""
        freed = shrink_hold(self.budgets, self.store, run)
        self._set(
            run,
            status=PAUSED,
            stop_reason="budget_reached",
            paused_on=paused_on,
            budget_hold=run.budget_hold,
            held=run.held,
            release=True,
        )
        if freed:
            self._admit()

    def _admit(self) -> None:
        """Queue again the runs paused on their tenant's budget that now fit in it."""
        admit_paused(self.db, self.budgets)

    def _notify(self, run: ServiceRun, status: str, stop_reason: str | None) -> None:
        url = run.request.webhook
        secret = self.db.webhook_secret(run.tenant)
        if url and secret:
            self.webhooks.send(
                url, secret, RunStatusHook(run_id=run.id, status=status, stop_reason=stop_reason)
            )

    def _hold_budget(self, run: ServiceRun) -> Decimal | None | bool:
        """The run's cap, held from its tenant's budget; False when it does not fit.

        The cap is ``run_cap`` (set when the run was first admitted, or raised since by a
        person) or the request's ``max_cost``; the hold is grown to it in one transaction
        (``TenantBudgets.regrow``), so a raised cap is covered before the run uses it."""
        asked = run.run_cap or run.request.max_cost
        cap = Decimal(asked) if asked is not None else None
        account = self.budgets.account(run.tenant)
        if account.cap is None and run.budget_hold is None:
            if cap is not None and run.run_cap is None:
                self.db.update(run.id, self._owner(run), run_cap=str(cap))
                run.run_cap = str(cap)
            return cap
        if cap is None:  # what the tenant can afford, up to the server's default cap
            cap = account.available
            default = run.request.max_cost_default
            if cap is not None and isinstance(default, str):
                cap = min(cap, Decimal(default))
        if run.budget_hold is not None and run.held == str(cap):
            return cap
        hold = (
            self.budgets.regrow(run.tenant, run.budget_hold, cap)
            if cap is not None and cap > 0
            else None
        )
        if hold is None:
            return False
        self.db.update(run.id, self._owner(run), budget_hold=hold, held=str(cap), run_cap=str(cap))
        run.budget_hold, run.held, run.run_cap = hold, str(cap), str(cap)
        return cap

    async def _run(self, run: ServiceRun) -> None:
        from stayer.eval.resume import prepare_resume
        from stayer.run import Controls, Inbox, RunSettings, execute, prepare

        if run.cancel_requested:
            self._finish(run, close_idle_journal(self.store, run.id, CANCELLED, "cancelled"))
            return
        owner = self._owner(run)
        cap = self._hold_budget(run)
        if cap is False:
            self._pause(run, "tenant")
            return
        self._notify(run, "running", None)
        req = run.request
        try:
            # Here, whichever machine first ran it: an upload is unpacked from the store.
            task_dir = str(resolve_task(self.tasks_dir, run.task, self.uploads, run.tenant))
            if self.store.run(run.id) is None:
                config = RunSettings(
                    task_dir=task_dir,
                    model=run.model,
                    max_steps=req.max_steps,
                    max_cost=cap if isinstance(cap, Decimal) else None,
                    run_id=run.id,
                    sim_policy=req.sim_policy,
                    sim_latency=req.sim_latency,
                    sandbox=self.sandbox,
                    policy=req.policy or RunSettings.policy,
                    team=req.team,
                    mcp_servers=req.mcp_servers,
                    mcp_tools=req.mcp_tools or RunSettings.mcp_tools,
                    allow_private_mcp=self.webhooks.allow_private,
                )
                prepared, journal = prepare(config, self.prices, store=self.store), None
                prepared.lease_owner, prepared.lease_ttl_s = owner, self.lease_ttl_s
            else:
                prepared, journal = prepare_resume(
                    run.id,
                    store=self.store,
                    prices=self.prices,
                    owner=owner,
                    ttl_s=self.lease_ttl_s,
                    task_dir=task_dir,
                    allow_private_mcp=self.webhooks.allow_private,  # this worker's rule
                )
        except StoreUnavailable:
            raise
        except RunHeld as e:  # someone else (`stayer resume`?) runs it: wait for its lease
            self._hand_back(run, f"held by {e.holder}", after_journal_lease=True)
            return
        except ConfigError as e:  # RunFinished included: its result is taken as it is
            result = getattr(e, "result", None)
            if result is not None:
                self._finish(run, result)
            else:
                self._fail(run, str(e))
            return

        entries: list[LedgerEntry] = []
        cancel = asyncio.Event()

        totals = RunResult(
            status=RUNNING
        )  # running sums (unknown stays unknown), for the run's row

        def replayed(entry: LedgerEntry) -> bool:
            """A step a resumed run replays from its journal: the row has it already."""
            log = None if journal is None else journal.log
            if log is not None and entry.agent != "main":
                log = log.threads.get(entry.agent)
            return log is not None and entry.step in log.steps

        def on_step(entry: LedgerEntry) -> None:
            self.metrics.on_step(entry, entries[-1] if entries else None, self.prices)
            entries.append(entry)
            totals.usage += entry.usage
            totals.add_cost(entry.cost.total)
            if not replayed(entry):  # the row never shows less than was already spent
                # Billed calls count from when the journal knows them: lost in flight too.
                lost = [] if journal is None else journal.lost
                cost = Usd(totals.cost_usd) + usd_sum(x.cost.total for x in lost)
                usage = sum((x.usage for x in lost), totals.usage)
                steps = (
                    entry.step if entry.agent == "main" else len(entries)
                )  # a team's steps: all its agents'
                self.db.update(
                    run.id,
                    owner,
                    steps=steps,
                    cost_usd=str(cost),
                    usage=_json(usage.to_dict()),
                )
            if cancel.is_set():
                raise RunCancelled
            if self.draining:
                raise RunHandedBack

        confirm = req.confirm_tools
        gate = Gate(self.actions, run.id, confirm) if confirm else None
        controls = Controls(
            gate=gate,
            inbox=Inbox(lambda after: self.db.messages_after(run.id, after)),
            pause_at_cap=True,
            cap=lambda: cap if isinstance(cap, Decimal) else None,  # as held at admission
        )
        if self.tracing is not None:
            from stayer.telemetry.tracing import execute_traced

            running = execute_traced(
                prepared, on_step, self.tracing, journal=journal, controls=controls
            )
        else:
            running = execute(prepared, on_step, journal=journal, controls=controls)
        execution = asyncio.create_task(running)
        beat = asyncio.create_task(self._heartbeat(run, cancel, execution))
        try:
            report = await execution  # what the service stores and sends
        except RunCancelled:
            report = close_idle_journal(self.store, run.id, CANCELLED, "cancelled")
        except RunHandedBack:
            self._hand_back(run, "this worker is draining")
            return
        except RunSuspended as s:
            self._await_decision(run, prepared.model, s)
            return
        except BudgetReached as e:
            note_in_journal(
                self.store,
                run.id,
                [Suspended(status=PAUSED, reason="budget_reached", detail=str(e))],
            )
            self._pause(run, "run")
            return
        except asyncio.CancelledError:
            if self.cut_short:
                self._hand_back(run, "cut short: the drain's deadline")
                raise
            if not beat.done() or beat.result() != "lost":
                raise
            self.log(f"run {run.id}: lost its lease to another worker; stopped here")
            return
        except StoreUnavailable:
            raise
        except JournalError as e:
            self._fail(run, str(e))
            return
        finally:
            beat.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await beat
        self._finish(run, report)

    def _await_decision(self, run: ServiceRun, model: Any, suspended: RunSuspended) -> None:
        """The run waits for a person: priced, journaled, and given up by this worker."""
        action = suspended.action
        price = pause_price(model, self.prices, last_context_tokens(self.store, run.id))
        self.actions.set_price(run.id, action.n, price)
        action.price = price
        note_in_journal(
            self.store,
            run.id,
            [
                action.note(),
                Suspended(status=REQUIRES_ACTION),
            ],
        )
        self._set(run, status=REQUIRES_ACTION, stop_reason=REQUIRES_ACTION, release=True)

    async def _heartbeat(
        self, run: ServiceRun, cancel: asyncio.Event, execution: asyncio.Task[Any]
    ) -> str:
        """Renew the run's lease; cancel the run when it is lost (another worker took it,
        or the database was away for longer than the lease)."""
        renewed = time.monotonic()
        while True:
            await asyncio.sleep(min(self.lease_ttl_s / 3, 1.0))
            try:
                ours, cancel_requested = self.db.renew(run.id, self._owner(run), self.lease_ttl_s)
            except StoreUnavailable as e:
                self._store_down(e)
                if time.monotonic() - renewed < self.lease_ttl_s:
                    continue
                ours, cancel_requested = False, False  # expired: another may hold it now
            else:
                renewed = time.monotonic()
            if not ours:
                self.metrics.leases_lost.inc()
                execution.cancel()
                return "lost"
            if cancel_requested:
                cancel.set()

    def _finish(self, run: ServiceRun, report: RunReport) -> None:
        settle_hold(self.budgets, run, report)
        self._admit()
        self._set(
            run,
            status=report.status,
            stop_reason=report.stop_reason or None,
            steps=report.steps,
            cost_usd=report.cost_usd,
            reward=report.reward,
            error=report.error,
            usage=encode(report.usage).decode(),
            release=True,
        )


def serve_health(worker: Worker, port: int) -> Any:
    """Serve the worker's ``/metrics`` (Prometheus) and ``/healthz`` (200 while its
    database answers, else 503) on 127.0.0.1:``port``, from a thread; the server."""
    import json
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            path = self.path.split("?", 1)[0]
            if path == "/healthz":
                ok, doc = worker.health()
                body, kind, status = json.dumps(to_json(doc)).encode(), "application/json", 200
                if not ok:
                    status = 503
            elif path == "/metrics":
                body, kind = generate_latest(worker.metrics.registry), CONTENT_TYPE_LATEST
                status = 200
            else:
                body, kind, status = b'{"detail":"not found"}', "application/json", 404
            self.send_response(status)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(body)))
            if status == 503:
                self.send_header("Retry-After", "2")
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *_args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True, name="worker-health").start()
    return server


def settle_hold(
    budgets: TenantBudgets,
    run: ServiceRun,
    report: RunReport | None = None,
    *,
    store: SqlStore | None = None,
) -> None:
    """Settle the run's hold on its tenant's budget at what the run spent: its
    ``report``'s cost, else what its journal in ``store`` holds (``journal_spend``:
    nothing for a run that never started). The whole hold when a price is unknown: the
    tenant is never charged less than it may have spent. Every path on which a run ends
    (or is given up for good) calls this; settling twice is a no-op."""
    if run.budget_hold is None:
        return
    if report is not None:
        spent = report.spent
    else:
        assert store is not None
        spent = journal_spend(store, run.id)
    held = run.held or run.run_cap
    if spent.amount is not None:
        amount = spent.amount
    else:
        amount = Decimal(held) if held is not None else Decimal(0)
    budgets.settle(run.budget_hold, amount)


def settle_ended(db: ServiceDB, budgets: TenantBudgets) -> int:
    """Holds of ended runs still open (the process ending the run died before settling
    it) are settled at what the run's journal holds; every ended run's row then stops
    naming its hold. Returns how many were settled here."""
    settled = 0
    for run in db.unsettled():
        assert run.budget_hold is not None
        if budgets.is_open(run.budget_hold):
            settle_hold(budgets, run, store=db.store)
            settled += 1
        db.clear_hold(run.id, run.budget_hold)
    return settled


def shrink_hold(budgets: TenantBudgets, store: SqlStore, run: ServiceRun) -> bool:
    """A waiting run's hold cut down to what its journal says it spent (kept whole when a
    price is unknown); True if some of it went back to the tenant. ``run`` is updated."""
    if run.budget_hold is None or run.held is None:
        return False
    spent = journal_spend(store, run.id).amount
    if spent is None or spent >= Decimal(run.held):
        return False
    hold = budgets.regrow(run.tenant, run.budget_hold, spent)
    if hold is None:  # cannot happen (a smaller hold always fits); keep the old one
        return False
    run.budget_hold, run.held = hold, str(spent)
    return True


def admit_paused(db: ServiceDB, budgets: TenantBudgets) -> int:
    """Runs paused on their tenant's budget go back to the queue, oldest first, as far as
    what each still needs (its cap less what it holds; any amount for a run without a cap
    of its own) fits in what its tenant has available. The worker takes them from there
    (and pauses again one that no longer fits). Returns how many were queued."""
    queued = 0
    available: dict[str, Decimal | None] = {}
    for run in db.paused_on_tenant():
        if run.tenant not in available:
            available[run.tenant] = budgets.account(run.tenant).available
        left = available[run.tenant]
        asked = run.run_cap or run.request.max_cost
        need = Decimal(asked) - Decimal(run.held or 0) if asked is not None else None
        if left is not None:
            if left <= 0 or (need is not None and need > left):
                continue
            available[run.tenant] = left - need if need is not None else Decimal(0)
        queued += db.requeue_run(run.id)
    return queued


def close_idle_journal(store: SqlStore, run_id: str, status: str, stop_reason: str) -> RunReport:
    """The result of a run ended while no process runs it: its journal is closed with
    what it spent (a run that never started has spent nothing)."""
    from stayer.journal import RunFinished, RunJournal
    from stayer.journal.backends import stayer_home
    from stayer.run import write_result

    if store.run(run_id) is None:
        return RunReport(run_id=run_id, status=status, stop_reason=stop_reason)
    try:
        RunJournal.load(store, run_id)
    except RunFinished as e:
        return e.result
    report = close_journal(store, run_id, status, stop_reason)
    run_dir = stayer_home() / "runs" / run_id
    if run_dir.is_dir():
        write_result(run_dir, report)
    return report


def _json(value: Any) -> str:
    import json

    return json.dumps(value, separators=(",", ":"))

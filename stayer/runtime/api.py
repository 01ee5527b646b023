"""The HTTP API (FastAPI): runs, their ledgers and live event streams, per tenant.

Every ``/v1`` request carries ``Authorization: Bearer KEY``; without a valid key the answer
is 401, and another tenant's run is 404 (the same answer as a run that does not exist).
API processes hold no state: they read and write the runtime's tables and read the
journal, so any number of them can serve one database.

Stores are per thread (FastAPI runs plain ``def`` endpoints in a thread pool; SQLite
connections must stay in the thread that opened them); on PostgreSQL they borrow from one
bounded pool per process. While the database is away the API answers 503 with
``Retry-After``, and ``/healthz`` says so.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import threading
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path
from typing import Annotated, Any

from fastapi import Depends, FastAPI, Header, HTTPException, Query, Request
from fastapi.encoders import jsonable_encoder
from fastapi.exceptions import RequestValidationError
from fastapi.responses import FileResponse, JSONResponse, Response
from fastapi.staticfiles import StaticFiles
from sse_starlette.sse import EventSourceResponse, ServerSentEvent
from starlette.concurrency import run_in_threadpool

from stayer.errors import ConfigError
from stayer.journal import load_log, open_store
from stayer.journal.run_report import journal_ledger, journal_unknown
from stayer.journal.sql import SqlStore
from stayer.journal.store import StoreUnavailable
from stayer.mcp.config import check_api_servers
from stayer.pricing import PriceBook
from stayer.records import from_json, to_json
from stayer.runtime.actions import Actions
from stayer.runtime.db import (
    CANCELLED,
    MAX_SEQ,
    QUEUED,
    STATUSES,
    IdempotencyClash,
    RunRequest,
    ServiceDB,
    ServiceRun,
)
from stayer.runtime.events import PublicEvent, public_event, status_event
from stayer.runtime.schemas import (
    ActionList,
    Decision,
    Ledger,
    MessageIn,
    MessageOut,
    RunCreate,
    RunList,
    RunOut,
    RunPatch,
    TaskOut,
)
from stayer.runtime.tenants import TenantBudgets, open_budget_store
from stayer.runtime.uploads import MAX_ARCHIVE_BYTES, TaskUploads
from stayer.runtime.webhooks import RunStatusHook, Webhooks, url_problem
from stayer.runtime.worker import close_idle_journal, resolve_task, settle_hold

#: How often an open event stream looks for new journal events. The journal is the one
#: source of events for every API process, so this bounds the delivery lag.
POLL_S = 0.05
#: Seconds a client is told to wait (``Retry-After``) while the database is away.
RETRY_AFTER_S = 2
STATIC = Path(__file__).parent / "static"
# The dashboard loads nothing from elsewhere and may not be framed; no response is sniffed.
SECURITY_HEADERS = {
    "Content-Security-Policy": "default-src 'self'; script-src 'self'; style-src 'self'; connect-src 'self'; "
    "img-src 'self' data:; frame-ancestors 'none'; base-uri 'none'; form-action 'self'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "X-Frame-Options": "DENY",
}


#: The largest request body; a task archive (POST /v1/tasks) may be as large as its own cap.
MAX_BODY = 1 << 20


class BodyLimit:
    """Refuses (413) a request body over its limit, declared or streamed, before the app
    sees it: a tenant cannot make the server buffer gigabytes of JSON. The body is read
    here (up to the limit) and handed on whole."""

    def __init__(self, app: Any, limits: dict[str, int], default: int = MAX_BODY) -> None:
        self.app, self.limits, self.default = app, limits, default

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope["method"] in ("GET", "HEAD", "OPTIONS"):
            return await self.app(scope, receive, send)
        limit = self.limits.get(scope["path"], self.default)
        declared = dict(scope.get("headers") or []).get(b"content-length")
        if declared is not None and (not declared.isdigit() or int(declared) > limit):
            return await _too_large(send, limit)
        chunks, size = [], 0
        while True:
            message = await receive()
            if message["type"] != "http.request":
                return  # the client went away
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > limit:
                return await _too_large(send, limit)
            chunks.append(chunk)
            if not message.get("more_body"):
                break
        body, sent = b"".join(chunks), False

        async def replay() -> Any:
            nonlocal sent
            if not sent:
                sent = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)


async def _too_large(send: Any, limit: int) -> None:
    body = f'{{"detail":"request body over {limit} bytes"}}'.encode()
    await send(
        {
            "type": "http.response.start",
            "status": 413,
            "headers": [(b"content-type", b"application/json")],
        }
    )
    await send({"type": "http.response.body", "body": body})


class Databases:
    """One ``ServiceDB`` (with the actions table and the tenants' budgets) per thread,
    opened on first use."""

    def __init__(self, home: Path) -> None:
        self.home = home
        self._local = threading.local()
        self._all: list[SqlStore] = []
        self._lock = threading.Lock()

    def get(self) -> ServiceDB:
        db = getattr(self._local, "db", None)
        if db is None:
            store = open_store(self.home)
            assert isinstance(store, SqlStore)
            try:
                db, actions = ServiceDB(store), Actions(store)
                uploads = TaskUploads(store, self.home)
                budgets = TenantBudgets(open_budget_store(self.home))
            except BaseException:
                store.close()
                raise
            self._local.actions, self._local.budgets = actions, budgets
            self._local.uploads = uploads
            self._local.db = db
            with self._lock:
                self._all.append(store)
        return db

    def actions(self) -> Actions:
        self.get()
        return self._local.actions  # type: ignore[no-any-return]

    def uploads(self) -> TaskUploads:
        self.get()
        return self._local.uploads  # type: ignore[no-any-return]

    def budgets(self) -> TenantBudgets:
        self.get()
        return self._local.budgets  # type: ignore[no-any-return]

    def close(self) -> None:
        with self._lock:
            for store in self._all:
                # Closing from another thread may be refused; the process is ending anyway.
                with contextlib.suppress(Exception):
                    store.close()
            self._all.clear()


def tenant_of(request: Request, authorization: Annotated[str | None, Header()] = None) -> str:
    """The tenant whose API key the request carries; 401 otherwise."""
    scheme, _, key = (authorization or "").partition(" ")
    key = key.strip()
    dbs: Databases = request.app.state.databases
    tenant = dbs.get().tenant_for_key(key) if scheme.lower() == "bearer" and key else None
    if tenant is None:
        raise HTTPException(
            401, "missing or invalid API key", headers={"WWW-Authenticate": "Bearer"}
        )
    return tenant


Tenant = Annotated[str, Depends(tenant_of)]


def create_app(
    home: Path,
    tasks_dir: Path,
    *,
    allow_private_webhooks: bool = False,
    metrics_token: str | None = None,
    worker_registry: Any = None,
    default_max_cost: Decimal = Decimal(1),
) -> FastAPI:
    from stayer._version import __version__

    app = FastAPI(
        title="stayer",
        version=__version__,
        description="Long-horizon agent runs as a service: exact cost per step, budgets that never overshoot.",
    )
    dbs = Databases(home)
    app.state.databases = dbs
    prices = PriceBook.load()
    webhooks = Webhooks(allow_private=allow_private_webhooks)

    def out(run: ServiceRun) -> RunOut:
        pending = dbs.actions().pending(run.id) if run.status == "requires_action" else None
        return RunOut.of(run, pending.view() if pending else None)

    def own_run(run_id: str, tenant: str) -> Any:
        run = dbs.get().run(run_id, tenant)
        if run is None:
            raise HTTPException(404, f"no run {run_id!r}")
        return run

    app.add_middleware(BodyLimit, limits={"/v1/tasks": MAX_ARCHIVE_BYTES})

    @app.middleware("http")
    async def security_headers(request: Request, call_next: Any) -> Any:
        response = await call_next(request)
        response.headers.update(SECURITY_HEADERS)
        return response

    app.mount("/static", StaticFiles(directory=STATIC), name="static")

    @app.get("/", include_in_schema=False)
    def dashboard() -> FileResponse:
        """The dashboard: a few static files; it signs in with a tenant's API key."""
        return FileResponse(STATIC / "index.html")

    @app.exception_handler(RequestValidationError)
    async def invalid_request(_request: Request, exc: RequestValidationError) -> JSONResponse:
        # FastAPI's own answer, save that what it echoes of the request is made UTF-8 (the
        # input of a refused lone surrogate would make the refusal itself a 500).
        return JSONResponse({"detail": utf8_safe(jsonable_encoder(exc.errors()))}, 422)

    @app.exception_handler(ConfigError)
    async def config_error(_request: Request, exc: ConfigError) -> JSONResponse:
        return JSONResponse({"detail": str(exc)}, status_code=422)

    @app.exception_handler(StoreUnavailable)
    async def store_unavailable(_request: Request, exc: StoreUnavailable) -> JSONResponse:
        return JSONResponse(
            {"detail": str(exc)},
            status_code=503,
            headers={"Retry-After": str(RETRY_AFTER_S)},
        )

    @app.get("/metrics", include_in_schema=False)
    def metrics(authorization: Annotated[str | None, Header()] = None) -> Response:
        """Prometheus text. Every tenant's spend is in it, so it takes its own token
        (``--metrics-token``), never a tenant's key; without one it is off."""
        import hmac

        from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

        from stayer.telemetry.metrics import ServiceCollector

        if not metrics_token:
            raise HTTPException(404, "metrics are off; start stayer serve with --metrics-token")
        scheme, _, given = (authorization or "").partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(
            given.strip().encode(), metrics_token.encode()
        ):
            raise HTTPException(
                401, "missing or invalid metrics token", headers={"WWW-Authenticate": "Bearer"}
            )
        registry = CollectorRegistry()
        registry.register(ServiceCollector(dbs.get, dbs.budgets))
        text = generate_latest(registry) + (
            generate_latest(worker_registry) if worker_registry is not None else b""
        )
        return Response(text, media_type=CONTENT_TYPE_LATEST)

    @app.get("/healthz", include_in_schema=False)
    def healthz() -> JSONResponse:
        """200 while the store answers; 503 (with ``Retry-After``) while it does not."""
        try:
            dbs.get().store.ping()
        except StoreUnavailable as e:
            return JSONResponse(
                {"status": "unavailable", "store": str(e)},
                status_code=503,
                headers={"Retry-After": str(RETRY_AFTER_S)},
            )
        return JSONResponse({"status": "ok", "store": "ok"})

    @app.post("/v1/runs", status_code=201, response_model=RunOut)
    def create_run(
        body: RunCreate,
        tenant: Tenant,
        response: Response,
        idempotency_key: Annotated[str | None, Header()] = None,
    ) -> RunOut:
        """Queue a run. A request carrying an ``Idempotency-Key`` the tenant used before
        answers with that key's run (200) when its body is the same, 422 when it is not."""
        from stayer.run import check_model, check_policies

        key = None if idempotency_key is None else _idempotency_key(idempotency_key)
        request = from_json(body.model_dump(mode="json"), RunRequest)
        digest = hashlib.sha256(
            json.dumps(to_json(request), sort_keys=True, separators=(",", ":")).encode()
        ).hexdigest()
        if key is not None:  # a retry gets its run, whatever changed since (e.g. the budget)
            first = dbs.get().idempotent(tenant, key)
            if first is not None:
                if first[0] != digest:
                    raise _clash(first[1])
                response.status_code = 200
                return out(own_run(first[1], tenant))
        task_dir = resolve_task(
            tasks_dir, body.task, dbs.uploads(), tenant
        )  # 422 for a task the tenant cannot run
        account = dbs.budgets().account(tenant)
        cap = (
            "max_cost"
            if body.max_cost is not None
            else f"tenant {tenant}'s budget"
            if account.cap is not None
            else None
        )
        # 422 for what `stayer run` refuses before it starts: a model it cannot name or
        # price, an unpriced one under a cap.
        check_model(body.model, prices, cap=cap, field="model:")
        if body.team is not None:
            from stayer.teams.config import team_from

            team = team_from(body.team, "team")  # 422 for a team that cannot run
            for agent, spec in team.agents.items():
                check_model(spec.model, prices, cap=cap, field=f"team.agents.{agent}.model:")
        if body.sim_policy and body.sim_policy.startswith("replay:"):
            raise ConfigError(
                "sim_policy: replay:PATH reads a file on the server; not available through the API"
            )
        if body.team is None:  # (a team's agents play the team policy)
            solve = task_dir / "solution" / "solve.sh"
            solution = solve.read_text(errors="replace") if solve.is_file() else None
            check_policies(body.policy, body.sim_policy, body.model, solution, api=True)
        if body.webhook is not None:
            problem = url_problem(body.webhook, allow_private=allow_private_webhooks)
            if problem is not None:
                raise ConfigError(f"webhook: {problem}")
        if body.mcp_servers:
            check_api_servers(
                body.mcp_servers,
                lambda url: url_problem(url, allow_private=allow_private_webhooks),
            )
        if body.max_cost is None:
            # A run without a cap of its own gets what its tenant can afford when it starts,
            # up to the default cap; a tenant with nothing left to spend is told now.
            request.max_cost_default = str(default_max_cost)
            if account.cap is not None and account.cap - account.spent <= 0:
                raise ConfigError(
                    f"max_cost: tenant {tenant} has spent its whole budget "
                    f"(${account.spent} of ${account.cap}); nothing is left for a run"
                )
        run_id = datetime.now(UTC).strftime("%Y%m%d-%H%M%S-") + uuid.uuid4().hex[:12]
        try:
            run, created = dbs.get().insert_run(
                run_id,
                tenant,
                body.task,
                body.model,
                request,
                idempotency=None if key is None else (key, digest),
            )
        except IdempotencyClash as e:
            raise _clash(e.args[0]) from None
        if not created:
            response.status_code = 200
        return out(run)

    @app.post("/v1/tasks", status_code=201, response_model=TaskOut)
    async def upload_task(
        request: Request,
        tenant: Tenant,
        name: Annotated[str, Query(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")],
    ) -> TaskOut:
        """Upload a task (the request body: a tar.gz in the Harbor layout) as ``name``;
        runs of this tenant may then name it."""
        body = await request.body()  # at most MAX_ARCHIVE_BYTES: BodyLimit saw to it
        path = await run_in_threadpool(lambda: dbs.uploads().add(tenant, name, body))
        return TaskOut(name=name, files=sum(1 for p in path.rglob("*") if p.is_file()))

    @app.get("/v1/runs", response_model=RunList)
    def list_runs(
        tenant: Tenant,
        status: Annotated[str | None, Query(description=" | ".join(STATUSES))] = None,
        limit: Annotated[int, Query(ge=1, le=500)] = 50,
        cursor: Annotated[str | None, Query(max_length=200)] = None,
    ) -> RunList:
        if status is not None and status not in STATUSES:
            raise HTTPException(422, f"status: one of {', '.join(STATUSES)}")
        runs = dbs.get().runs(tenant, status, limit + 1, cursor)
        page = runs[:limit]
        return RunList(
            data=[out(r) for r in page], next_cursor=page[-1].id if len(runs) > limit else None
        )

    @app.get("/v1/runs/{run_id}", response_model=RunOut)
    def get_run(run_id: str, tenant: Tenant) -> RunOut:
        return out(own_run(run_id, tenant))

    @app.patch("/v1/runs/{run_id}", response_model=RunOut)
    def patch_run(run_id: str, body: RunPatch, tenant: Tenant) -> RunOut:
        """Raise a run's cap (held from the tenant's budget); a run paused at its cap is
        queued again and resumes from its journal without paying again."""
        run = own_run(run_id, tenant)
        if run.status not in ("queued", "paused", "requires_action"):
            raise HTTPException(
                409,
                f"run {run_id} is {run.status}; its cap can be raised while it is queued or waiting",
            )
        asked = run.run_cap or run.request.max_cost
        old = Decimal(asked) if asked is not None else None
        if old is not None and body.max_cost <= old:
            raise HTTPException(422, f"max_cost: {body.max_cost} is not above the run's cap {old}")
        if not dbs.get().raise_run_cap(run_id, str(body.max_cost)):
            raise HTTPException(409, f"run {run_id} started meanwhile; raise its cap when it waits")
        return out(own_run(run_id, tenant))

    @app.post("/v1/runs/{run_id}/cancel", response_model=RunOut)
    async def cancel_run(run_id: str, tenant: Tenant) -> RunOut:
        """Stop a run: at once when no worker holds it (queued, paused, awaiting a person;
        its journal is closed with what it spent), else within one step."""

        def cancel() -> tuple[ServiceRun, bool]:
            own_run(run_id, tenant)  # 404 for a run not the tenant's
            db = dbs.get()
            before, after = db.request_cancel(run_id)
            ended_here = after == CANCELLED and before != CANCELLED
            if ended_here:
                report = close_idle_journal(db.store, run_id, CANCELLED, "cancelled")
                # Its hold as the row says now: a worker may have paused it (and cut the
                # hold down) since it was read above; no worker holds it any more.
                settle_hold(dbs.budgets(), own_run(run_id, tenant), report)
                db.record_result(run_id, steps=report.steps, cost_usd=report.cost_usd)
            return own_run(run_id, tenant), ended_here

        run, ended_here = await run_in_threadpool(cancel)
        secret = await run_in_threadpool(lambda: dbs.get().webhook_secret(run.tenant))
        if ended_here and run.request.webhook and secret:
            webhooks.send(
                run.request.webhook,
                secret,
                RunStatusHook(run_id=run.id, status=CANCELLED, stop_reason="cancelled"),
            )
        return out(run)

    @app.post("/v1/runs/{run_id}/messages", status_code=201, response_model=MessageOut)
    def post_message(run_id: str, body: MessageIn, tenant: Tenant) -> MessageOut:
        """Talk to a running, waiting or paused agent: the message is appended to its
        context at its next step (the cached prefix is never rewritten)."""
        own_run(run_id, tenant)
        try:
            n = dbs.get().add_message(run_id, body.content)
        except ValueError as e:
            raise HTTPException(409, str(e)) from None
        return MessageOut(run_id=run_id, n=n)

    @app.get("/v1/runs/{run_id}/actions", response_model=ActionList)
    def list_actions(run_id: str, tenant: Tenant) -> ActionList:
        """Every confirmable call of the run: pending, approved or rejected."""
        own_run(run_id, tenant)
        return ActionList(data=[a.view() for a in dbs.actions().of_run(run_id)])

    @app.post("/v1/runs/{run_id}/actions", response_model=RunOut)
    def decide(run_id: str, body: Decision, tenant: Tenant) -> RunOut:
        """Approve or reject the pending call; the run continues from its journal."""
        run = own_run(run_id, tenant)
        n = int(body.call_id.removeprefix("act-"))
        if run.status != "requires_action" or not dbs.actions().decide(
            run_id, n, body.decision == "approve", body.message
        ):
            raise HTTPException(409, f"{body.call_id}: not awaiting a decision (run {run.status})")
        dbs.get().resume_after_decision(run_id)
        return out(own_run(run_id, tenant))

    @app.get("/v1/runs/{run_id}/ledger", response_model=Ledger)
    def get_ledger(run_id: str, tenant: Tenant) -> Ledger:
        own_run(run_id, tenant)
        log = load_log(dbs.get().store, run_id)
        result = json.loads(log.blobs[log.finished.result]) if log.finished is not None else {}
        # Unfinished: every billed call the journal holds, calls lost in flight included.
        entries = result["ledger"] if "ledger" in result else to_json(journal_ledger(log))
        return Ledger(run_id=run_id, ledger=entries, outcome_unknown=journal_unknown(log))

    @app.get("/v1/runs/{run_id}/events", response_class=EventSourceResponse)
    async def run_events(
        run_id: str,
        tenant: Tenant,
        request: Request,
        after: Annotated[int | None, Query(ge=-1, le=MAX_SEQ + 1)] = None,
        last_event_id: Annotated[str | None, Header()] = None,
    ) -> EventSourceResponse:
        """The run's events as Server-Sent Events; resumes after ``Last-Event-ID`` or
        ``?after=``; ends after the run's final status."""
        await run_in_threadpool(own_run, run_id, tenant)
        start = after if after is not None else -1
        if last_event_id is not None:
            try:
                start = int(last_event_id)
            except ValueError:
                start = -2
            if not -1 <= start <= MAX_SEQ + 1:
                raise HTTPException(
                    422, f"Last-Event-ID: expected an event id (an integer, -1 to {MAX_SEQ + 1})"
                )

        async def stream() -> AsyncIterator[ServerSentEvent]:
            async for event in follow(dbs, run_id, start):
                if await request.is_disconnected():
                    return
                yield ServerSentEvent(data=event.to_json(), event=event.type, id=str(event.id))

        return EventSourceResponse(stream(), ping=15)

    @app.on_event("shutdown")
    async def close() -> None:
        await webhooks.aclose()
        dbs.close()

    return app


def utf8_safe(value: Any) -> Any:
    """``value`` with every string in it as UTF-8 can carry it."""
    if isinstance(value, str):
        return value.encode("utf-8", "replace").decode("utf-8")
    if isinstance(value, dict):
        return {utf8_safe(k): utf8_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [utf8_safe(v) for v in value]
    return value


def _idempotency_key(value: str) -> str:
    """The ``Idempotency-Key`` header's value, checked (422 otherwise)."""
    key = value.strip()
    if not key or len(key) > 255 or not key.isprintable() or not key.isascii():
        raise HTTPException(
            422, "Idempotency-Key: 1 to 255 printable ASCII characters (e.g. a UUID)"
        )
    return key


def _clash(run_id: str) -> HTTPException:
    return HTTPException(
        422,
        f"Idempotency-Key: already used for run {run_id} with another request body; "
        "send that request again, or use a new key",
    )


async def follow(dbs: Databases, run_id: str, after: int) -> AsyncIterator[PublicEvent]:
    """Public events of ``run_id`` with ids above ``after``, as they are journaled, until
    the run's final status."""
    if after < 0:
        yield status_event(0, run_id, QUEUED)
    last = max(after, 0)

    def read(seen: int) -> tuple[list[PublicEvent], bool, int, Any]:
        """Events after public id ``seen``; whether the journal's final status was among
        them; the new ``seen``; the run's row (read after the events, see below)."""
        db = dbs.get()
        out, finished = [], False
        for ev in db.events_after(run_id, seen - 1):
            seen = ev.seq + 1
            public = public_event(run_id, ev, db.store.get_blob)
            if public is not None:
                out.append(public)
            finished = finished or ev.kind == "run_finished"
        return out, finished, seen, db.run(run_id)

    while True:
        events, finished, last, row = await run_in_threadpool(read, last)
        for event in events:
            yield event
        if finished:
            return
        if row is not None and row.terminal:
            # The row turns final after the journal does: read the journal once more, then
            # say the final status ourselves if the journal never got one (a run cancelled
            # while queued, or stopped before it began).
            events, finished, last, _ = await run_in_threadpool(read, last)
            for event in events:
                yield event
            top, journaled = await run_in_threadpool(lambda: dbs.get().journal_tail(run_id))
            if not finished and not journaled and top + 1 > after:
                yield status_event(top + 1, run_id, row.status, row.stop_reason)
            return
        await asyncio.sleep(POLL_S)

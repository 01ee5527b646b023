"""``stayer gateway``: the providers' wire APIs in front of any upstream, every call
metered on its way through.

A client authenticates with a stayer tenant key (``x-api-key`` or ``Authorization:
Bearer``); the upstream gets the gateway's own provider key and never the client's.
Each call is read (``stayer.metering.requests``), admitted against the tenant's budget
and its session's (``x-stayer-max-cost``), forwarded, and its response passed back byte
for byte while its usage is read from it; then it is priced, settled and appended to its
session's ledger. A streamed call whose client hangs up is read to its end all the same,
so what the upstream billed is on the ledger. Sessions come from the client's own signal
(Claude Code's ``X-Claude-Code-Session-Id``, Codex's ``session-id``), else
``x-stayer-session``, else the key.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import json
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from decimal import Decimal, InvalidOperation
from typing import Any, TypeVar

import httpx
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from stayer.errors import ConfigError
from stayer.gateway.breakers import SessionBreakers
from stayer.gateway.metrics import GatewayMetrics
from stayer.gateway.sessions import TRIPPED, SessionLedger, SessionRefused, session_id
from stayer.guard.breakers import GuardConfig
from stayer.guard.budget import BudgetStore
from stayer.ledger import LedgerEntry
from stayer.metering import requests as wire
from stayer.metering.breaks import SessionForensics
from stayer.metering.meter import Admission, Meter, Refused
from stayer.metering.usage import Reading, StreamReader, read_body
from stayer.models.caching import provider_of
from stayer.settings import MAX_STEPS, MAX_USD
from stayer.usage import Usage

MAX_BODY = 32 * 1024 * 1024
T = TypeVar("T")
MAX_SESSIONS = 10_000  # sessions whose forensics and breakers a process keeps
# Request headers never forwarded: the client's credentials, hop-by-hop, ours.
_DROP = {
    "authorization", "x-api-key", "host", "content-length", "connection", "keep-alive",
    "transfer-encoding", "te", "trailer", "upgrade", "proxy-authorization", "cookie",
    "accept-encoding",
}  # fmt: skip
_PASS_BACK = (
    "content-type",
    "request-id",
    "x-request-id",
    "anthropic-ratelimit-requests-remaining",
)
SESSION_HEADERS = ("x-claude-code-session-id", "session-id", "x-stayer-session")


@dataclass
class Upstream:
    base_url: str  # e.g. https://api.anthropic.com or http://127.0.0.1:8090
    api_key: str | None = None


@dataclass
class Gateway:
    meter: Meter
    ledger: SessionLedger
    tenant_for_key: Callable[[str], str | None]
    upstreams: Mapping[str, Upstream]  # "anthropic", "openai"
    tenant_caps: Callable[[str], Decimal | None] = lambda tenant: None
    timeout_s: float = 600.0
    max_body: int = MAX_BODY
    client: httpx.AsyncClient | None = None
    pending: set[asyncio.Task[None]] = field(default_factory=set)
    # Every database call runs on this one thread: a SQLite connection belongs to the
    # thread that made it, and the budget store's transactions must not interleave.
    db: ThreadPoolExecutor = field(default_factory=lambda: ThreadPoolExecutor(1, "stayer-gw-db"))
    guard: GuardConfig = field(default_factory=GuardConfig)
    max_tokens_per_minute: int | None = None
    metrics_token: str | None = None
    metrics: GatewayMetrics = field(default_factory=lambda: GatewayMetrics())
    sessions: OrderedDict[str, _SessionState] = field(default_factory=OrderedDict)

    def state(self, session: str, provider: str, model: str) -> _SessionState:
        """The session's forensics and breakers in this process (the least recently used
        of ``MAX_SESSIONS`` are forgotten: a forgotten session's next call has no verdict)."""
        st = self.sessions.get(session)
        if st is None:
            st = self.sessions[session] = _SessionState(
                SessionForensics(provider, model),
                SessionBreakers(self.guard, self.max_tokens_per_minute),
            )
            while len(self.sessions) > MAX_SESSIONS:
                self.sessions.popitem(last=False)
        self.sessions.move_to_end(session)
        return st

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        return await asyncio.get_running_loop().run_in_executor(self.db, fn, *args)


@dataclass
class _SessionState:
    forensics: SessionForensics
    breakers: SessionBreakers


class _Error(Exception):
    def __init__(self, status: int, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.status, self.param = status, param


def _error(api: wire.Api, status: int, message: str) -> JSONResponse:
    if status == 402 and api == "responses":
        status = 400  # Codex retries a 402 five times; a 400 it shows at once
    body = (
        wire.anthropic_error(status, message)
        if api == "anthropic"
        else wire.openai_error(status, message)
    )
    if status == 402 and api == "anthropic":
        body["error"]["type"] = "invalid_request_error"  # a client shows it and does not retry
    return JSONResponse(body, status_code=status)


def _key(request: Request) -> str | None:
    key = request.headers.get("x-api-key")
    auth = request.headers.get("authorization", "")
    if not key and auth.lower().startswith("bearer "):
        key = auth[7:].strip()
    return key or None


def _session(request: Request, tenant: str, key: str) -> str:
    for name in SESSION_HEADERS:
        value = request.headers.get(name)
        if value:
            return session_id(value)
    return "gw-key-" + hashlib.sha256(key.encode()).hexdigest()[:16]


def _max_steps(request: Request) -> int | None:
    raw = request.headers.get("x-stayer-max-steps")
    if raw is None:
        return None
    if not raw.isdigit() or not 1 <= int(raw) <= MAX_STEPS:
        raise _Error(400, f"x-stayer-max-steps: expected a whole number from 1 to {MAX_STEPS}")
    return int(raw)


def _cap(request: Request) -> Decimal | None:
    raw = request.headers.get("x-stayer-max-cost")
    if raw is None:
        return None
    try:
        cap = Decimal(raw)
    except InvalidOperation:
        raise _Error(400, "x-stayer-max-cost: expected an amount in USD") from None
    if not cap.is_finite() or cap <= 0 or cap > MAX_USD:
        raise _Error(400, f"x-stayer-max-cost: must be above 0 and at most {MAX_USD}")
    return cap


async def _read(request: Request, limit: int) -> bytes:
    declared = request.headers.get("content-length")
    if declared is not None and (not declared.isdigit() or int(declared) > limit):
        raise _Error(413, f"request body over {limit} bytes")
    data = bytearray()
    async for chunk in request.stream():
        data += chunk
        if len(data) > limit:
            raise _Error(413, f"request body over {limit} bytes")
    return bytes(data)


def _with_max_tokens(api: wire.Api, body: dict[str, Any], allowed: int) -> dict[str, Any]:
    name = {"anthropic": "max_tokens", "responses": "max_output_tokens"}.get(api)
    if name is None:
        name = (
            "max_tokens"
            if "max_tokens" in body and "max_completion_tokens" not in body
            else "max_completion_tokens"
        )
    return dict(body, **{name: allowed})


def create_app(gw: Gateway) -> Starlette:
    def route(
        api: wire.Api, parse: Callable[[dict[str, Any]], wire.Parsed]
    ) -> Callable[[Request], Any]:
        async def endpoint(request: Request) -> Response:
            admission: Admission | None = None
            try:
                key = _key(request)
                tenant = await gw.run(gw.tenant_for_key, key) if key else None
                if key is None or tenant is None:
                    raise _Error(
                        401, "missing or invalid stayer key (x-api-key or Authorization: Bearer)"
                    )
                raw = await _read(request, gw.max_body)
                try:
                    body = json.loads(raw)
                except (ValueError, RecursionError):
                    raise _Error(400, "the body is not JSON") from None
                if not isinstance(body, dict):
                    raise _Error(400, "the body must be a JSON object")
                parsed = parse(body)
                upstream = gw.upstreams.get("anthropic" if api == "anthropic" else "openai")
                if upstream is None:
                    raise _Error(
                        404,
                        f"no upstream for this API (stayer gateway --upstream {'anthropic' if api == 'anthropic' else 'openai'}=URL)",
                    )
                try:
                    provider = "anthropic" if api == "anthropic" else provider_of(parsed.model)
                except ConfigError:
                    provider = "openai"
                session = _session(request, tenant, key)
                now = _now()
                row = await gw.run(gw.ledger.open, tenant, session, parsed.model, now)
                state = gw.state(session, provider, parsed.model)
                why = state.breakers.refusal(row.steps, _max_steps(request))
                if why is None and row.status == TRIPPED:
                    why = f"session {session} tripped a breaker: `stayer report {session}`"
                if why is not None:
                    raise _Error(403, why)
                accounts = [f"tenant:{tenant}", f"gateway-session:{session}"]
                cap = _cap(request)
                await gw.run(_open_accounts, gw, tenant, session, cap)
                admission = await gw.run(gw.meter.admit, parsed, provider, accounts)
            except wire.WireError as e:
                return _error(api, 400, str(e))
            except SessionRefused as e:
                return _error(api, 403, str(e))
            except Refused as e:
                return _error(api, 402, str(e))
            except _Error as e:
                return _error(api, e.status, str(e))
            if admission.max_tokens != parsed.request.max_tokens:
                raw = json.dumps(_with_max_tokens(api, body, admission.max_tokens)).encode()
            headers = {
                k: v
                for k, v in request.headers.items()
                if k.lower() not in _DROP and not k.lower().startswith("x-stayer-")
            }
            if upstream.api_key:
                if api == "anthropic":
                    headers["x-api-key"] = upstream.api_key
                else:
                    headers["authorization"] = f"Bearer {upstream.api_key}"
            headers["content-type"] = "application/json"
            url = upstream.base_url.rstrip("/") + request.url.path
            if request.url.query:
                url += "?" + request.url.query
            assert gw.client is not None
            started = time.perf_counter()
            try:
                upstream_request = gw.client.build_request(
                    "POST", url, headers=headers, content=raw
                )
                response = await gw.client.send(upstream_request, stream=True)
            except httpx.HTTPError as e:
                await gw.run(gw.meter.release, admission)
                return _error(api, 502, f"upstream {upstream.base_url}: {type(e).__name__}")
            back = {k: v for k, v in response.headers.items() if k.lower() in _PASS_BACK}
            if response.status_code >= 400:  # refused upstream: nothing billed
                content = await _drain(response)
                await gw.run(gw.meter.release, admission)
                return Response(content, status_code=response.status_code, headers=back)
            done = _Call(gw, admission, tenant, session, api, started, parsed, raw, state)
            if not parsed.stream:
                content = await _drain(response)
                try:
                    reading = read_body(api, json.loads(content))
                except (ValueError, RecursionError):
                    reading = Reading()
                await done.finish(reading)
                return Response(content, status_code=response.status_code, headers=back)
            queue: asyncio.Queue[bytes | None] = asyncio.Queue()
            task = asyncio.create_task(done.pump(response, queue))
            gw.pending.add(task)
            task.add_done_callback(gw.pending.discard)

            async def relay() -> AsyncIterator[bytes]:
                while (chunk := await queue.get()) is not None:
                    yield chunk

            return StreamingResponse(relay(), status_code=response.status_code, headers=back)

        return endpoint

    async def startup() -> None:
        gw.client = httpx.AsyncClient(
            timeout=httpx.Timeout(gw.timeout_s, connect=30.0), follow_redirects=False
        )

    async def shutdown() -> None:
        if gw.pending:
            await asyncio.gather(*gw.pending, return_exceptions=True)
        if gw.client is not None:
            await gw.client.aclose()

    async def health(request: Request) -> Response:
        return JSONResponse({"status": "ok"})

    async def metrics(request: Request) -> Response:
        from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

        token = gw.metrics_token
        given = request.headers.get("authorization", "")
        if token is None or not hmac.compare_digest(given.encode(), f"Bearer {token}".encode()):
            return JSONResponse({"error": "metrics need --metrics-token and its bearer"}, 401)
        return Response(generate_latest(gw.metrics.registry), media_type=CONTENT_TYPE_LATEST)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        await startup()
        try:
            yield
        finally:
            await shutdown()

    return Starlette(
        lifespan=lifespan,
        routes=[
            Route("/v1/messages", route("anthropic", wire.parse_anthropic), methods=["POST"]),
            Route("/v1/chat/completions", route("chat", wire.parse_chat), methods=["POST"]),
            Route("/v1/responses", route("responses", wire.parse_responses), methods=["POST"]),
            Route("/healthz", health, methods=["GET"]),
            Route("/metrics", metrics, methods=["GET"]),
        ],
    )


def _open_accounts(gw: Gateway, tenant: str, session: str, cap: Decimal | None) -> None:
    gw.meter.budgets.open(f"tenant:{tenant}", gw.tenant_caps(tenant)) if _missing(
        gw.meter.budgets, f"tenant:{tenant}"
    ) else None
    name = f"gateway-session:{session}"
    if _missing(gw.meter.budgets, name):
        gw.meter.budgets.open(name, cap)
    elif cap is not None and gw.meter.budgets.account(name).cap != cap:
        raise _Error(
            400,
            f"x-stayer-max-cost: session {session} is capped at ${gw.meter.budgets.account(name).cap} already",
        )


def _missing(budgets: BudgetStore, name: str) -> bool:
    try:
        budgets.account(name)
    except KeyError:
        return True
    return False


async def _drain(response: httpx.Response) -> bytes:
    try:
        return await response.aread()
    finally:
        await response.aclose()


def _now() -> str:
    from stayer.journal.sql import utc_now

    return utc_now()


@dataclass
class _Call:
    gw: Gateway
    admission: Admission
    tenant: str
    session: str
    api: wire.Api
    started: float
    parsed: wire.Parsed
    body: bytes
    state: _SessionState

    async def pump(self, response: httpx.Response, queue: asyncio.Queue[bytes | None]) -> None:
        """Relay the upstream's bytes as they come and read them; the client going away
        does not stop the reading, so the call is priced as billed."""
        reader = StreamReader(self.api)
        try:
            async for chunk in response.aiter_raw():
                reader.feed(chunk)
                queue.put_nowait(chunk)
        except httpx.HTTPError:
            pass  # cut upstream: priced from what it reported, the worst case held
        finally:
            queue.put_nowait(None)
            await response.aclose()
            await self.finish(reader.close())

    async def finish(self, reading: Reading) -> None:
        gw, adm = self.gw, self.admission
        metered = await gw.run(gw.meter.settle, adm, reading)
        usage = metered.usage or Usage()
        model = reading.model or adm.model
        verdict = None
        if metered.usage is not None:
            verdict = self.state.forensics.observe(
                self.parsed.request, usage, model, adm.provider,
                reading.service_tier or adm.tier, gw.meter.prices,
            )  # fmt: skip
        entry = LedgerEntry(
            step=0,
            model=model,
            usage=usage,
            cost=metered.cost,
            context_tokens=usage.input_tokens or adm.prompt_tokens,
            latency_s=time.perf_counter() - self.started,
            tool_calls=[],
            cache_break=verdict,
        )
        trips = self.state.breakers.after(
            metered.charged, self.body, usage.input_tokens + usage.output_tokens
        )
        entry.breakers = [t.to_dict() for t in trips]
        doc = entry.to_dict()
        doc["charged_usd"] = None if metered.charged is None else str(metered.charged)
        doc["complete"] = metered.complete
        doc["max_tokens"] = adm.max_tokens
        status = TRIPPED if trips else None
        await gw.run(gw.ledger.record, self.tenant, self.session, doc, _now(), status)
        gw.metrics.observe(self.tenant, model, metered.charged, verdict, trips)

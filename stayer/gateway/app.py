"""``stayer gateway``: the providers' wire APIs in front of any upstream, every call
metered on its way through.

A client authenticates with a stayer tenant key (``x-api-key`` or ``Authorization:
Bearer``); the upstream gets the gateway's own provider key, never the client's. A call
is read (``stayer.metering.requests``), held in its tenant's, key's and session's budgets
(``x-stayer-max-cost``, else the tenant's default) in one transaction, forwarded, and
passed back byte for byte while its usage is read; then it is settled, put on its
session's ledger and, when its cache missed, sent to the tenant's webhook. A streamed call
whose client hangs up is read to its end. Sessions: Claude Code's
``X-Claude-Code-Session-Id``, Codex's ``session-id``, ``x-stayer-session``, else the key.
Opt-in rewrites, each on the ledger entry: aliases, cache breakpoints
(``stayer.metering.savings``), failover under the same hold (see ``_UNREACHED``).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import json
import time
from collections.abc import AsyncIterator, Callable, Coroutine, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from decimal import Decimal, InvalidOperation
from typing import Any, TypeVar

import httpx
import msgspec
from msgspec import UNSET, UnsetType
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from stayer.context.forensics import CacheBreak
from stayer.errors import ConfigError
from stayer.gateway.metrics import GatewayMetrics
from stayer.journal.metered import TRIPPED, SessionLedger, SessionRefused, session_id
from stayer.ledger import AutoCache, FailedAttempt, ModelAlias
from stayer.metering import requests as wire
from stayer.metering.meter import Admission, CapClash, Meter, Metered, Opening, Refused
from stayer.metering.savings import add_cache_breakpoints, has_cache_control, without_cache
from stayer.metering.session import SessionState, SessionStates, settle_call
from stayer.metering.usage import Reading, StreamReader, read_body
from stayer.models.caching import provider_of
from stayer.money import Usd
from stayer.records import Record
from stayer.runtime.db import GatewayKey
from stayer.runtime.tenants import account_name, key_account_name
from stayer.runtime.webhooks import Webhooks
from stayer.settings import MAX_STEPS, MAX_USD

MAX_BODY = 32 * 1024 * 1024
T = TypeVar("T")
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
KEY_TTL_S = 1.0  # how long a known key skips the lookup before its body is read
BAD_KEY = "missing or invalid stayer key (x-api-key or Authorization: Bearer)"
MAX_KNOWN = 10_000
SESSION_HEADERS = ("x-claude-code-session-id", "session-id", "x-stayer-session")


@dataclass
class Upstream:
    base_url: str  # e.g. https://api.anthropic.com or http://127.0.0.1:8090
    api_key: str | None = None


@dataclass
class Gateway:
    meter: Meter
    ledger: SessionLedger
    key_info: Callable[[str], GatewayKey | None]  # ServiceDB.gateway_key
    upstreams: Mapping[str, Upstream]  # "anthropic", "openai"
    timeout_s: float = 600.0
    max_body: int = MAX_BODY
    client: httpx.AsyncClient | None = None
    pending: set[asyncio.Task[None]] = field(default_factory=set)
    # Every database call runs on this one thread: a SQLite connection belongs to the
    # thread that made it, and the budget store's transactions must not interleave.
    db: ThreadPoolExecutor = field(default_factory=lambda: ThreadPoolExecutor(1, "stayer-gw-db"))
    metrics_token: str | None = None
    metrics: GatewayMetrics = field(default_factory=lambda: GatewayMetrics())
    states: SessionStates = field(default_factory=SessionStates)
    webhooks: Webhooks = field(default_factory=lambda: Webhooks())  # the tenants' cache misses
    known: dict[str, tuple[float, GatewayKey]] = field(default_factory=dict)  # see who()
    # Opt-in savings (``stayer.metering.savings``), each shown on the call's ledger entry.
    auto_cache: bool = False
    aliases: Mapping[str, str] = field(default_factory=dict)  # model asked → model called
    failover: Mapping[str, Sequence[Upstream]] = field(default_factory=dict)  # tried in order

    def later(self, work: Coroutine[Any, Any, None]) -> None:
        """Run ``work`` after the response, to its end (awaited at shutdown)."""
        task = asyncio.create_task(work)
        self.pending.add(task)
        task.add_done_callback(self.pending.discard)

    async def who(self, key: str) -> GatewayKey | None:
        """The key's tenant, looked up at most once per ``KEY_TTL_S`` (a key that is not
        known is looked up every time: a new tenant's works at once). Only a first check,
        before the body is read: ``_admit`` reads the key again, in the trip that holds
        the call, so a revoked key or a changed setting counts at once."""
        now = time.monotonic()
        hit = self.known.get(key)
        if hit is not None and hit[0] > now:
            return hit[1]
        found = await self.run(self.key_info, key)
        if found is not None:
            if len(self.known) >= MAX_KNOWN:
                self.known.clear()
            self.known[key] = (now + KEY_TTL_S, found)
        return found

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        return await asyncio.get_running_loop().run_in_executor(self.db, fn, *args)


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
        body.error.kind = "invalid_request_error"  # a client shows it and does not retry
    return JSONResponse(msgspec.to_builtins(body), status_code=status)


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
    try:
        return await wire.read_limited(
            request.stream(), request.headers.get("content-length"), limit
        )
    except wire.BodyTooLarge as e:
        raise _Error(413, str(e)) from None


def create_app(gw: Gateway) -> Starlette:
    def route(
        api: wire.Api, parse: Callable[[dict[str, Any]], wire.Parsed]
    ) -> Callable[[Request], Any]:
        async def endpoint(request: Request) -> Response:
            try:
                key = _key(request)
                known = await gw.who(key) if key else None
                if key is None or known is None:
                    raise _Error(401, BAD_KEY)
                tenant = known.tenant
                raw = await _read(request, gw.max_body)
                try:
                    body = json.loads(raw)
                except (ValueError, RecursionError):
                    raise _Error(400, "the body is not JSON") from None
                if not isinstance(body, dict):
                    raise _Error(400, "the body must be a JSON object")
                body, notes, cache_marks = _rewrite(gw, api, body)
                if notes.alias or cache_marks:
                    raw = json.dumps(body).encode()
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
                steps, cap = _max_steps(request), _cap(request)
                who, state, admission = await gw.run(
                    _admit, gw, key, session, parsed, provider, steps, cap
                )
            except CapClash as e:
                return _error(
                    api,
                    400,
                    f"x-stayer-max-cost: session {session} is capped at ${e.args[1]} already",
                )
            except wire.WireError as e:
                return _error(api, 400, str(e))
            except SessionRefused as e:
                gw.metrics.refused.labels("session").inc()
                return _error(api, 403, str(e))
            except Refused as e:
                gw.metrics.refused.labels("budget").inc()
                return _error(api, 402, str(e))
            except _Error as e:
                if e.status in _REFUSALS:
                    gw.metrics.refused.labels(_REFUSALS[e.status]).inc()
                return _error(api, e.status, str(e))
            if admission.max_tokens != parsed.request.max_tokens:
                raw = json.dumps(wire.with_max_tokens(api, body, admission.max_tokens)).encode()
            assert gw.client is not None
            started = time.perf_counter()
            candidates = [upstream, *gw.failover.get(_upstream_name(api), ())]
            failed: list[FailedAttempt] = []
            for n, up in enumerate(candidates):
                final = n == len(candidates) - 1
                try:
                    upstream_request = gw.client.build_request(
                        "POST", _url(up, request), headers=_headers(request, api, up), content=raw
                    )
                    response = await gw.client.send(upstream_request, stream=True)
                except httpx.HTTPError as e:
                    if not final and isinstance(e, _UNREACHED):
                        failed.append(_attempt(up, error=type(e).__name__))
                        continue
                    await gw.run(gw.meter.release, admission)
                    return _error(api, 502, f"upstream {up.base_url}: {type(e).__name__}")
                back = {k: v for k, v in response.headers.items() if k.lower() in _PASS_BACK}
                if response.status_code >= 400:  # refused upstream: nothing billed
                    content = await _drain(response)
                    if not final and _fails_over(response.status_code):
                        failed.append(_attempt(up, status=response.status_code))
                        continue
                    await gw.run(gw.meter.release, admission)
                    return Response(content, status_code=response.status_code, headers=back)
                break
            if len(candidates) > 1:
                notes.upstream, notes.failed_attempts = up.base_url, failed
            done = _Call(
                gw, admission, who, session, api, started, parsed, raw, state, notes, cache_marks
            )
            if not parsed.stream:
                content = await _drain(response)
                try:
                    reading = read_body(api, json.loads(content))
                except (ValueError, RecursionError):
                    reading = Reading()
                # answered at once; settled and journaled right after (as a stream is)
                gw.later(done.finish(reading))
                return Response(content, status_code=response.status_code, headers=back)
            queue: asyncio.Queue[bytes | None] = asyncio.Queue()
            gw.later(done.pump(response, queue))

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
        await gw.webhooks.aclose()
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


# Failures after which the next upstream is tried: nothing was billed. A connection that
# never opened delivered nothing; Anthropic and OpenAI bill no call they answered with an
# error status (5xx, 429 overloaded/rate limited). A request delivered whose answer was
# lost (a read timeout, a dropped connection) may have been billed: it is not retried.
_UNREACHED = (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout)


_REFUSALS = {401: "key", 403: "breaker"}  # stayer_gateway_refused_total's reasons, by status


def _fails_over(status: int) -> bool:
    return status >= 500 or status == 429


def _attempt(up: Upstream, *, status: int | None = None, error: str | None = None) -> FailedAttempt:
    """A failed attempt as its ledger entry lists it: priced 0, nothing was billed."""
    return FailedAttempt(
        upstream=up.base_url,
        cost=Usd(Decimal(0)),
        status=msgspec.UNSET if status is None else status,
        error=msgspec.UNSET if error is None else error,
    )


def _upstream_name(api: wire.Api) -> str:
    return "anthropic" if api == "anthropic" else "openai"


def _headers(request: Request, api: wire.Api, up: Upstream) -> dict[str, str]:
    headers = {
        k: v
        for k, v in request.headers.items()
        if k.lower() not in _DROP and not k.lower().startswith("x-stayer-")
    }
    if up.api_key:
        if api == "anthropic":
            headers["x-api-key"] = up.api_key
        else:
            headers["authorization"] = f"Bearer {up.api_key}"
    headers["content-type"] = "application/json"
    return headers


def _url(up: Upstream, request: Request) -> str:
    url = up.base_url.rstrip("/") + request.url.path
    if request.url.query:
        url += "?" + request.url.query
    return url


class _Notes(msgspec.Struct):
    """What a call's ledger entry notes of the gateway's doing: the alias served, the
    upstream that answered after a failover and the attempts before it."""

    alias: ModelAlias | UnsetType = UNSET
    upstream: str | UnsetType = UNSET
    failed_attempts: list[FailedAttempt] | UnsetType = UNSET


class CacheMiss(Record, kw_only=True):
    """A ``gateway.cache_miss`` webhook: a call of a session that missed the cache."""

    type: str = "gateway.cache_miss"
    run_id: str
    session: str
    step: int
    model: str
    reason: str
    miss_cost: Usd | None = msgspec.field(name="miss_cost_usd")
    cache_break: CacheBreak


def _rewrite(
    gw: Gateway, api: wire.Api, body: dict[str, Any]
) -> tuple[dict[str, Any], _Notes, int]:
    """The body as forwarded (the provider's JSON): its model aliased, its cache
    breakpoints added (Anthropic, a body that marks none, with ``--auto-cache``); the
    ledger's notes; breakpoints added."""
    notes = _Notes()
    asked = body.get("model")
    served = gw.aliases.get(asked) if isinstance(asked, str) else None
    if isinstance(asked, str) and served is not None:
        body = dict(body, model=served)
        notes.alias = ModelAlias(asked, served)
    added = 0
    if gw.auto_cache and api == "anthropic" and not has_cache_control(body):
        body, added = add_cache_breakpoints(body)
    return body, notes, added


def _admit(
    gw: Gateway,
    key: str,
    session: str,
    parsed: wire.Parsed,
    provider: str,
    max_steps: int | None,
    cap: Decimal | None,
) -> tuple[GatewayKey, SessionState, Admission]:
    """On the database thread, in one hop: the key read again (one revoked since
    ``who`` cached it is refused, and its settings are the latest), the session opened
    (or refused: another tenant's, a breaker tripped) and the call held in its accounts."""
    who = gw.key_info(key)
    if who is None:
        gw.known.pop(key, None)
        raise _Error(401, BAD_KEY)
    row = gw.ledger.open(who.tenant, session, parsed.model, _now())
    state = gw.states.get(session, provider, parsed.model)
    why = state.breakers.refusal(row.steps, max_steps)
    if why is None and row.status == TRIPPED:
        why = f"session {session} tripped a breaker: `stayer report {session}`"
    if why is not None:
        raise _Error(403, why)
    accounts = _accounts(who, session, cap)
    return who, state, gw.meter.admit(parsed, provider, list(accounts), accounts)


def _accounts(who: GatewayKey, session: str, cap: Decimal | None) -> dict[str, Opening]:
    """The accounts a call is held in (the tenant's, its key's, its session's), and how
    each is opened by the first call that finds it missing: the session with the call's
    ``x-stayer-max-cost`` (which must then match) or else the tenant's default."""
    by_header = cap is not None
    return {
        account_name(who.tenant): Opening(None),
        key_account_name(who.key_hash): Opening(None),
        f"gateway-session:{session}": Opening(
            cap if by_header else who.session_max_cost, by_header
        ),
    }


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
    who: GatewayKey
    session: str
    api: wire.Api
    started: float
    parsed: wire.Parsed
    body: bytes
    state: SessionState
    notes: _Notes = field(default_factory=_Notes)
    cache_marks: int = 0  # breakpoints --auto-cache added

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
        gw = self.gw
        done = await gw.run(
            settle_call, gw.meter, self.state, self.admission, self.parsed, self.body, reading,
            time.perf_counter() - self.started,
        )  # fmt: skip
        n = self.notes
        entry = msgspec.structs.replace(
            done.step, alias=n.alias, upstream=n.upstream, failed_attempts=n.failed_attempts
        )
        if self.cache_marks:
            entry.auto_cache = self._auto_cache(done.metered, reading)
        status = TRIPPED if done.trips else None
        tenant = self.who.tenant
        step = await gw.run(gw.ledger.record, tenant, self.session, entry, _now(), status)
        model = entry.model
        gw.metrics.observe(tenant, model, done.metered.charged, done.cache_break, done.trips)
        if done.cache_break is not None and self.who.webhook:
            brk = done.cache_break
            miss = CacheMiss(
                run_id=self.session,
                session=self.session,
                step=step,
                model=model,
                reason=brk.reason,
                miss_cost=None if isinstance(brk.cost, UnsetType) else brk.cost,
                cache_break=brk,
            )
            gw.webhooks.send(self.who.webhook, self.who.webhook_secret, miss)

    def _auto_cache(self, metered: Metered, reading: Reading) -> AutoCache:
        """The breakpoints added, and the call priced as it would have been without them."""
        paid = metered.cost.total
        without = None
        if metered.usage is not None:
            without = self.gw.meter.cost(self.admission, reading, without_cache(metered.usage))
        base = None if without is None else without.total
        saved = None if base is None or paid is None else base - paid
        return AutoCache(breakpoints=self.cache_marks, cost_without=Usd(base), saved=Usd(saved))

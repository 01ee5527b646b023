"""``stayer.meter``: an ``anthropic`` or ``openai`` client, sync or async, whose every call
goes through stayer's metering core on its way out (the gateway's, not a copy).

The client is the SDK's own, copied with an HTTP transport that wraps the one it had: a
call to the Messages, Chat Completions or Responses API is read, its worst case held in
its ``Budget`` (or refused with ``BudgetExceeded`` before anything is sent, or
given a smaller ``max_tokens``), sent, read back as it streams to the caller, priced,
settled, explained (cache breaks), appended to its ``Session``'s ledger in the journal
(which ``stayer report ID`` shows) and recorded as a run's step is: a ``chat {model}``
OpenTelemetry span and the step metrics of Prometheus. Other requests pass through. A stream
the caller stops reading early is read to its end when closed, so what the provider billed
is priced. Store work (budgets, journal) runs on one thread per process.
"""

from __future__ import annotations

import asyncio
import json
import sys
import threading
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from concurrent.futures import ThreadPoolExecutor
from decimal import Decimal
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import httpx2

from stayer.errors import BudgetExceeded, ConfigError
from stayer.guard.budget import BudgetStore, MemoryBudgetStore
from stayer.journal.metered import SessionLedger, session_id
from stayer.journal.store import RunRow, Store
from stayer.metering import requests as wire
from stayer.metering.meter import Admission, Meter, Refused
from stayer.metering.session import SessionStates, settle_call
from stayer.metering.usage import Reading, StreamReader, read_body
from stayer.models.caching import provider_of
from stayer.pricing import PriceBook

if TYPE_CHECKING:
    from opentelemetry.trace import TracerProvider
    from prometheus_client import CollectorRegistry

    from stayer.context.forensics import CacheBreak
    from stayer.journal.run_report import JournalReport
    from stayer.ledger import LedgerEntry
    from stayer.telemetry.metrics import WorkerMetrics

T = TypeVar("T")
TENANT = "python"  # the tenant a library session's journal row is filed under
_DB = ThreadPoolExecutor(1, "stayer-sdk-db")
_APIS: dict[str, tuple[wire.Api, Any]] = {
    "/messages": ("anthropic", wire.parse_anthropic),
    "/chat/completions": ("chat", wire.parse_chat),
    "/responses": ("responses", wire.parse_responses),
}


def _db(fn: Any, *args: Any) -> Any:
    return _DB.submit(fn, *args).result()


async def _adb(fn: Any, *args: Any) -> Any:
    return await asyncio.wrap_future(_DB.submit(fn, *args))


def _usd(value: Decimal | str | int | float | None, what: str) -> Decimal | None:
    if value is None:
        return None
    amount = Decimal(str(value))
    if not amount.is_finite() or amount < 0:
        raise ConfigError(f"{what}: expected an amount of USD ≥ 0, got {value!r}")
    return amount


def _steps(value: int | None) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ConfigError(f"Budget(max_steps): expected a whole number ≥ 0, got {value!r}")
    return value


def _open_store(store: str | Path | None) -> BudgetStore:
    if store is None:
        return MemoryBudgetStore()
    text = str(store)
    if text.startswith(("postgresql://", "postgres://")):
        from stayer.guard.shared_pg import PostgresBudgetStore

        return PostgresBudgetStore(text)
    from stayer.guard.shared import SqliteBudgetStore

    return SqliteBudgetStore(Path(text))


class Budget:
    """A dollar budget that calls are held against before they are sent and charged what
    they cost after, and a cap on the number of calls (``max_steps``), each held before it
    is sent: neither is ever overshot, across threads and tasks, and across processes that
    name it in one ``store`` (a SQLite file or a ``postgresql://`` URL; by default it
    lives in this process). ``child`` carves a budget out of it."""

    def __init__(
        self,
        max_cost: Decimal | str | int | float | None = None,
        *,
        max_steps: int | None = None,
        name: str | None = None,
        store: str | Path | None = None,
        _parent: Budget | None = None,
    ) -> None:
        self.name = name or f"budget:{uuid.uuid4().hex[:12]}"
        self.max_cost = _usd(max_cost, "Budget(max_cost)")
        self.max_steps = _steps(max_steps)
        self.steps_name = f"{self.name}#steps"  # its calls, counted in the same store
        cap = None if self.max_steps is None else Decimal(self.max_steps)
        if _parent is None:
            self.store: BudgetStore = _db(_open_store, store)
            _db(self.store.open, self.name, self.max_cost)
            _db(self.store.open, self.steps_name, cap)
            return
        self.store = _parent.store
        if cap is None and _parent.max_steps is not None:
            raise ConfigError(
                f"Budget.child(max_steps): {_parent.name} caps its steps; give the child a share"
            )
        if not _db(self.store.carve, _parent.name, self.name, self.max_cost):
            raise BudgetExceeded(
                f"budget {_parent.name}: cannot spare ${self.max_cost} for {self.name} "
                f"(${_parent.remaining} left)"
            )
        if not _db(self.store.carve, _parent.steps_name, self.steps_name, cap):
            _db(self.store.close, self.name)
            raise BudgetExceeded(
                f"budget {_parent.name}: cannot spare {self.max_steps} steps for {self.name} "
                f"({_parent.remaining_steps} left)"
            )

    def child(
        self,
        max_cost: Decimal | str | int | float | None,
        *,
        max_steps: int | None = None,
        name: str | None = None,
    ) -> Budget:
        """A budget of ``max_cost`` (and ``max_steps`` calls) held in this one until it is
        closed."""
        return Budget(max_cost, max_steps=max_steps, name=name, _parent=self)

    def close(self) -> None:
        """A child's unspent part goes back to its parent."""
        _db(self.store.close, self.name)
        _db(self.store.close, self.steps_name)

    @property
    def steps(self) -> int:
        """The calls made (sent and settled) against this budget."""
        return int(_db(self.store.account, self.steps_name).spent)

    @property
    def remaining_steps(self) -> int | None:
        """The calls that may still be held: ``max_steps`` less those made and in flight."""
        available = _db(self.store.account, self.steps_name).available
        return None if available is None else int(available)

    @property
    def spent(self) -> Decimal:
        return Decimal(_db(self.store.account, self.name).spent)

    @property
    def reserved(self) -> Decimal:
        return Decimal(_db(self.store.account, self.name).reserved)

    @property
    def remaining(self) -> Decimal | None:
        """What is left to hold: the cap less what is spent and held (None: no cap)."""
        available = _db(self.store.account, self.name).available
        return None if available is None else Decimal(available)

    def __repr__(self) -> str:
        return (
            f"Budget({self.name!r}, max_cost={self.max_cost}, max_steps={self.max_steps}, "
            f"spent={self.spent})"
        )


class Session:
    """The ledger of the calls of metered clients that share it: a journal run named
    ``id`` in ``home`` (``$STAYER_HOME``, else ``./.stayer``), as ``stayer report ID``
    shows it."""

    def __init__(self, id: str | None = None, *, home: str | Path | None = None) -> None:
        from stayer.journal.backends import open_store, stayer_home

        self.id = session_id(id) if id else f"py-{uuid.uuid4().hex[:12]}"
        root = Path(home) if home is not None else stayer_home()
        self.store: Store = _db(open_store, root)
        self.ledger_writer = SessionLedger(self.store)
        self.states = SessionStates()
        self.opened = False
        self.last_step: LedgerEntry | None = None  # what the cache could serve the next call

    def report(self) -> dict[str, Any]:
        """What ``stayer report ID --json`` prints."""
        from stayer.records import to_json

        return to_json(self._journal_report())

    def _journal_report(self) -> JournalReport:
        from stayer.journal.run_report import run_report

        row: RunRow | None = _db(self.store.run, self.id)
        if row is None:
            raise ConfigError(f"session {self.id}: no call recorded yet")
        report: JournalReport = _db(run_report, self.store, row)
        return report

    @property
    def ledger(self) -> list[LedgerEntry]:
        """The entries of ``report()``'s ledger, as records (``e[name]`` reads a field as
        the JSON has it, ``e.cost.total`` the amount)."""
        if not _db(self.store.run, self.id):
            return []
        return self._journal_report().ledger

    @property
    def cost(self) -> Decimal:
        """What the priced calls cost (an unpriced one adds nothing)."""
        return sum((e.cost.total for e in self.ledger if e.cost.total is not None), Decimal(0))

    @property
    def cache_breaks(self) -> list[CacheBreak]:
        return [e.cache_break for e in self.ledger if e.cache_break]


_TELEMETRY_LOCK = threading.Lock()
_OTLP: list[TracerProvider] = []  # the process's OTLP exporter, made once when configured
_METRICS: dict[int, WorkerMetrics] = {}  # the step metrics of each registry, made once


def _tracer_provider(given: TracerProvider | None) -> TracerProvider | None:
    """Where spans go: ``given``; else OTLP when configured (``OTEL_EXPORTER_OTLP_*``);
    else OpenTelemetry's global provider when the program uses OpenTelemetry; else none."""
    from stayer.telemetry import tracing_configured

    if given is not None:
        return given
    if tracing_configured():
        with _TELEMETRY_LOCK:
            if not _OTLP:
                from stayer.telemetry.tracing import provider

                _OTLP.append(provider())
            return _OTLP[0]
    if "opentelemetry.trace" in sys.modules:
        from opentelemetry import trace

        return trace.get_tracer_provider()
    return None


def _step_metrics(given: WorkerMetrics | CollectorRegistry | None) -> WorkerMetrics:
    """The step metrics in ``given`` (a registry), else in prometheus_client's default."""
    from prometheus_client import REGISTRY

    from stayer.telemetry.metrics import WorkerMetrics

    if isinstance(given, WorkerMetrics):
        return given
    registry = REGISTRY if given is None else given
    with _TELEMETRY_LOCK:
        found = _METRICS.get(id(registry))
        if found is None:
            found = _METRICS[id(registry)] = WorkerMetrics(registry)
        return found


def _context(core: _Core) -> Any:
    """The caller's OpenTelemetry context, which the call's span goes under."""
    if core.tracer_provider is None:
        return None
    from opentelemetry import context

    return context.get_current()


class _Core:
    """What one metered client shares between its calls."""

    def __init__(
        self,
        budget: Budget,
        session: Session,
        sdk: str,
        prices: PriceBook,
        tracer_provider: TracerProvider | None = None,
        metrics: WorkerMetrics | None = None,
    ) -> None:
        self.budget, self.session, self.sdk = budget, session, sdk
        self.meter = Meter(prices, budget.store)
        self.tracer_provider, self.metrics = tracer_provider, metrics

    def provider(self, api: wire.Api, model: str) -> str:
        if api == "anthropic":
            return "anthropic"
        try:
            return provider_of(model)
        except ConfigError:
            return "openai"

    def admit(self, parsed: wire.Parsed, provider: str) -> Admission:
        """The call's step and worst case held (one transaction), or ``BudgetExceeded``."""
        budget = self.budget
        try:
            if not self.session.opened:  # its journal row, made once
                self.session.ledger_writer.open(TENANT, self.session.id, parsed.model, _now())
                self.session.opened = True
            full = f"budget {budget.name}: its {budget.max_steps} steps (max_steps) are used"
            return self.meter.admit(
                parsed, provider, [budget.name], None, {budget.steps_name: full}
            )
        except Refused as e:
            raise _refusal(str(e), self.sdk) from None

    def finish(
        self,
        admission: Admission,
        parsed: wire.Parsed,
        body: bytes,
        reading: Reading,
        took: float,
        context: Any = None,
    ) -> None:
        state = self.session.states.get(self.session.id, admission.provider, admission.model)
        done = settle_call(self.meter, state, admission, parsed, body, reading, took)
        number = self.session.ledger_writer.record(TENANT, self.session.id, done.step, _now())
        if self.metrics is not None:
            self.metrics.on_step(done.step, self.session.last_step, self.meter.prices)
        self.session.last_step = done.step
        if self.tracer_provider is not None:
            from stayer.telemetry.tracing import record_call

            end = time.time_ns()
            record_call(
                self.tracer_provider, done.step, provider=admission.provider,
                request_model=parsed.model, start_ns=end - int(took * 1e9), end_ns=end,
                context=context,
                attributes={
                    "stayer.step": number, "stayer.session": self.session.id,
                    "gen_ai.request.max_tokens": admission.max_tokens,
                },
            )  # fmt: skip


def _now() -> str:
    from stayer.journal.sql import utc_now

    return utc_now()


_REFUSALS: dict[str, type[BudgetExceeded]] = {}


def _refusal(message: str, sdk: str) -> BudgetExceeded:
    """``BudgetExceeded``, also an ``anthropic.AnthropicError`` for the anthropic SDK, which
    otherwise wraps what its transport raises in a connection error and retries it."""
    cls = _REFUSALS.get(sdk)
    if cls is None:
        bases: tuple[type, ...] = (BudgetExceeded,)
        if sdk == "anthropic":
            import anthropic

            bases = (BudgetExceeded, anthropic.AnthropicError)
        cls = _REFUSALS[sdk] = type("BudgetExceeded", bases, {"__module__": "stayer"})
    return cls(message)


def _metered(request: Any) -> tuple[wire.Api, wire.Parsed, bytes] | None:
    """The API and request of a call to meter, or None (passed through untouched)."""
    if request.method != "POST":
        return None
    api = next((v for k, v in _APIS.items() if request.url.path.endswith(k)), None)
    if api is None:
        return None
    body = request.read()
    try:
        doc = json.loads(body)
        parsed = api[1](doc) if isinstance(doc, dict) else None
    except (ValueError, RecursionError, wire.WireError):
        return None  # the provider refuses it, unbilled
    return (api[0], parsed, body) if parsed is not None else None


def _rebuilt(httpx2: Any, request: Any, api: wire.Api, body: bytes, allowed: int) -> Any:
    content = json.dumps(wire.with_max_tokens(api, json.loads(body), allowed)).encode()
    headers = {k: v for k, v in request.headers.items() if k.lower() != "content-length"}
    return httpx2.Request(
        request.method, request.url, headers=headers, content=content, extensions=request.extensions
    )


class _SyncTransport(httpx2.BaseTransport):
    def __init__(self, inner: Any, core: _Core) -> None:
        self.inner, self.core = inner, core

    def handle_request(self, request: Any) -> Any:
        found = _metered(request)
        if found is None:
            return self.inner.handle_request(request)
        api, parsed, body = found
        provider = self.core.provider(api, parsed.model)
        admission = _db(self.core.admit, parsed, provider)
        context = _context(self.core)
        if admission.max_tokens != parsed.request.max_tokens:
            request = _rebuilt(httpx2, request, api, body, admission.max_tokens)
        request.headers["accept-encoding"] = "identity"  # the usage is read as it passes
        started = time.perf_counter()
        try:
            response = self.inner.handle_request(request)
        except BaseException:
            _db(self.core.meter.release, admission)
            raise
        if response.status_code >= 400:
            _db(self.core.meter.release, admission)
            return response

        def finish(reading: Reading) -> None:
            took = time.perf_counter() - started
            _db(self.core.finish, admission, parsed, body, reading, took, context)

        if response.headers.get("content-type", "").startswith("text/event-stream"):
            stream = _SyncStream(response, StreamReader(api), finish)
            return httpx2.Response(
                response.status_code, headers=response.headers, stream=stream,
                extensions=response.extensions,
            )  # fmt: skip
        content = b"".join(response.iter_raw())
        response.close()
        try:
            reading = read_body(api, json.loads(content))
        except (ValueError, RecursionError):
            reading = Reading()
        finish(reading)
        return httpx2.Response(
            response.status_code, headers=response.headers, content=content,
            extensions=response.extensions,
        )  # fmt: skip

    def close(self) -> None:
        self.inner.close()


class _SyncStream(httpx2.SyncByteStream):
    def __init__(self, response: Any, reader: StreamReader, finish: Any) -> None:
        self.response, self.reader, self.finish, self.done = response, reader, finish, False
        self.chunks = response.iter_raw()

    def __iter__(self) -> Iterator[bytes]:
        for chunk in self.chunks:
            self.reader.feed(chunk)
            yield chunk
        self.close()

    def close(self) -> None:
        if self.done:
            return
        self.done = True
        try:
            for chunk in self.chunks:  # the caller stopped early: read what was billed
                self.reader.feed(chunk)
        except Exception:  # noqa: BLE001 - cut upstream: priced from what it reported
            pass
        finally:
            self.response.close()
            self.finish(self.reader.close())


class _AsyncTransport(httpx2.AsyncBaseTransport):
    def __init__(self, inner: Any, core: _Core) -> None:
        self.inner, self.core = inner, core

    async def handle_async_request(self, request: Any) -> Any:
        found = _metered(request)
        if found is None:
            return await self.inner.handle_async_request(request)
        api, parsed, body = found
        provider = self.core.provider(api, parsed.model)
        admission = await _adb(self.core.admit, parsed, provider)
        context = _context(self.core)
        if admission.max_tokens != parsed.request.max_tokens:
            request = _rebuilt(httpx2, request, api, body, admission.max_tokens)
        request.headers["accept-encoding"] = "identity"
        started = time.perf_counter()
        try:
            response = await self.inner.handle_async_request(request)
        except BaseException:
            await _adb(self.core.meter.release, admission)
            raise
        if response.status_code >= 400:
            await _adb(self.core.meter.release, admission)
            return response

        async def finish(reading: Reading) -> None:
            took = time.perf_counter() - started
            await _adb(self.core.finish, admission, parsed, body, reading, took, context)

        if response.headers.get("content-type", "").startswith("text/event-stream"):
            stream = _AsyncStream(response, StreamReader(api), finish)
            return httpx2.Response(
                response.status_code, headers=response.headers, stream=stream,
                extensions=response.extensions,
            )  # fmt: skip
        content = b"".join([c async for c in response.aiter_raw()])
        await response.aclose()
        try:
            reading = read_body(api, json.loads(content))
        except (ValueError, RecursionError):
            reading = Reading()
        await finish(reading)
        return httpx2.Response(
            response.status_code, headers=response.headers, content=content,
            extensions=response.extensions,
        )  # fmt: skip

    async def aclose(self) -> None:
        await self.inner.aclose()


class _AsyncStream(httpx2.AsyncByteStream):
    def __init__(self, response: Any, reader: StreamReader, finish: Any) -> None:
        self.response, self.reader, self.finish, self.done = response, reader, finish, False
        self.chunks = response.aiter_raw()

    async def __aiter__(self) -> AsyncIterator[bytes]:
        async for chunk in self.chunks:
            self.reader.feed(chunk)
            yield chunk
        await self.aclose()

    async def aclose(self) -> None:
        if self.done:
            return
        self.done = True
        try:
            async for chunk in self.chunks:
                self.reader.feed(chunk)
        except Exception:  # noqa: BLE001 - cut upstream: priced from what it reported
            pass
        finally:
            await self.response.aclose()
            await self.finish(self.reader.close())


def meter(
    client: T,
    *,
    budget: Budget | None = None,
    session: Session | str | None = None,
    prices: PriceBook | None = None,
    tracer_provider: TracerProvider | None = None,
    metrics: CollectorRegistry | WorkerMetrics | None = None,
) -> T:
    """``client`` (``anthropic.Anthropic``/``AsyncAnthropic``, ``openai.OpenAI``/
    ``AsyncOpenAI``) copied so that each of its calls is held against ``budget`` (an
    uncapped one by default), priced, checked for cache breaks and recorded in
    ``session`` (a new one by default; a name opens or continues that session). A call
    that cannot fit raises ``BudgetExceeded`` before anything is sent. The copy
    behaves as the client does otherwise: same return types, streams, errors.

    Each call is also recorded as a run's step is: a ``chat {model}`` span, under the
    caller's current span, to ``tracer_provider`` (default: OTLP when
    ``OTEL_EXPORTER_OTLP_ENDPOINT`` is set, else OpenTelemetry's global provider when the
    program imported OpenTelemetry, else none), and the step metrics
    (``stayer_step_cost_usd``, ``stayer_step_latency_seconds``, ``stayer_cache_breaks_total``,
    ...) in ``metrics`` (a ``prometheus_client`` registry; default: its global one)."""
    module = type(client).__module__.split(".")[0]
    if module not in ("anthropic", "openai") or not hasattr(client, "copy"):
        raise TypeError(
            f"stayer.meter: expected an anthropic or openai client, got {type(client).__name__}"
        )
    inner_client = getattr(client, "_client", None)
    inner = getattr(inner_client, "_transport", None)
    if inner_client is None or inner is None:
        raise TypeError("stayer.meter: this SDK version keeps no httpx2 client to wrap")
    core = _Core(
        budget or Budget(),
        session if isinstance(session, Session) else Session(session),
        module,
        prices or PriceBook.load(),
        _tracer_provider(tracer_provider),
        _step_metrics(metrics),
    )
    if isinstance(inner_client, httpx2.AsyncClient):
        http: Any = httpx2.AsyncClient(
            transport=_AsyncTransport(inner, core), timeout=inner_client.timeout
        )
    else:
        http = httpx2.Client(transport=_SyncTransport(inner, core), timeout=inner_client.timeout)
    metered: T = client.copy(http_client=http)  # type: ignore[attr-defined]
    metered.stayer_session = core.session  # type: ignore[attr-defined]
    metered.stayer_budget = core.budget  # type: ignore[attr-defined]
    return metered

"""OpenTelemetry GenAI traces of runs, with the exact cost of every model call.

Details and rationale: docs/notes.md, ``stayer/telemetry/tracing.py``.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import re
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

from opentelemetry import trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult
from opentelemetry.trace import (
    NonRecordingSpan,
    SpanContext,
    SpanKind,
    Status,
    StatusCode,
    TraceFlags,
)
from opentelemetry.util.types import AttributeValue

from stayer.agent import Observer
from stayer.events import Event, SubagentStarted, event_record
from stayer.guard.breakers import ToolCallRecord
from stayer.ledger import LedgerEntry
from stayer.models.base import Model, ModelError, ModelRequest, ModelResponse
from stayer.pricing import PriceBook
from stayer.records import to_json
from stayer.tools.base import Tool, ToolContext, ToolResult
from stayer.usage import Usage

if TYPE_CHECKING:
    from stayer.run import RunReport

SUBAGENT = "subagent"  # the tool that runs a child agent (stayer.tools.subagent)


# Seconds an export may take, its retries included, unless OTEL_EXPORTER_OTLP_(TRACES_)TIMEOUT
# says otherwise: an unreachable collector must not hold every run up (the SDK's own
# default is 10 s per batch, with a warning per retry).
EXPORT_TIMEOUT_S = 2.0


def provider(
    otlp: str | None = None,
    service_name: str = "stayer",
    warn: Callable[[str], None] | None = None,
) -> TracerProvider:
    """A tracer provider exporting in batches over OTLP. The protocol is
    ``OTEL_EXPORTER_OTLP_PROTOCOL`` (``grpc``, or ``http/protobuf``, the default); the
    endpoint ``--otlp`` or the standard variables. Each export takes at most
    ``EXPORT_TIMEOUT_S``; a failed one is said once, in one line, to ``warn`` (default:
    stderr), instead of the SDK's log records."""
    protocol = (
        os.environ.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
        or os.environ.get("OTEL_EXPORTER_OTLP_PROTOCOL")
        or "http/protobuf"
    )
    timeout = (
        None
        if os.environ.get("OTEL_EXPORTER_OTLP_TRACES_TIMEOUT")
        or os.environ.get("OTEL_EXPORTER_OTLP_TIMEOUT")
        else EXPORT_TIMEOUT_S
    )
    if protocol == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import (
            OTLPSpanExporter as GrpcExporter,
        )

        exporter: Any = (
            GrpcExporter(endpoint=otlp, insecure=True, timeout=timeout)
            if otlp
            else GrpcExporter(timeout=timeout)
        )
    else:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import (
            OTLPSpanExporter as HttpExporter,
        )

        exporter = (
            HttpExporter(endpoint=otlp.rstrip("/") + "/v1/traces", timeout=timeout)
            if otlp
            else HttpExporter(timeout=timeout)
        )
    endpoint = getattr(exporter, "_endpoint", None) or otlp or "the OTLP endpoint"
    name = os.environ.get("OTEL_SERVICE_NAME") or service_name
    tp = TracerProvider(resource=Resource.create({"service.name": name}))
    tp.add_span_processor(BatchSpanProcessor(QuietExporter(exporter, str(endpoint), warn)))
    return tp


class _Captured(logging.Handler):
    """Keeps the OTLP exporters' log records (a warning per retry, an error per batch)
    from the console; the last one's text says why an export failed."""

    def __init__(self) -> None:
        super().__init__()
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        with contextlib.suppress(Exception):
            self.messages.append(record.getMessage())


_CAPTURED = _Captured()


def _quiet_otlp_logs() -> None:
    """The exporters log under ``opentelemetry.exporter.otlp``: captured, not printed."""
    log = logging.getLogger("opentelemetry.exporter.otlp")
    if _CAPTURED not in log.handlers:
        log.addHandler(_CAPTURED)
        log.propagate = False


def _reason(messages: list[str]) -> str:
    """The gist of an export's log records: ``Connection refused`` out of a urllib3 story,
    else the first record."""
    for message in messages:
        m = re.search(r"\[Errno -?\d+\] ([^'\"()\]]+)", message)
        if m:
            return m.group(1).strip()
    first = messages[0] if messages else "the export failed"
    return first if len(first) <= 160 else first[:157] + "..."


class QuietExporter(SpanExporter):
    """An OTLP span exporter whose failures are one line, said once per provider: which
    endpoint, why, and that the run goes on (its spans are dropped, never its work)."""

    def __init__(
        self, inner: SpanExporter, endpoint: str, warn: Callable[[str], None] | None = None
    ) -> None:
        self.inner, self.endpoint, self.warned = inner, endpoint, False
        self.warn = warn or (lambda line: print(line, file=sys.stderr, flush=True))
        _quiet_otlp_logs()

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        _CAPTURED.messages = []
        result = self.inner.export(spans)
        if result is SpanExportResult.FAILURE and not self.warned:
            self.warned = True
            why = _reason(_CAPTURED.messages)
            self.warn(
                f"warning: traces not exported to {self.endpoint}: {why}; "
                "the run goes on without them"
            )
        return result

    def shutdown(self) -> None:
        self.inner.shutdown()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return bool(self.inner.force_flush(timeout_millis))


def _ids(run_id: str) -> tuple[int, int]:
    """The run's trace id and the id of its (never exported) root: stable across resumes."""
    h = hashlib.sha256(f"stayer-run:{run_id}".encode()).digest()
    return int.from_bytes(h[:16], "big") or 1, int.from_bytes(h[16:24], "big") or 1


def _usage_attributes(response: ModelResponse) -> dict[str, AttributeValue]:
    return usage_attributes(response.usage)


def usage_attributes(u: Usage) -> dict[str, AttributeValue]:
    """A call's usage as the GenAI conventions' attributes (and stayer's own)."""
    return {
        "gen_ai.usage.input_tokens": u.input_tokens,
        "gen_ai.usage.output_tokens": u.output_tokens,
        "gen_ai.usage.cache_read.input_tokens": u.cache_read_tokens,
        "gen_ai.usage.cache_creation.input_tokens": u.cache_write_tokens,
        "gen_ai.usage.cache_write.input_tokens": u.cache_write_tokens,
        "stayer.usage.reasoning_tokens": u.reasoning_tokens,
        "stayer.usage.cache_write_1h_tokens": u.cache_write_1h_tokens,
    }


class RunTracer(Observer):
    """An ``Observer`` that turns one run into spans (see the module docstring)."""

    def __init__(
        self, tp: TracerProvider, prices: PriceBook, run_id: str, agent: str = "stayer"
    ) -> None:
        self.tracer = tp.get_tracer("stayer")
        self.prices = prices
        self.run_id = run_id
        self.agent = agent
        self._context: Any = None
        self._children: list[Any] = []  # sub-agent spans open, innermost last
        # The last model span, still open: ended by its step (which brings the call's cost,
        # priced once, by the loop) or, for a call with no step of its own, by the next.
        self._open: tuple[Any, int, Model, ModelResponse] | None = None

    @contextlib.contextmanager
    def run_span(self, task: str, model: str) -> Iterator[None]:
        trace_id, root = _ids(self.run_id)
        parent = trace.set_span_in_context(
            NonRecordingSpan(
                SpanContext(
                    trace_id, root, is_remote=True, trace_flags=TraceFlags(TraceFlags.SAMPLED)
                )
            )
        )
        span = self.tracer.start_span(
            f"invoke_agent {self.agent}",
            context=parent,
            kind=SpanKind.INTERNAL,
            attributes={
                "gen_ai.operation.name": "invoke_agent",
                "gen_ai.agent.name": self.agent,
                "gen_ai.request.model": model,
                "stayer.run_id": self.run_id,
                "stayer.task": task,
            },
        )
        self._context = trace.set_span_in_context(span)
        try:
            yield
        except BaseException as e:
            span.set_status(Status(StatusCode.ERROR, type(e).__name__))
            raise
        finally:
            self._end_open()
            span.end()

    @contextlib.contextmanager
    def agent_span(self) -> Iterator[None]:
        """A sub-agent's ``invoke_agent`` span, current while the child runs; it takes the
        child's path (``main/sub-1``) from the ``subagent_started`` event."""
        span = self.tracer.start_span(
            "invoke_agent subagent",
            attributes={
                "gen_ai.operation.name": "invoke_agent",
                "gen_ai.agent.name": SUBAGENT,
                "stayer.run_id": self.run_id,
            },
        )
        self._children.append(span)
        try:
            with trace.use_span(span, end_on_exit=False):
                yield
        except BaseException as e:
            span.set_status(Status(StatusCode.ERROR, type(e).__name__))
            raise
        finally:
            self._end_open()  # the child's last call, if no step of its own took it
            self._children.pop()
            span.end()

    def finish(self, report: RunReport) -> None:
        """The run's result on its agent span (call inside ``run_span``)."""
        span = trace.get_current_span(self._context)
        span.set_attribute("stayer.status", report.status)
        span.set_attribute("stayer.stop_reason", report.stop_reason or "")
        span.set_attribute("stayer.cost_usd", report.cost_usd)
        span.set_attribute("stayer.steps", report.steps)

    # --- Observer ------------------------------------------------------------------------

    def model(self, inner: Model) -> Model:
        return _TracedModel(inner, self)

    def tools(self, tools: list[Tool]) -> list[Tool]:
        return [_TracedTool(t, self) for t in tools]

    def on_step(self, entry: LedgerEntry) -> None:
        if self._open is None:
            return  # a replayed step: its call has its span from the run that made it
        span, _, inner, response = self._open
        attributes = step_attributes(entry)
        lost = _lost_attempts(response)
        if lost:
            attributes["stayer.lost_in_flight.attempts"] = lost
        span.set_attributes(attributes)
        _cost_attributes(span, entry.cost.total)
        for attempt in range(1, lost + 1):
            self._lost_span(span, inner, response, entry, attempt)
        self._end_open(priced=True)

    def _lost_span(
        self, reissued: Any, inner: Model, response: ModelResponse, entry: LedgerEntry, attempt: int
    ) -> None:
        """The attempt in flight at a crash, as the ledger has it: the re-issued call's usage
        and cost, estimated; zero duration (when it ran is not known), at the re-issue."""
        start = reissued.start_time
        span = self._chat_span(
            inner,
            start,
            {
                "stayer.step": entry.step,
                "stayer.agent": entry.agent,
                "stayer.lost_in_flight": True,
                "stayer.lost_in_flight.attempt": attempt,
                "stayer.cost_estimated": True,
                **_usage_attributes(response),
            },
        )
        _cost_attributes(span, entry.cost.total)
        span.set_status(Status(StatusCode.ERROR, "lost in flight at a crash"))
        span.end(end_time=start)

    def on_event(self, event: Event) -> None:
        kind, payload = event_record(event)
        if isinstance(event, SubagentStarted) and self._children:  # its path names its span
            path = event.agent
            self._children[-1].update_name(f"invoke_agent {path}")
            self._children[-1].set_attributes({"gen_ai.agent.name": path, "stayer.agent": path})
        span = trace.get_current_span(self._context) if self._context is not None else None
        if span is not None:
            span.add_event(
                f"stayer.{kind}",
                {
                    k: json.dumps(v, default=str)
                    if not isinstance(v, str | int | float | bool)
                    else v
                    for k, v in payload.items()
                },
            )

    # --- spans ----------------------------------------------------------------------------

    def _end_open(self, priced: bool = False) -> None:
        if self._open is not None:
            span, end, inner, response = self._open
            self._open = None
            if not priced:  # a call with no step of its own (a summary): priced here
                _cost_attributes(
                    span,
                    self.prices.cost(
                        response.usage, inner.model_id, inner.provider, response.service_tier
                    ).total,
                )
            span.end(end_time=end)

    def parent(self) -> Any:
        """Where a span goes: under the current span (a sub-agent's ``invoke_agent``, so its
        calls nest under its parent's ``execute_tool subagent``), else under the run's."""
        current = trace.get_current_span()
        if current.get_span_context().is_valid and current.is_recording():
            return None  # the current context
        return self._context

    def model_span(self, inner: Model, request: ModelRequest, start: int) -> Any:
        self._end_open()  # a call before this one with no step of its own (a summary)
        return self._chat_span(inner, start, {"gen_ai.request.max_tokens": request.max_tokens})

    def _chat_span(self, inner: Model, start: int, attributes: dict[str, AttributeValue]) -> Any:
        """A model-call span (``chat {model}``, kind CLIENT) with the request's attributes."""
        return self.tracer.start_span(
            f"chat {inner.model_id}",
            context=self.parent(),
            kind=SpanKind.CLIENT,
            start_time=start,
            attributes={
                "gen_ai.operation.name": "chat",
                "gen_ai.provider.name": inner.provider,
                "gen_ai.request.model": inner.model_id,
                "stayer.model": inner.spec,
                **attributes,
            },
        )

    def model_done(self, span: Any, inner: Model, response: ModelResponse) -> None:
        attributes = _usage_attributes(response)
        attributes["gen_ai.response.model"] = response.model or inner.model_id
        attributes["gen_ai.response.finish_reasons"] = [response.stop_reason or "unknown"]
        if response.service_tier:
            attributes["stayer.service_tier"] = response.service_tier
        span.set_attributes(attributes)
        self._open = (span, time.time_ns(), inner, response)


def step_attributes(entry: LedgerEntry) -> dict[str, AttributeValue]:
    """What a step's ledger entry adds to its model-call span: the step, cache break,
    compaction, breaker trips, route."""
    attributes: dict[str, AttributeValue] = {
        "stayer.step": entry.step,
        "stayer.agent": entry.agent,
        "stayer.context_tokens": entry.context_tokens,
    }
    if entry.cache_break:
        b = entry.cache_break
        attributes["stayer.cache_break.reason"] = b.reason
        attributes["stayer.cache_break.detail"] = b.detail
        attributes["stayer.cache_break.position_tokens"] = b.position_tokens
    if entry.compaction:
        c = entry.compaction
        attributes["stayer.compaction.tokens_before"] = c.tokens_before
        attributes["stayer.compaction.tokens_after"] = c.tokens_after
        attributes["stayer.compaction.cost_usd"] = str(c.cost)
    if entry.trips:
        attributes["stayer.breakers"] = [t.reason for t in entry.trips]
    if entry.route:
        attributes["stayer.route"] = json.dumps(to_json(entry.route))
    return attributes


def record_call(
    tp: Any,
    entry: LedgerEntry,
    *,
    provider: str,
    request_model: str,
    start_ns: int,
    end_ns: int,
    context: Any = None,
    attributes: dict[str, AttributeValue] | None = None,
) -> None:
    """A model call made outside a run (a client metered by ``stayer.meter``), as a run's
    step would have its ``chat {model}`` span: the same usage, cost and step attributes,
    under ``context`` (the caller's span when it was sent)."""
    span = tp.get_tracer("stayer").start_span(
        f"chat {request_model}",
        context=context,
        kind=SpanKind.CLIENT,
        start_time=start_ns,
        attributes={
            "gen_ai.operation.name": "chat",
            "gen_ai.provider.name": provider,
            "gen_ai.request.model": request_model,
            "gen_ai.response.model": entry.model,
            **usage_attributes(entry.usage),
            **step_attributes(entry),
            **(attributes or {}),
        },
    )
    _cost_attributes(span, entry.cost.total)
    span.end(end_time=end_ns)


def _lost_attempts(response: ModelResponse) -> int:
    """How many attempts at this call were lost in flight at a crash (the journal tells the
    re-issued call's response the usage they were billed, as that many times its own)."""
    lost = getattr(response, "lost_usage", None)
    if lost is None:
        return 0
    explicit = getattr(response, "lost_attempts", None)
    if isinstance(explicit, int):
        return explicit
    one = response.usage.input_tokens + response.usage.output_tokens
    return max(1, (lost.input_tokens + lost.output_tokens) // one) if one else 1


def _cost_attributes(span: Any, total: Any) -> None:
    """The call's cost as the conventions' proposal has it, and exactly (``stayer.cost_usd``)."""
    attributes: dict[str, AttributeValue] = {
        "gen_ai.usage.cost.currency": "USD",
        "gen_ai.usage.cost.source": "local",
    }
    if total is not None:
        attributes["gen_ai.usage.cost.amount"] = float(total)
        attributes["stayer.cost_usd"] = str(total)
    span.set_attributes(attributes)


class _TracedModel:
    def __init__(self, inner: Model, tracer: RunTracer) -> None:
        self.inner = inner
        self.tracer = tracer
        # Read by the loop at every step: plain attributes rather than ``__getattr__``.
        self.model_id = inner.model_id
        self.provider = inner.provider
        self.spec = inner.spec

    def __getattr__(self, name: str) -> Any:  # model_id, provider, spec, …: the inner model's
        return getattr(self.inner, name)

    async def complete(self, request: ModelRequest) -> ModelResponse:
        span = self.tracer.model_span(self.inner, request, time.time_ns())
        try:
            response = await self.inner.complete(request)
        except ModelError as e:
            span.set_status(Status(StatusCode.ERROR, str(e)[:200]))
            span.set_attribute("error.type", type(e).__name__)
            span.end()
            raise
        except BaseException as e:  # cancelled (a time limit, a cancel): no reply, no usage
            span.set_status(Status(StatusCode.ERROR, type(e).__name__))
            span.end()
            raise
        self.tracer.model_done(span, self.inner, response)
        return response


class _TracedTool:
    def __init__(self, inner: Tool, tracer: RunTracer) -> None:
        self.inner = inner
        self.tracer = tracer
        self.spec = inner.spec

    async def __call__(self, args: dict[str, Any], ctx: ToolContext) -> ToolResult:
        name = self.spec.name
        tracer = self.tracer
        attributes = {"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": name}
        span = tracer.tracer.start_span(
            f"execute_tool {name}", context=tracer.parent(), attributes=attributes
        )
        t0 = time.perf_counter()
        try:
            if name == SUBAGENT:
                # The child's calls and tools nest under an agent span inside this one.
                with trace.use_span(span, end_on_exit=False), tracer.agent_span():
                    result = await self.inner(args, ctx)
            else:
                result = await self.inner(args, ctx)
        except BaseException as e:
            span.set_status(Status(StatusCode.ERROR, type(e).__name__))
            span.end()
            raise
        code = ToolCallRecord.of(name, "", result.is_error, result.output).exit_code
        done: dict[str, AttributeValue] = {
            "stayer.tool.is_error": result.is_error,
            "stayer.tool.output_bytes": len(result.raw()),
            "stayer.tool.seconds": round(time.perf_counter() - t0, 6),
        }
        if code is not None:
            done["stayer.tool.exit_code"] = code
        span.set_attributes(done)
        if result.is_error:
            span.set_status(Status(StatusCode.ERROR))
        span.end()
        return result


async def execute_traced(
    prepared: Any, on_step: Any, tp: TracerProvider, *, journal: Any = None, controls: Any = None
) -> RunReport:
    """``stayer.run.execute`` inside the run's ``invoke_agent`` span."""
    from stayer.run import Controls, execute

    controls = controls or Controls()
    tracer = RunTracer(tp, prepared.prices, prepared.run_id)
    controls.observers = [*controls.observers, tracer]
    with tracer.run_span(prepared.task.name, prepared.config.model):
        report = await execute(prepared, on_step, journal=journal, controls=controls)
        tracer.finish(report)
    return report

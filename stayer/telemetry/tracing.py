"""OpenTelemetry GenAI traces of runs, with the exact cost of every model call.

Spans follow the GenAI semantic conventions:

* ``invoke_agent {agent}`` — one per execution of a run (a resumed run adds one to the same
  trace: the trace id is derived from the run id);
* ``chat {model}`` (kind CLIENT) — one per live model call: ``gen_ai.operation.name``,
  ``gen_ai.provider.name``, ``gen_ai.request.model``, ``gen_ai.response.model``,
  ``gen_ai.response.finish_reasons``, ``gen_ai.usage.input_tokens`` (cached tokens
  included), ``gen_ai.usage.output_tokens`` (reasoning included),
  ``gen_ai.usage.cache_read.input_tokens`` and the cache write under both names in use
  (``cache_creation`` and ``cache_write``). Cost follows the open proposal for the
  conventions (semantic-conventions-genai PR #443): ``gen_ai.usage.cost.amount``,
  ``.currency``, ``.source`` (``local``: priced by stayer), on model-call spans only, so
  that summing over spans never counts a run twice. stayer's own attributes are under
  ``stayer.*``: the step, cache-break reason and position, compaction before/after tokens
  and cost, breaker trips, route switches;
* ``execute_tool {name}`` — one per live tool call: exit code, error, output bytes.

Replayed calls of a resumed run emit nothing (the observer sits inside the journal), so
the trace holds each paid call once. A call lost in flight at a crash has no span (its
process died with it); the run's ledger carries its estimate as ``lost_in_flight``.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import time
from collections.abc import Iterator
from typing import Any

from opentelemetry import trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.trace import (
    NonRecordingSpan,
    SpanContext,
    SpanKind,
    Status,
    StatusCode,
    TraceFlags,
)

from stayer.agent import LedgerEntry
from stayer.guard.breakers import ToolCallRecord
from stayer.models.base import Model, ModelError, ModelRequest, ModelResponse
from stayer.pricing import PriceBook
from stayer.tools.base import Tool, ToolContext, ToolResult


def provider(otlp: str | None = None, service_name: str = "stayer") -> TracerProvider:
    """A tracer provider exporting in batches over OTLP. The protocol is
    ``OTEL_EXPORTER_OTLP_PROTOCOL`` (``grpc``, or ``http/protobuf``, the default); the
    endpoint ``--otlp`` or the standard variables."""
    protocol = os.environ.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL") or os.environ.get("OTEL_EXPORTER_OTLP_PROTOCOL") or "http/protobuf"
    if protocol == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import (
            OTLPSpanExporter as GrpcExporter,
        )

        exporter: Any = GrpcExporter(endpoint=otlp, insecure=True) if otlp else GrpcExporter()
    else:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import (
            OTLPSpanExporter as HttpExporter,
        )

        exporter = HttpExporter(endpoint=otlp.rstrip("/") + "/v1/traces") if otlp else HttpExporter()
    name = os.environ.get("OTEL_SERVICE_NAME") or service_name
    tp = TracerProvider(resource=Resource.create({"service.name": name}))
    tp.add_span_processor(BatchSpanProcessor(exporter))
    return tp


def _ids(run_id: str) -> tuple[int, int]:
    """The run's trace id and the id of its (never exported) root: stable across resumes."""
    h = hashlib.sha256(f"stayer-run:{run_id}".encode()).digest()
    return int.from_bytes(h[:16], "big") or 1, int.from_bytes(h[16:24], "big") or 1


def _usage_attributes(response: ModelResponse) -> dict[str, Any]:
    u = response.usage
    return {
        "gen_ai.usage.input_tokens": u.input_tokens,
        "gen_ai.usage.output_tokens": u.output_tokens,
        "gen_ai.usage.cache_read.input_tokens": u.cache_read_tokens,
        "gen_ai.usage.cache_creation.input_tokens": u.cache_write_tokens,
        "gen_ai.usage.cache_write.input_tokens": u.cache_write_tokens,
        "stayer.usage.reasoning_tokens": u.reasoning_tokens,
        "stayer.usage.cache_write_1h_tokens": u.cache_write_1h_tokens,
    }


class RunTracer:
    """A ``RunObserver`` that turns one run into spans (see the module docstring)."""

    def __init__(self, tp: TracerProvider, prices: PriceBook, run_id: str, agent: str = "stayer") -> None:
        self.tracer = tp.get_tracer("stayer")
        self.prices = prices
        self.run_id = run_id
        self.agent = agent
        self._context: Any = None
        # The last model span, still open: ended by its step (which brings the call's cost,
        # priced once, by the loop) or, for a call with no step of its own, by the next.
        self._open: tuple[Any, int, Model, ModelResponse] | None = None

    @contextlib.contextmanager
    def run_span(self, task: str, model: str) -> Iterator[None]:
        trace_id, root = _ids(self.run_id)
        parent = trace.set_span_in_context(
            NonRecordingSpan(SpanContext(trace_id, root, is_remote=True, trace_flags=TraceFlags(TraceFlags.SAMPLED)))
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

    def finish(self, doc: dict[str, Any]) -> None:
        """The run's result on its agent span (call inside ``run_span``)."""
        span = trace.get_current_span(self._context)
        span.set_attribute("stayer.status", doc.get("status", ""))
        span.set_attribute("stayer.stop_reason", doc.get("stop_reason") or "")
        span.set_attribute("stayer.cost_usd", str(doc.get("cost_usd")))
        span.set_attribute("stayer.steps", int(doc.get("steps") or 0))

    # --- RunObserver ---------------------------------------------------------------------

    def model(self, inner: Model) -> Model:
        return _TracedModel(inner, self)

    def tools(self, tools: list[Tool]) -> list[Tool]:
        return [_TracedTool(t, self) for t in tools]

    def on_step(self, entry: LedgerEntry) -> None:
        if self._open is None:
            return  # a replayed step: its call has its span from the run that made it
        span = self._open[0]
        _cost_attributes(span, entry.cost.total)
        span.set_attribute("stayer.step", entry.step)
        span.set_attribute("stayer.agent", entry.agent)
        span.set_attribute("stayer.context_tokens", entry.context_tokens)
        if entry.cache_break:
            span.set_attribute("stayer.cache_break.reason", str(entry.cache_break.get("reason", "")))
            if entry.cache_break.get("position_tokens") is not None:
                span.set_attribute("stayer.cache_break.position_tokens", int(entry.cache_break["position_tokens"]))
            span.set_attribute("stayer.cache_break.detail", str(entry.cache_break.get("detail", "")))
        if entry.compaction:
            c = entry.compaction
            span.set_attribute("stayer.compaction.tokens_before", int(c.get("tokens_before", 0)))
            span.set_attribute("stayer.compaction.tokens_after", int(c.get("tokens_after", 0)))
            span.set_attribute("stayer.compaction.cost_usd", str(c.get("cost_usd")))
        if entry.breakers:
            span.set_attribute("stayer.breakers", [b.get("reason", "") for b in entry.breakers])
        if entry.route:
            span.set_attribute("stayer.route", json.dumps(entry.route, default=str))
        self._end_open(priced=True)

    def on_event(self, kind: str, payload: dict[str, Any]) -> None:
        span = trace.get_current_span(self._context) if self._context is not None else None
        if span is not None:
            span.add_event(f"stayer.{kind}", {k: json.dumps(v, default=str) if not isinstance(v, str | int | float | bool) else v
                                              for k, v in payload.items()})

    # --- spans ----------------------------------------------------------------------------

    def _end_open(self, priced: bool = False) -> None:
        if self._open is not None:
            span, end, inner, response = self._open
            self._open = None
            if not priced:  # a call with no step of its own (a summary): priced here
                _cost_attributes(span, self.prices.cost(response.usage, inner.model_id, inner.provider, response.service_tier).total)
            span.end(end_time=end)

    def parent(self) -> Any:
        """Where a span goes: under the tool call in progress (a sub-agent's calls nest
        under its parent's ``execute_tool subagent``), else under the run's agent span."""
        current = trace.get_current_span()
        if current.get_span_context().is_valid and current.is_recording():
            return None  # the current context
        return self._context

    def model_span(self, inner: Model, request: ModelRequest, start: int) -> Any:
        self._end_open()  # a call before this one with no step of its own (a summary)
        return self.tracer.start_span(
            f"chat {inner.model_id}",
            context=self.parent(),
            kind=SpanKind.CLIENT,
            start_time=start,
            attributes={
                "gen_ai.operation.name": "chat",
                "gen_ai.provider.name": inner.provider,
                "gen_ai.request.model": inner.model_id,
                "gen_ai.request.max_tokens": request.max_tokens,
                "stayer.model": inner.spec,
            },
        )

    def model_done(self, span: Any, inner: Model, response: ModelResponse) -> None:
        span.set_attributes(_usage_attributes(response))
        span.set_attribute("gen_ai.response.model", response.model or inner.model_id)
        span.set_attribute("gen_ai.response.finish_reasons", [response.stop_reason or "unknown"])
        if response.service_tier:
            span.set_attribute("stayer.service_tier", response.service_tier)
        self._open = (span, time.time_ns(), inner, response)


def _cost_attributes(span: Any, total: Any) -> None:
    """The call's cost as the conventions' proposal has it, and exactly (``stayer.cost_usd``)."""
    if total is not None:
        span.set_attribute("gen_ai.usage.cost.amount", float(total))
        span.set_attribute("stayer.cost_usd", str(total))
    span.set_attribute("gen_ai.usage.cost.currency", "USD")
    span.set_attribute("gen_ai.usage.cost.source", "local")


class _TracedModel:
    def __init__(self, inner: Model, tracer: RunTracer) -> None:
        self.inner = inner
        self.tracer = tracer

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
        self.tracer.model_done(span, self.inner, response)
        return response


class _TracedTool:
    def __init__(self, inner: Tool, tracer: RunTracer) -> None:
        self.inner = inner
        self.tracer = tracer
        self.spec = inner.spec

    async def __call__(self, args: dict[str, Any], ctx: ToolContext) -> ToolResult:
        name = self.spec.name
        with self.tracer.tracer.start_as_current_span(
            f"execute_tool {name}",
            context=self.tracer.parent(),
            kind=SpanKind.INTERNAL,
            attributes={"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": name},
        ) as span:
            result = await self.inner(args, ctx)
            record = ToolCallRecord.of(name, json.dumps(args), result.is_error, result.output)
            span.set_attribute("stayer.tool.is_error", result.is_error)
            span.set_attribute("stayer.tool.output_bytes", len(result.output.encode()))
            if record.exit_code is not None:
                span.set_attribute("stayer.tool.exit_code", record.exit_code)
            if result.is_error:
                span.set_status(Status(StatusCode.ERROR))
            return result


async def execute_traced(prepared: Any, on_step: Any, tp: TracerProvider, *, journal: Any = None, controls: Any = None) -> dict[str, Any]:
    """``eval.trial.execute`` inside the run's ``invoke_agent`` span."""
    from stayer.eval.trial import Controls, execute

    controls = controls or Controls()
    tracer = RunTracer(tp, prepared.prices, prepared.run_id)
    controls.observers = [*controls.observers, tracer]
    with tracer.run_span(prepared.task.name, prepared.config.model):
        doc = await execute(prepared, on_step, journal=journal, controls=controls)
        tracer.finish(doc)
    return doc

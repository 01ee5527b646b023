"""A call of a client metered by ``stayer.meter`` is recorded as a run's step is: the
journal's ledger, a ``chat {model}`` OpenTelemetry span with its usage and exact cost
(under the caller's span), and the step metrics of Prometheus, all with the same figures,
against ``stayer sim serve``."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path

import anthropic
import openai
import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from prometheus_client import CollectorRegistry
from service_helpers import listening

import stayer

SYSTEM = "Be exact. " * 700


@pytest.fixture(scope="module")
def sim() -> Iterator[str]:
    with listening(["sim", "serve", "--port", "0"]) as url:
        yield url


def test_metered_calls_are_spans_and_step_metrics_matching_the_ledger(
    sim: str, tmp_path: Path
) -> None:
    exporter = InMemorySpanExporter()
    tp = TracerProvider()
    tp.add_span_processor(SimpleSpanProcessor(exporter))
    registry = CollectorRegistry()
    session = stayer.Session("py-telemetry", home=tmp_path)
    client = stayer.meter(
        anthropic.Anthropic(base_url=sim, api_key="sk-x", max_retries=0),
        session=session, tracer_provider=tp, metrics=registry,
    )  # fmt: skip
    tracer = tp.get_tracer("app")
    with tracer.start_as_current_span("app work") as parent:
        for system in (SYSTEM, SYSTEM, "Be brief. " + SYSTEM):  # the last edits the prefix
            client.messages.create(
                model="claude-sonnet-4-5", max_tokens=100,
                system=[{"type": "text", "text": system, "cache_control": {"type": "ephemeral"}}],
                messages=[{"role": "user", "content": "hi"}],
            )  # fmt: skip

    async def one_async() -> None:
        aclient = stayer.meter(
            openai.AsyncOpenAI(base_url=f"{sim}/v1", api_key="sk-x"),
            session=session, tracer_provider=tp, metrics=registry,
        )  # fmt: skip
        await aclient.chat.completions.create(
            model="gpt-5", messages=[{"role": "user", "content": "a"}]
        )

    asyncio.run(one_async())
    ledger = session.ledger
    assert len(ledger) == 4
    spans = [s for s in exporter.get_finished_spans() if s.name != "app work"]
    assert [s.name for s in spans] == ["chat claude-sonnet-4-5"] * 3 + ["chat gpt-5"]
    for span, entry in zip(spans, ledger, strict=True):
        a = span.attributes or {}
        assert a["gen_ai.operation.name"] == "chat"
        assert a["stayer.step"] == entry["step"] and a["stayer.session"] == "py-telemetry"
        assert Decimal(str(a["stayer.cost_usd"])) == Decimal(entry["cost_usd"])
        assert Decimal(str(a["gen_ai.usage.cost.amount"])) == Decimal(entry["cost_usd"])
        u = entry["usage"]
        assert a["gen_ai.usage.input_tokens"] == u["input_tokens"]
        assert a["gen_ai.usage.output_tokens"] == u["output_tokens"]
        assert a["gen_ai.usage.cache_read.input_tokens"] == u["cache_read_tokens"]
        assert a.get("stayer.cache_break.reason") == (entry["cache_break"] or {}).get("reason")
    # the sync calls nest under the caller's span; the async one had none around it
    for span in spans[:3]:
        assert span.parent is not None
        assert span.parent.span_id == parent.get_span_context().span_id
    assert spans[3].parent is None
    assert spans[0].attributes["gen_ai.provider.name"] == "anthropic"  # type: ignore[index]
    breaks = [e["cache_break"]["reason"] for e in ledger if e["cache_break"]]
    assert breaks, "the edited prefix is a cache break"

    def sample(name: str, labels: dict[str, str]) -> float:
        value = registry.get_sample_value(name, labels)
        return 0.0 if value is None else value

    claude = [e for e in ledger if e["model"].startswith("claude")]
    assert sample("stayer_step_cost_usd_count", {"model": claude[0]["model"]}) == 3
    assert sample("stayer_step_cost_usd_sum", {"model": claude[0]["model"]}) == pytest.approx(
        float(sum(Decimal(e["cost_usd"]) for e in claude))
    )
    assert sample("stayer_step_latency_seconds_count", {"model": ledger[3]["model"]}) == 1
    for reason in set(breaks):
        assert sample("stayer_cache_breaks_total", {"reason": reason}) == breaks.count(reason)

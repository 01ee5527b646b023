"""OpenTelemetry spans of a real ``stayer run``, received over OTLP (HTTP and gRPC) by
oteltest's pure-Python sinks on loopback."""

from __future__ import annotations

import base64
import contextlib
import json
import logging
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

sink = pytest.importorskip("oteltest.sink", reason="oteltest is not installed (dev extra)")
pytest.importorskip("opentelemetry.sdk", reason="the otel extra is not installed")

ROOT = Path(__file__).resolve().parent.parent


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _value(v: dict[str, Any]) -> Any:
    for key in ("stringValue", "boolValue", "doubleValue"):
        if key in v:
            return v[key]
    if "intValue" in v:
        return int(v["intValue"])
    if "arrayValue" in v:
        return [_value(x) for x in v["arrayValue"].get("values", [])]
    return None


class Collector(sink.handler.RequestHandler):
    def __init__(self) -> None:
        self.spans: list[dict[str, Any]] = []
        self.lock = threading.Lock()

    def handle_trace(self, request: Any, headers: Any) -> None:
        from google.protobuf.json_format import MessageToDict

        doc = MessageToDict(request)
        with self.lock:
            for rs in doc.get("resourceSpans", []):
                resource = {
                    a["key"]: _value(a["value"])
                    for a in rs.get("resource", {}).get("attributes", [])
                }
                for ss in rs.get("scopeSpans", []):
                    for span in ss.get("spans", []):
                        span["attrs"] = {
                            a["key"]: _value(a["value"]) for a in span.get("attributes", [])
                        }
                        span["resource"] = resource
                        self.spans.append(span)

    def handle_metrics(self, request: Any, headers: Any) -> None:
        pass

    def handle_logs(self, request: Any, headers: Any) -> None:
        pass


@contextlib.contextmanager
def _receiver(kind: str = "http") -> Iterator[tuple[Collector, int]]:
    """An oteltest sink (``http`` or ``grpc``) on a free loopback port, and what it receives."""
    collector = Collector()
    port = _free_port()
    sinks = {"http": sink.HttpSink, "grpc": sink.GrpcSink}
    server = sinks[kind](collector, logging.getLogger("oteltest"), port=port)
    server.start()
    try:
        yield collector, port
    finally:
        server.stop()


def _run(tmp_path: Path, env_extra: dict[str, str], *args: str, rc: int = 0) -> dict[str, Any]:
    env = {
        **os.environ,
        "STAYER_HOME": str(tmp_path / "home"),
        "PYTHONPATH": str(ROOT),
        **env_extra,
    }
    for k in (
        "OTEL_EXPORTER_OTLP_ENDPOINT",
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
        "OTEL_EXPORTER_OTLP_PROTOCOL",
    ):
        if k not in env_extra:
            env.pop(k, None)
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "stayer.cli",
            "run",
            str(ROOT / "examples" / "fix-median"),
            "--model",
            "sim:claude-sonnet-4-5",
            "--policy",
            "none",
            "--json",
            *args,
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert r.returncode == rc, r.stderr[-3000:]
    return json.loads(r.stdout)


def _wait_spans(collector: Collector, doc: dict[str, Any]) -> list[dict[str, Any]]:
    # The run's process flushed its batch before exiting; the sink may still be parsing it.
    want = {"invoke_agent stayer"}
    for _ in range(600):
        with collector.lock:
            names = {s["name"] for s in collector.spans}
        if want <= names:
            break
        time.sleep(0.05)
    with collector.lock:
        return list(collector.spans)  # one collector per test: all of them are this run's


def _check(spans: list[dict[str, Any]], doc: dict[str, Any]) -> None:
    agents = [s for s in spans if s["name"] == "invoke_agent stayer"]
    assert len(agents) == 1
    agent = agents[0]
    assert agent["attrs"]["gen_ai.operation.name"] == "invoke_agent"
    assert agent["attrs"]["stayer.run_id"] == doc["run_id"]
    assert agent["attrs"]["stayer.status"] == doc["status"] == "succeeded"
    assert agent["resource"]["service.name"] == "stayer-test"
    chats = [s for s in spans if s["name"].startswith("chat ")]
    tools = [s for s in spans if s["name"].startswith("execute_tool ")]
    assert len(chats) == doc["steps"] and {s["name"] for s in chats} == {"chat claude-sonnet-4-5"}
    assert {"execute_tool bash", "execute_tool submit"} <= {s["name"] for s in tools}
    for s in chats + tools:
        assert s["traceId"] == agent["traceId"] and s["parentSpanId"] == agent["spanId"]
    for s in chats:
        a = s["attrs"]
        assert s["kind"] == "SPAN_KIND_CLIENT"
        assert a["gen_ai.operation.name"] == "chat" and a["gen_ai.provider.name"] == "anthropic"
        assert a["gen_ai.request.model"] == "claude-sonnet-4-5"
        assert (
            a["gen_ai.usage.input_tokens"]
            >= a["gen_ai.usage.cache_read.input_tokens"]
            + a["gen_ai.usage.cache_write.input_tokens"]
        )
        assert (
            a["gen_ai.usage.cache_creation.input_tokens"]
            == a["gen_ai.usage.cache_write.input_tokens"]
        )
        assert a["gen_ai.usage.cost.currency"] == "USD" and a["gen_ai.usage.cost.source"] == "local"
        assert isinstance(a["gen_ai.response.finish_reasons"], list)
        assert a["stayer.step"] >= 1 and "stayer.context_tokens" in a
    assert sorted(s["attrs"]["stayer.step"] for s in chats) == list(range(1, doc["steps"] + 1))
    # The model-call spans carry the run's cost exactly, and nothing else does.
    assert sum(Decimal(s["attrs"]["stayer.cost_usd"]) for s in chats) == Decimal(doc["cost_usd"])
    assert (
        abs(sum(s["attrs"]["gen_ai.usage.cost.amount"] for s in chats) - float(doc["cost_usd"]))
        < 1e-9
    )
    assert not [
        s
        for s in spans
        if "gen_ai.usage.cost.amount" in s["attrs"] and not s["name"].startswith("chat ")
    ]
    bash = next(s for s in tools if s["name"] == "execute_tool bash")
    assert bash["attrs"]["gen_ai.tool.name"] == "bash" and "stayer.tool.exit_code" in bash["attrs"]
    # The trace id comes from the run id, so a resumed run continues the same trace.
    from stayer.telemetry.tracing import _ids

    assert int.from_bytes(base64.b64decode(agent["traceId"]), "big") == _ids(doc["run_id"])[0]


def test_spans_of_a_run_over_otlp_http(tmp_path: Path) -> None:
    with _receiver() as (collector, port):
        doc = _run(
            tmp_path, {"OTEL_SERVICE_NAME": "stayer-test"}, "--otlp", f"http://127.0.0.1:{port}"
        )
        _check(_wait_spans(collector, doc), doc)


def test_spans_of_a_run_over_otlp_grpc(tmp_path: Path) -> None:
    with _receiver("grpc") as (collector, port):
        env = {
            "OTEL_SERVICE_NAME": "stayer-test",
            "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc",
            "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{port}",
        }
        doc = _run(tmp_path, env)
        _check(_wait_spans(collector, doc), doc)


def test_without_a_collector_opentelemetry_is_not_imported(tmp_path: Path) -> None:
    code = (
        "import sys\n"
        "from stayer.cli import app\n"
        "try:\n"
        f"    app(['run', {str(ROOT / 'examples' / 'hello-file')!r}, '--model', 'sim:claude-sonnet-4-5', '--json'])\n"
        "except SystemExit as e:\n"
        "    assert e.code == 0, e.code\n"
        "print(sorted(m for m in sys.modules if m.startswith('opentelemetry')))\n"
    )
    env = {**os.environ, "STAYER_HOME": str(tmp_path / "home"), "PYTHONPATH": str(ROOT)}
    for k in ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"):
        env.pop(k, None)
    r = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=600
    )
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.strip().splitlines()[-1] == "[]"


# --- in process: sub-agents and calls lost in flight --------------------------------------


def _memory_tracer(prices: Any, run_id: str) -> tuple[Any, Any]:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    exporter = InMemorySpanExporter()
    tp = TracerProvider()
    tp.add_span_processor(SimpleSpanProcessor(exporter))
    return tp, exporter


def test_a_sub_agent_is_an_agent_span_nested_under_its_parents_tool_span(tmp_path: Path) -> None:
    import asyncio

    from stayer.agent import Agent, AgentSettings, Limits
    from stayer.delegation import ChildAgents, ChildSettings
    from stayer.guard.budget import Budget
    from stayer.models.scripted import COUNTER, Prices, ScriptedModel, bash, call, rates
    from stayer.sandbox.local import LocalSandbox
    from stayer.telemetry.tracing import RunTracer
    from stayer.tools import default_tools
    from stayer.tools.base import ToolContext

    prices = Prices(
        {"m-strong": rates("3", "0.3", "3.75", "15"), "m-cheap": rates("1", "0.1", "1.25", "5")}
    )
    tp, exporter = _memory_tracer(prices, "run-sub")
    tracer = RunTracer(tp, prices, "run-sub")
    parent_model = ScriptedModel(
        replies=[
            call("subagent", {"task": "Write the word done to sub.txt", "budget_usd": 0.05}, 1),
            call("submit", {"summary": "delegated"}, 2),
        ]
    )
    child_model = ScriptedModel(
        "m-cheap", [bash("echo done > sub.txt", 1), call("submit", {"summary": "written"}, 2)]
    )
    ctx = ToolContext(sandbox=LocalSandbox(tmp_path), workspace=str(tmp_path))
    parent = Agent(
        tracer.model(parent_model),
        tracer.tools(default_tools(COUNTER.counter)),
        ctx,
        AgentSettings(prices, COUNTER, Limits(max_steps=10), budget=Budget(Decimal("1"))),
        [tracer],
    )
    children = ChildAgents(
        parent,
        tracer.model(child_model),
        lambda: tracer.tools(default_tools(COUNTER.counter)),
        ChildSettings(max_steps=6),
    )
    parent.add_tool(tracer.tools([children.tool()])[0])

    async def go() -> Any:
        with tracer.run_span("sub-task", "m-strong"):
            return await parent.run("Parent task", "run-sub")

    result = asyncio.run(go())
    assert result.status == "submitted"
    spans = exporter.get_finished_spans()
    by_id = {s.context.span_id: s for s in spans}

    def parent_of(s: Any) -> Any:
        return by_id.get(s.parent.span_id) if s.parent is not None else None

    [root] = [s for s in spans if s.name == "invoke_agent stayer"]
    [tool] = [s for s in spans if s.name == "execute_tool subagent"]
    [child] = [s for s in spans if s.name == "invoke_agent main/sub-1"]
    assert parent_of(tool) is root and parent_of(child) is tool
    assert child.attributes["gen_ai.agent.name"] == "main/sub-1"
    assert child.attributes["gen_ai.operation.name"] == "invoke_agent"
    chats = [s for s in spans if s.name.startswith("chat ")]
    assert sorted(s.name for s in chats) == [
        "chat m-cheap",
        "chat m-cheap",
        "chat m-strong",
        "chat m-strong",
    ]
    for s in chats:  # the child's calls under the child's span, the parent's under the run's
        assert parent_of(s) is (child if s.name == "chat m-cheap" else root)
    child_tools = [s for s in spans if s.name.startswith("execute_tool ") and parent_of(s) is child]
    assert {s.name for s in child_tools} == {"execute_tool bash", "execute_tool submit"}
    assert all(s.attributes["stayer.tool.seconds"] >= 0 for s in child_tools)
    # Every call's cost once, on model-call spans only: they add up to the run's cost.
    assert sum(Decimal(s.attributes["stayer.cost_usd"]) for s in chats) == result.cost_usd
    assert not [
        s
        for s in spans
        if "gen_ai.usage.cost.amount" in s.attributes and not s.name.startswith("chat ")
    ]
    assert {s.context.trace_id for s in spans} == {root.context.trace_id}


def test_a_call_lost_in_flight_gets_its_own_span_when_the_resumed_run_issues_it_again(
    tmp_path: Path, monkeypatch: Any
) -> None:
    import asyncio

    from test_resume import STEPS, Crash, ProviderCalls, WorkPolicy, make_task

    from stayer.eval.resume import prepare_resume
    from stayer.models.sim import SimModel
    from stayer.run import RunSettings, execute, prepare
    from stayer.telemetry.tracing import execute_traced

    monkeypatch.setenv("STAYER_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("STAYER_DB", raising=False)
    task = make_task(tmp_path)
    prepared = prepare(
        RunSettings(
            str(task),
            "sim:claude-sonnet-4-5",
            max_steps=30,
            run_id="lost-1",
            sim_policy="synthetic:steps=1",
            sandbox="local",
        )
    )
    prepared.model = ProviderCalls(
        SimModel("claude-sonnet-4-5", WorkPolicy(STEPS), prepared.counter), crash_at=6
    )
    with pytest.raises(Crash):
        asyncio.run(execute(prepared))

    prepared, journal = prepare_resume("lost-1")
    prepared.model = ProviderCalls(
        SimModel("claude-sonnet-4-5", WorkPolicy(STEPS), prepared.counter)
    )
    tp, exporter = _memory_tracer(prepared.prices, "lost-1")
    doc = asyncio.run(execute_traced(prepared, None, tp, journal=journal))
    assert (
        doc["steps"] == STEPS + 1
    )  # (the local sandbox has no /logs: the verdict is not the point)
    chats = [s for s in exporter.get_finished_spans() if s.name.startswith("chat ")]
    lost = [s for s in chats if s.attributes.get("stayer.lost_in_flight")]
    [entry] = [e for e in doc["ledger"] if e.get("kind") == "lost_in_flight"]
    assert len(lost) == 1 and lost[0].attributes["stayer.step"] == entry["step"] == 6
    assert lost[0].attributes["stayer.cost_usd"] == entry["cost_usd"]
    assert lost[0].attributes["gen_ai.usage.input_tokens"] == entry["usage"]["input_tokens"]
    assert lost[0].start_time == lost[0].end_time
    reissued = next(
        s
        for s in chats
        if s.attributes["stayer.step"] == 6 and not s.attributes.get("stayer.lost_in_flight")
    )
    assert reissued.attributes["stayer.lost_in_flight.attempts"] == 1
    # Steps 1-5 were replayed (their spans belong to the killed process); from the resume
    # on, the model-call spans add up to the rest of the run's cost, the lost call's included.
    replayed = sum(
        Decimal(e["cost_usd"])
        for e in doc["ledger"]
        if e["step"] < 6 and e.get("kind") != "lost_in_flight"
    )
    assert sorted(s.attributes["stayer.step"] for s in chats) == [6, *range(6, doc["steps"] + 1)]
    assert (
        sum(Decimal(s.attributes["stayer.cost_usd"]) for s in chats)
        == Decimal(doc["cost_usd"]) - replayed
    )


def test_eval_exports_one_trace_per_trial(tmp_path: Path) -> None:
    with _receiver() as (collector, port):
        env = {**os.environ, "STAYER_HOME": str(tmp_path / "home"), "PYTHONPATH": str(ROOT)}
        for k in (
            "OTEL_EXPORTER_OTLP_ENDPOINT",
            "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
            "OTEL_EXPORTER_OTLP_PROTOCOL",
            "OTEL_SERVICE_NAME",
        ):
            env.pop(k, None)
        r = subprocess.run(
            [
                sys.executable,
                "-m",
                "stayer.cli",
                "eval",
                str(ROOT / "examples" / "hello-file"),
                "--model",
                "sim:claude-sonnet-4-5",
                "--epochs",
                "2",
                "--json",
                "--out",
                str(tmp_path / "out"),
                "--otlp",
                f"http://127.0.0.1:{port}",
            ],
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert r.returncode == 0, r.stderr[-3000:]
        trials = [
            json.loads(f.read_text()) for f in sorted((tmp_path / "out" / "trials").rglob("*.json"))
        ]
        run_ids = {t["run_id"] for t in trials}
        for _ in range(600):
            with collector.lock:
                agents = [s for s in collector.spans if s["name"] == "invoke_agent stayer"]
            if len(agents) >= 2:
                break
            time.sleep(0.05)
        with collector.lock:
            spans = list(collector.spans)
    agents = [s for s in spans if s["name"] == "invoke_agent stayer"]
    assert {s["attrs"]["stayer.run_id"] for s in agents} == run_ids and len(run_ids) == 2
    assert len({s["traceId"] for s in agents}) == 2  # a trace per trial, from its run id
    assert {s["resource"]["service.name"] for s in spans} == {"stayer-eval"}
    for trial in trials:
        trace_id = next(
            s["traceId"] for s in agents if s["attrs"]["stayer.run_id"] == trial["run_id"]
        )
        chats = [s for s in spans if s["traceId"] == trace_id and s["name"].startswith("chat ")]
        assert sum(Decimal(s["attrs"]["stayer.cost_usd"]) for s in chats) == Decimal(
            trial["cost_usd"]
        )


def test_compactions_and_cache_breaks_are_on_the_model_spans(tmp_path: Path) -> None:
    with _receiver() as (collector, port):
        doc = _run(
            tmp_path,
            {},
            "--otlp",
            f"http://127.0.0.1:{port}",
            "--policy",
            "summarize:3000",
            "--sim-policy",
            "synthetic:steps=8,obs_tokens=400",
            rc=1,
        )  # (busy work: the task fails)
        spans = _wait_spans(collector, doc)
    chats = {s["attrs"]["stayer.step"]: s["attrs"] for s in spans if s["name"].startswith("chat ")}
    assert sorted(chats) == [e["step"] for e in doc["ledger"]]
    compacted = [e for e in doc["ledger"] if e.get("compaction")]
    assert compacted, "the policy should have compacted"
    for e in doc["ledger"]:
        a = chats[e["step"]]
        if e.get("compaction"):
            assert a["stayer.compaction.tokens_before"] == e["compaction"]["tokens_before"]
            assert (
                a["stayer.compaction.tokens_after"]
                == e["compaction"]["tokens_after"]
                < e["compaction"]["tokens_before"]
            )
            assert "stayer.compaction.cost_usd" in a
        else:
            assert "stayer.compaction.tokens_before" not in a
        if e.get("cache_break"):
            assert a["stayer.cache_break.reason"] == e["cache_break"]["reason"]
        else:
            assert "stayer.cache_break.reason" not in a
        assert a["stayer.cost_usd"] == e["cost_usd"]
    assert any(e.get("cache_break") for e in doc["ledger"])


@pytest.mark.parametrize("protocol", ["http/protobuf", "grpc"])
def test_an_unreachable_collector_is_one_warning_and_a_bounded_export(
    tmp_path: Path, protocol: str
) -> None:
    """Before: ~7 s more per run and the SDK's raw warnings (one per retry). Now each
    export is bounded (EXPORT_TIMEOUT_S) and the failure is one line naming the endpoint."""
    from stayer.telemetry.tracing import EXPORT_TIMEOUT_S, QuietExporter, provider

    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    said: list[str] = []
    os.environ.pop("OTEL_EXPORTER_OTLP_TIMEOUT", None)
    old = os.environ.get("OTEL_EXPORTER_OTLP_PROTOCOL")
    os.environ["OTEL_EXPORTER_OTLP_PROTOCOL"] = protocol
    try:
        tp = provider(f"http://127.0.0.1:{port}", warn=said.append)
    finally:
        if old is None:
            os.environ.pop("OTEL_EXPORTER_OTLP_PROTOCOL")
        else:
            os.environ["OTEL_EXPORTER_OTLP_PROTOCOL"] = old
    exporter = tp._active_span_processor._span_processors[0]._batch_processor._exporter  # type: ignore[attr-defined]
    assert isinstance(exporter, QuietExporter)
    inner = exporter.inner
    bound = getattr(getattr(inner, "_client", None), "_timeout", None) or inner._timeout  # type: ignore[attr-defined]
    assert bound == EXPORT_TIMEOUT_S <= 2
    with tp.get_tracer("t").start_as_current_span("s"):
        pass
    tp.shutdown()
    assert len(said) == 1 and f"127.0.0.1:{port}" in said[0], said
    assert said[0].startswith("warning: traces not exported to ") and "\n" not in said[0]


def test_a_run_with_an_unreachable_collector_says_so_once(tmp_path: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "STAYER_HOME": str(tmp_path / "home"), "PYTHONPATH": str(ROOT)}
    for k in ("OTEL_EXPORTER_OTLP_PROTOCOL", "OTEL_EXPORTER_OTLP_TIMEOUT"):
        env.pop(k, None)
    r = subprocess.run(
        [sys.executable, "-m", "stayer.cli", "run", str(ROOT / "examples" / "hello-file")]
        + ["--model", "sim:gpt-5", "--json", "--otlp", f"http://127.0.0.1:{port}"],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr
    warnings = [line for line in r.stderr.splitlines() if "traces not exported" in line]
    assert len(warnings) == 1 and "Connection refused" in warnings[0], r.stderr
    assert "Transient error" not in r.stderr and "Failed to export" not in r.stderr

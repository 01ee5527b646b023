"""OpenTelemetry spans of a real ``stayer run``, received over OTLP (HTTP and gRPC) by
oteltest's pure-Python sinks on loopback."""

from __future__ import annotations

import base64
import json
import logging
import os
import socket
import subprocess
import sys
import threading
import time
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
                resource = {a["key"]: _value(a["value"]) for a in rs.get("resource", {}).get("attributes", [])}
                for ss in rs.get("scopeSpans", []):
                    for span in ss.get("spans", []):
                        span["attrs"] = {a["key"]: _value(a["value"]) for a in span.get("attributes", [])}
                        span["resource"] = resource
                        self.spans.append(span)

    def handle_metrics(self, request: Any, headers: Any) -> None:
        pass

    def handle_logs(self, request: Any, headers: Any) -> None:
        pass


def _run(tmp_path: Path, env_extra: dict[str, str], *args: str) -> dict[str, Any]:
    env = {**os.environ, "STAYER_HOME": str(tmp_path / "home"), "PYTHONPATH": str(ROOT), **env_extra}
    for k in ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_PROTOCOL"):
        if k not in env_extra:
            env.pop(k, None)
    r = subprocess.run(
        [sys.executable, "-m", "stayer.cli", "run", str(ROOT / "examples" / "fix-median"), "--model", "sim:claude-sonnet-4-5",
         "--policy", "none", "--json", *args],
        env=env, capture_output=True, text=True, timeout=600,
    )
    assert r.returncode == 0, r.stderr[-3000:]
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
        assert a["gen_ai.usage.input_tokens"] >= a["gen_ai.usage.cache_read.input_tokens"] + a["gen_ai.usage.cache_write.input_tokens"]
        assert a["gen_ai.usage.cache_creation.input_tokens"] == a["gen_ai.usage.cache_write.input_tokens"]
        assert a["gen_ai.usage.cost.currency"] == "USD" and a["gen_ai.usage.cost.source"] == "local"
        assert isinstance(a["gen_ai.response.finish_reasons"], list)
        assert a["stayer.step"] >= 1 and "stayer.context_tokens" in a
    assert sorted(s["attrs"]["stayer.step"] for s in chats) == list(range(1, doc["steps"] + 1))
    # The model-call spans carry the run's cost exactly, and nothing else does.
    assert sum(Decimal(s["attrs"]["stayer.cost_usd"]) for s in chats) == Decimal(doc["cost_usd"])
    assert abs(sum(s["attrs"]["gen_ai.usage.cost.amount"] for s in chats) - float(doc["cost_usd"])) < 1e-9
    assert not [s for s in spans if "gen_ai.usage.cost.amount" in s["attrs"] and not s["name"].startswith("chat ")]
    bash = next(s for s in tools if s["name"] == "execute_tool bash")
    assert bash["attrs"]["gen_ai.tool.name"] == "bash" and "stayer.tool.exit_code" in bash["attrs"]
    # The trace id comes from the run id, so a resumed run continues the same trace.
    from stayer.telemetry.tracing import _ids

    assert int.from_bytes(base64.b64decode(agent["traceId"]), "big") == _ids(doc["run_id"])[0]


def test_spans_of_a_run_over_otlp_http(tmp_path: Path) -> None:
    collector = Collector()
    port = _free_port()
    server = sink.HttpSink(collector, logging.getLogger("oteltest"), port=port)
    server.start()
    try:
        doc = _run(tmp_path, {"OTEL_SERVICE_NAME": "stayer-test"}, "--otlp", f"http://127.0.0.1:{port}")
        _check(_wait_spans(collector, doc), doc)
    finally:
        server.stop()


def test_spans_of_a_run_over_otlp_grpc(tmp_path: Path) -> None:
    collector = Collector()
    port = _free_port()
    server = sink.GrpcSink(collector, logging.getLogger("oteltest"), port=port)
    server.start()
    try:
        env = {"OTEL_SERVICE_NAME": "stayer-test", "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc",
               "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{port}"}
        doc = _run(tmp_path, env)
        _check(_wait_spans(collector, doc), doc)
    finally:
        server.stop()


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
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.strip().splitlines()[-1] == "[]"

"""What stayer knows about its runs, in the formats people's tools read.

* ``tracing`` — OpenTelemetry GenAI spans (the ``otel`` extra): ``invoke_agent`` per run,
  ``chat {model}`` per model call with its usage and exact cost, ``execute_tool {name}``
  per tool call; exported over OTLP when ``OTEL_EXPORTER_OTLP_ENDPOINT`` (or ``--otlp``)
  is set, and not even imported otherwise.
* ``metrics`` — Prometheus metrics of the runtime (``prometheus-client``): cost and tokens
  by kind, runs by status, tenants' budgets, step latency and cost.

Nothing below this package imports it: it observes runs through ``stayer.agent.Observer``.
"""

from __future__ import annotations

import os

ENDPOINT_VARS = ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT")


def tracing_configured(otlp: str | None = None) -> bool:
    """Whether traces are wanted: ``--otlp`` or the standard OTLP environment. Checked
    without importing OpenTelemetry, so a run without it pays nothing."""
    return bool(otlp) or any(os.environ.get(v) for v in ENDPOINT_VARS)

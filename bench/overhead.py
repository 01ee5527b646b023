"""Per-step harness overhead: everything in a step except the model's and the tool's own time.

    python bench/overhead.py [--steps N] [--files N] [--sizes 10000,100000,1000000] [--json]

For contexts of 10K, 100K and 1M tokens, runs the real agent loop under context policy
``none`` (so the context really is that large at every step: ``auto`` would compact a
synthetic history at once) with

* the real Anthropic adapter and SDK, whose HTTP transport answers at once in-process: so
  building the request (our layout, the SDK's preparation and JSON encoding) and parsing
  the reply are measured, and only the network is left out;
* a tool that answers at once but edits one file of a workspace of ``--files`` files, so
  that the workspace fingerprint (the no-progress breaker) has a change to find each step;
* a fresh token counter per size, so that each size counts its own new content.

Each step adds a ~500-token observation and a ~60-token reply. Overhead per step is the
wall time of the loop minus the time inside the transport and the tool; the time spent
building the request and fingerprinting the workspace is also reported apart (it is part
of the total). Target (issue 12): under 2 ms per step at 100K tokens and under 10 ms at 1M,
with 10K workspace files.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
from decimal import Decimal
from pathlib import Path
from typing import Any

import httpx2 as httpx  # the HTTP package this anthropic SDK is built on
from _stdout import json_only  # bench/: --json prints one document on stdout

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import anthropic  # noqa: E402

from stayer.agent import Agent, AgentSettings, Hooks, Limits  # noqa: E402
from stayer.context.policies import make_policy  # noqa: E402
from stayer.guard.breakers import GuardConfig, TreeFingerprint  # noqa: E402
from stayer.models.anthropic import AnthropicModel  # noqa: E402
from stayer.models.base import Message, ModelRequest, ModelResponse, ToolCall, ToolSpec  # noqa: E402
from stayer.pricing import PriceBook  # noqa: E402
from stayer.tokens import MessageCounter, TiktokenCounter  # noqa: E402
from stayer.tools.base import ToolContext, ToolResult  # noqa: E402

WORDS = [
    "alpha",
    "delta",
    "echo",
    "golf",
    "hotel",
    "india",
    "mike",
    "november",
    "uniform",
    "whiskey",
]
FILES_PER_DIR = 100


def text(n_tokens: int, seed: int) -> str:
    return " ".join(
        WORDS[(seed * 7 + i * 3) % len(WORDS)] + ("" if i % 11 else f" {seed}")
        for i in range(n_tokens)
    )


class InstantAnthropic:
    """The stand-in for the network: an in-process transport that answers each request at
    once with one tool call, timing itself so that its time is left out."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self.n = 0

    def handle(self, request: httpx.Request) -> httpx.Response:
        t = time.perf_counter()
        self.n += 1
        body = {
            "id": f"msg_{self.n}",
            "type": "message",
            "role": "assistant",
            "model": "claude-sonnet-4-5",
            "content": [
                {"type": "text", "text": text(50, self.n)},
                {
                    "type": "tool_use",
                    "id": f"c{self.n}",
                    "name": "observe",
                    "input": {"step": self.n},
                },
            ],
            "stop_reason": "tool_use",
            "stop_sequence": None,
            "usage": {
                "input_tokens": 1000,
                "cache_read_input_tokens": 99_000,
                "cache_creation_input_tokens": 900,
                "output_tokens": 60,
            },
        }
        response = httpx.Response(200, json=body)
        self.seconds += time.perf_counter() - t
        return response


class TimedModel:
    """The adapter, with the time of each ``complete`` recorded (request building, SDK,
    the transport, reply parsing)."""

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def __init__(self, inner: AnthropicModel) -> None:
        self.inner = inner
        self.spec, self.provider, self.model_id = inner.spec, inner.provider, inner.model_id
        self.seconds = 0.0

    async def complete(self, request: ModelRequest) -> ModelResponse:
        t = time.perf_counter()
        try:
            return await self.inner.complete(request)
        finally:
            self.seconds += time.perf_counter() - t


class TimedProbe:
    def __init__(self, inner: TreeFingerprint) -> None:
        self.inner = inner
        self.seconds = 0.0

    def fingerprint(self) -> str:
        t = time.perf_counter()
        try:
            return self.inner.fingerprint()
        finally:
            self.seconds += time.perf_counter() - t


class EditingTool:
    """Answers at once with a ~500-token observation and edits one workspace file."""

    spec = ToolSpec(
        "observe",
        "Return an observation.",
        {
            "type": "object",
            "properties": {"step": {"type": "integer"}},
            "required": ["step"],
        },
    )

    def __init__(self, workspace: Path, dirs: int) -> None:
        self.workspace, self.dirs = workspace, dirs
        self.seconds = 0.0

    async def __call__(self, args: dict, ctx: ToolContext) -> ToolResult:
        t = time.perf_counter()
        step = args["step"]
        (self.workspace / f"d{step % self.dirs:03d}" / "edited.txt").write_text(f"step {step}\n")
        out = ToolResult(text(500, step))
        self.seconds += time.perf_counter() - t
        return out


def make_workspace(root: Path, files: int) -> int:
    """``files`` small files, FILES_PER_DIR to a directory; returns the number of directories."""
    dirs = max(1, -(-files // FILES_PER_DIR))
    for d in range(dirs):
        sub = root / f"d{d:03d}"
        sub.mkdir()
        for i in range(min(FILES_PER_DIR, files - d * FILES_PER_DIR)):
            (sub / f"f{i:03d}.py").write_text(f"x = {d * FILES_PER_DIR + i}\n")
    return dirs


def history_of(tokens: int, counter: MessageCounter) -> list[Message]:
    msgs: list[Message] = []
    total, i = 0, 0
    while total < tokens:
        i += 1
        a = Message("assistant", text(60, -i), (ToolCall(f"h{i}", "observe", "{}"),))
        o = Message("tool", text(2000, -i), tool_call_id=f"h{i}", kind="observation")
        msgs += [a, o]
        total += counter.message(a) + counter.message(o)
    return msgs


class NullExporter:
    """Where spans go in the tracing-on runs: accepted and dropped, so the figure is what
    tracing costs the loop (span creation, attributes, the batch queue), not a network."""

    def export(self, spans: Any) -> Any:
        from opentelemetry.sdk.trace.export import SpanExportResult

        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        pass

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return True


def tracer_for(prices: PriceBook) -> Any:
    """stayer's run tracer (the ``otel`` extra) over a batch processor and a null exporter."""
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    from stayer.telemetry.tracing import RunTracer

    tp = TracerProvider()
    tp.add_span_processor(BatchSpanProcessor(NullExporter()))
    return tp, RunTracer(tp, prices, "bench")


async def measure(
    context_tokens: int, steps: int, files: int, prices: PriceBook, tracing: bool = False
) -> dict[str, Any]:
    counter = MessageCounter(TiktokenCounter())  # fresh: each size counts its own content
    history = history_of(context_tokens, counter)
    network = InstantAnthropic()
    client = anthropic.AsyncAnthropic(
        api_key="bench",
        http_client=httpx.AsyncClient(transport=httpx.MockTransport(network.handle)),
    )
    model: Any = TimedModel(AnthropicModel("claude-sonnet-4-5", client=client))
    tp, tracer = tracer_for(prices) if tracing else (None, None)
    with tempfile.TemporaryDirectory(prefix="stayer-bench-ws-") as tmp:
        workspace = Path(tmp)
        tool = EditingTool(workspace, make_workspace(workspace, files))
        probe = TimedProbe(TreeFingerprint(workspace))
        timed = model
        tools: list[Any] = [tool]
        if (
            tracer is not None
        ):  # the tracer's wrappers sit outside the timed parts: their cost counts
            model, tools = tracer.model(model), tracer.tools(tools)
        agent = Agent(
            model,
            tools,
            ToolContext(sandbox=None, workspace=str(workspace)),
            AgentSettings(
                prices,
                counter,
                Limits(
                    max_steps=steps,
                    max_cost=Decimal("1000000"),
                    guard=GuardConfig(soft_fraction=1.0, wrapup_steps=0),
                ),
                policy=make_policy("none"),
                probe=probe,
            ),
        )
        rows: list[tuple[float, float, float, int, float]] = []
        last = [time.perf_counter(), 0.0, 0.0, 0.0]
        # CPU time of the whole process (the exporter's thread included): what tracing costs
        # in work, which the machine's load does not inflate the way it does wall time.
        cpu = [time.process_time()]

        def on_step(entry: Any) -> None:
            if tracer is not None:
                tracer.on_step(entry)
            now = time.perf_counter()
            inside = network.seconds + tool.seconds
            request = timed.seconds - network.seconds
            total = (now - last[0]) - (inside - last[1])
            cpu_now = time.process_time()
            rows.append(
                (
                    total,
                    request - last[2],
                    probe.seconds - last[3],
                    entry.context_tokens,
                    cpu_now - cpu[0],
                )
            )
            last[:] = [now, inside, request, probe.seconds]
            cpu[0] = cpu_now

        agent.observers.append(Hooks(step=on_step))
        if tracer is not None:
            with tracer.run_span("bench", "claude-sonnet-4-5"):
                result = await agent.run("Benchmark task.", "bench", history=history)
            tp.shutdown()
        else:
            result = await agent.run("Benchmark task.", "bench", history=history)
        await client.close()
    warm = rows[1:]  # the first step also builds the context from the history
    if result.stop_reason != "max_steps" or not warm:
        raise SystemExit(
            f"bench run at {context_tokens:,} tokens stopped early: {result.stop_reason} {result.error}"
        )

    def ms(values: list[float]) -> dict[str, float]:
        ordered = sorted(values)
        return {
            "min": ordered[0] * 1000,
            "median": statistics.median(ordered) * 1000,
            "p90": ordered[int(len(ordered) * 0.9)] * 1000,
        }

    return {
        "tracing": tracing,
        "context_tokens": context_tokens,
        "context_tokens_seen": [min(r[3] for r in warm), max(r[3] for r in warm)],
        "messages": len(history),
        "workspace_files": files,
        "steps": len(warm),
        "total_ms": ms([r[0] for r in warm]),
        "request_ms": ms([r[1] for r in warm]),
        "fingerprint_ms": ms([r[2] for r in warm]),
        "rest_ms": ms([r[0] - r[1] - r[2] for r in warm]),
        "cpu_ms": ms([r[4] for r in warm]),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--files", type=int, default=10_000, help="Workspace files (default 10000).")
    ap.add_argument("--sizes", default="10000,100000,1000000", help="Context sizes in tokens.")
    ap.add_argument(
        "--tracing",
        action="store_true",
        help="Also run each size with OpenTelemetry tracing on (batch processor), interleaved with off.",
    )
    ap.add_argument(
        "--pairs",
        type=int,
        default=5,
        help="With --tracing: off/on run pairs per size (default 5).",
    )
    ap.add_argument("--json", action="store_true", help="Print one JSON document of the figures.")
    args = ap.parse_args()
    emit = json_only(args.json)
    sizes = [int(s) for s in args.sizes.split(",") if s.strip()]
    prices = PriceBook.load()
    asyncio.run(measure(10_000, 5, 100, prices))  # warm-up: imports, price lookups
    if args.tracing:
        asyncio.run(measure(10_000, 5, 100, prices, tracing=True))
    results, tracing = [], []
    for size in sizes:
        if not args.tracing:
            results.append(asyncio.run(measure(size, args.steps, args.files, prices)))
            continue
        # Off and on, interleaved, so that the machine's load falls on both alike; each
        # run's median step, then the median and the min over runs.
        pair: dict[bool, list[dict[str, Any]]] = {False: [], True: []}
        for _ in range(args.pairs):
            for on in (False, True):
                pair[on].append(
                    asyncio.run(measure(size, args.steps, args.files, prices, tracing=on))
                )
        results += pair[False] + pair[True]
        medians = {on: [r["total_ms"]["median"] for r in pair[on]] for on in (False, True)}
        cpu = {on: [r["cpu_ms"]["median"] for r in pair[on]] for on in (False, True)}
        tracing.append(
            {
                "context_tokens": size,
                "pairs": args.pairs,
                "off_ms": {"min": min(medians[False]), "median": statistics.median(medians[False])},
                "on_ms": {"min": min(medians[True]), "median": statistics.median(medians[True])},
                "overhead_ms": {
                    "min": min(medians[True]) - min(medians[False]),
                    "median": statistics.median(medians[True]) - statistics.median(medians[False]),
                    # pair by pair (each on run against the off run just before it)
                    "paired_median": statistics.median(
                        b - a for a, b in zip(medians[False], medians[True], strict=True)
                    ),
                },
                # the same in process CPU time per step (the mocked network and the tool's own
                # work are in both, so the difference is tracing's, its exporter thread included)
                "cpu_overhead_ms": {
                    "min": min(cpu[True]) - min(cpu[False]),
                    "median": statistics.median(cpu[True]) - statistics.median(cpu[False]),
                },
            }
        )
    doc = {"bench": "overhead", "loadavg": os.getloadavg(), "results": results}
    if tracing:
        doc["tracing"] = tracing
    if args.json:
        emit(doc)
        return
    print(f"load average {' '.join(f'{x:.2f}' for x in doc['loadavg'])}; ms per step, median (min)")
    print(
        f"{'context':>10} {'seen':>19} {'files':>6} {'steps':>5} {'total':>15} {'request':>15} "
        f"{'fingerprint':>15} {'rest':>15}"
    )
    for r in results:
        cols = " ".join(
            f"{r[k]['median']:>7.3f} ({r[k]['min']:>5.2f})"
            for k in ("total_ms", "request_ms", "fingerprint_ms", "rest_ms")
        )
        seen = f"{r['context_tokens_seen'][0]:,}–{r['context_tokens_seen'][1]:,}"
        print(
            f"{r['context_tokens']:>10,} {seen:>19} {r['workspace_files']:>6} {r['steps']:>5} {cols}"
        )
    print("target: < 2 ms/step at 100K tokens, < 10 ms/step at 1M (with 10K workspace files)")
    for t in doc.get("tracing", []):
        print(
            f"tracing at {t['context_tokens']:,}: off {t['off_ms']['median']:.3f} ms, on {t['on_ms']['median']:.3f} ms "
            f"(median); overhead {t['overhead_ms']['median']:.3f} ms (paired {t['overhead_ms']['paired_median']:.3f}, "
            f"min-to-min {t['overhead_ms']['min']:.3f}); in CPU time {t['cpu_overhead_ms']['median']:.3f} ms "
            f"(min-to-min {t['cpu_overhead_ms']['min']:.3f}); target < 0.5 ms"
        )


if __name__ == "__main__":
    main()

"""Cost of context policies on fixed workloads, against the hindsight-optimal schedule.

    python bench/context_policies.py [--quick]

Policies: none, the textbook ContextBudget (60K), per-step masking (window 5), threshold
summarisation (60K), and ``auto`` (the compaction scheduler), each under Anthropic
(claude-sonnet-4-5) and OpenAI (gpt-5) prices and caching rules, replayed by the what-if
engine (the simulator's accounting, genai-prices pricing). Workloads: (a) the published one
— 30 steps, 20,000 new input tokens (tool output) and 2,000 output tokens per step; (b) a
200-step synthetic workload with lognormal observation sizes; (c) every trajectory in
../shared/corpus/swe-agent/.

``optimal`` is the hindsight-optimal schedule for auto's compaction action (stub all tool
output but the last observation): a dynamic programme over compaction points, with the
whole trajectory known in advance, on an analytic cost model that mirrors the simulator's
caching rules; the schedule it finds is then replayed through the engine, and the better
of it and ``none`` is reported. It is the limit an online scheduler can reach.

Targets (issue 4): on (a) under Anthropic, auto ≤ 0.5× none; everywhere, auto ≤ none,
auto ≤ mask, auto ≤ 1.15× optimal; peak context within any limit.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import random
import sys
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path

from _stdout import json_only  # bench/: --json prints one document on stdout

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from stayer.context.layout import Context  # noqa: E402
from stayer.context.policies import (  # noqa: E402
    AutoPolicy,
    Compaction,
    MaskPolicy,
    NonePolicy,
    StepView,
    SummarizePolicy,
    TextbookPolicy,
    _enforce_limit,
    _evict,
    victims_of,
)
from stayer.models.base import Message, ToolCall  # noqa: E402
from stayer.models.caching import cache_rules, cached_length, provider_of  # noqa: E402
from stayer.models.sim_policies import filler  # noqa: E402
from stayer.pricing import PriceBook  # noqa: E402
from stayer.tokens import MessageCounter, TiktokenCounter  # noqa: E402
from stayer.whatif import BASH, Trace, load_trace, replay  # noqa: E402

CORPUS = ROOT.parent / "shared" / "corpus" / "swe-agent"
MODELS = ("claude-sonnet-4-5", "gpt-5")
WINDOW = 1  # auto's protected window; the optimum is computed for the same action
LIMIT = 100_000  # a --max-context every workload is also replayed under (keep-class content fits)


def synthetic_trace(name: str, steps: int, obs: list[int], out: list[int], seed: int) -> Trace:
    rng = random.Random(seed)
    turns, observations = [], {}
    for s in range(steps):
        call = ToolCall(f"c{s}", "bash", f'{{"command": "run step {s}"}}')
        turns.append(Message("assistant", filler(out[s], rng), (call,)))
        observations[call.id] = filler(obs[s], rng)
    return Trace(
        name, "You are an agent. Work in /app.", "Solve the task.", turns, observations, [BASH]
    )


def workloads(quick: bool) -> list[Trace]:
    out = [synthetic_trace("published (30 × 20K in, 2K out)", 30, [20_000] * 30, [2_000] * 30, 1)]
    rng = random.Random(7)
    n = 60 if quick else 200
    obs = [int(min(rng.lognormvariate(7.0, 1.0), 30_000)) for _ in range(n)]
    out.append(synthetic_trace(f"synthetic {n} steps (lognormal obs)", n, obs, [300] * n, 2))
    if CORPUS.is_dir():
        for f in sorted(CORPUS.rglob("*.traj*")):
            out.append(load_trace(str(f)))
    else:
        print(f"(corpus not found at {CORPUS}: skipping (c))", file=sys.stderr)
    return out


@dataclass
class SchedulePolicy:
    """Compacts (auto's action) exactly at the given steps: replays a schedule."""

    steps: frozenset[int]
    window: int = WINDOW
    name: str = "schedule"

    def plan(self, ctx: Context, view: StepView) -> Compaction | None:
        planned = (
            _evict(ctx, victims_of(ctx, self.window), "scheduled")
            if view.step in self.steps
            else None
        )
        return _enforce_limit(ctx, view, planned, self.window)


def optimal_schedule(
    trace: Trace, model_id: str, prices: PriceBook, counter: MessageCounter
) -> frozenset[int]:
    """Hindsight DP over compaction points (see module docstring)."""
    provider = provider_of(model_id)
    rules = cache_rules(provider, model_id)
    explicit = rules.mode == "explicit"
    ctx = Context(trace.system, trace.tools, trace.instruction, counter)
    pinned = ctx.tokens
    outputs = iter([trace.observations.get(c.id, "") for t in trace.turns for c in t.tool_calls])
    a, o, b = [], [], []  # per step: assistant tokens, observation tokens, stub tokens
    from stayer.context.policies import stub_for

    for turn in trace.turns:
        a.append(counter.message(turn))
        size = stub = 0
        for call in turn.tool_calls:
            m = Message("tool", next(outputs, ""), tool_call_id=call.id, kind="observation")
            n = counter.message(m)
            size += n
            stub += counter.message(stub_for(m, n)[0])
        o.append(size)
        b.append(stub)
    T = len(trace.turns)
    rate_cache: dict[int, tuple[float, float, float, float]] = {}

    def rates(tokens: int) -> tuple[float, float, float, float]:
        r = prices.rates(model_id, provider, None, tokens)
        key = 0 if r is None else int(r.input * 1000)
        if key not in rate_cache:
            rate_cache[key] = (
                float(r.input),
                float(r.cache_read),
                float(r.cache_write_5m),
                float(r.output),
            )
        return rate_cache[key]

    # ctx_at[k][t]: prompt tokens of request t (1-based) when the last compaction was at k.
    prefix_ao = [0] * (T + 1)
    for s in range(1, T + 1):
        prefix_ao[s] = prefix_ao[s - 1] + a[s - 1] + o[s - 1]
    saved = [0] * (T + 1)  # tokens saved by stubbing observations 1..s
    for s in range(1, T + 1):
        saved[s] = saved[s - 1] + o[s - 1] - b[s - 1]

    def C(t: int, k: int) -> int:
        stubbed = max(k - 1 - WINDOW, 0)
        return pinned + prefix_ao[t - 1] - saved[min(stubbed, t - 1)]

    def price(total: int, read: int, written: int, t: int) -> float:
        i, r, w, out = rates(total)
        if not explicit:
            return (read * r + (total - read) * i + a[t - 1] * out) / 1e6
        return (read * r + written * w + (total - read - written) * i + a[t - 1] * out) / 1e6

    def normal(t: int, k: int) -> float:
        prev, cur = C(t - 1, k), C(t, k)
        read = cached_length(rules, prev) if t > 1 else 0
        written = (cur - read) if explicit and cur >= rules.min_tokens else 0
        return price(cur, read, written, t)

    def miss(k: int, k_prev: int) -> float:
        cur = C(k, k)
        if explicit:
            read = pinned if pinned >= rules.min_tokens else 0
        else:
            first = max(k_prev - 1 - WINDOW, 0) + 1  # first observation newly stubbed
            read = cached_length(
                rules, pinned + prefix_ao[first - 1] + a[first - 1] - saved[first - 1]
            )
        written = (cur - read) if explicit and cur >= rules.min_tokens else 0
        return price(cur, read, written, k)

    INF = float("inf")
    best = [INF] * (T + 1)
    choice = [0] * (T + 1)
    best[1] = normal(1, 1)
    sums: dict[int, list[float]] = {}
    for kp in range(1, T + 1):
        acc, row = 0.0, [0.0] * (T + 2)
        for t in range(kp + 1, T + 1):
            acc += normal(t, kp)
            row[t] = acc
        sums[kp] = row
    for k in range(2, T + 1):
        for kp in range(1, k):
            between = sums[kp][k - 1] if k - 1 > kp else 0.0
            v = best[kp] + between + miss(k, kp)
            if v < best[k]:
                best[k], choice[k] = v, kp
    last = min(range(1, T + 1), key=lambda k: best[k] + (sums[k][T] if k < T else 0.0))
    schedule, k = set(), last
    while k > 1:
        schedule.add(k)
        k = choice[k]
    return frozenset(schedule)


POLICIES = {
    "none": lambda: NonePolicy(),
    "textbook": lambda: TextbookPolicy(max_tokens=60_000),
    "mask(5)": lambda: MaskPolicy(window=5),
    "summarize": lambda: SummarizePolicy(high_watermark=60_000),
    "auto": lambda: AutoPolicy(window=WINDOW),
}


async def run_all(quick: bool, as_json: bool = False) -> int:
    """The comparison table (on stderr with ``as_json``, which prints one JSON document)."""
    emit = json_only(as_json)
    say = functools.partial(print, file=sys.stderr if as_json else sys.stdout)
    rows: list[dict] = []
    prices = PriceBook()
    counter = MessageCounter(TiktokenCounter())
    failures: list[str] = []
    peaks: list[int] = []
    header = f"{'workload':<44} {'model':<18}" + "".join(f"{p:>11}" for p in [*POLICIES, "optimal"])
    header += f"{'auto/none':>10}{'auto/mask':>10}{'auto/opt':>9}"
    say(header)
    say("-" * len(header))
    for trace in workloads(quick):
        name = Path(trace.source).name if "/" in trace.source else trace.source
        for model in MODELS:
            costs: dict[str, Decimal] = {}
            for label, make in POLICIES.items():
                r = await replay(trace, model, make(), prices=prices, counter=counter)
                costs[label] = Decimal(r["cost_usd"])
            schedule = optimal_schedule(trace, model, prices, counter)
            r = await replay(trace, model, SchedulePolicy(schedule), prices=prices, counter=counter)
            costs["optimal"] = min(Decimal(r["cost_usd"]), costs["none"])
            row = f"{name[:44]:<44} {model:<18}" + "".join(
                f"{float(costs[p]):>11.4f}" for p in [*POLICIES, "optimal"]
            )
            vs_none = costs["auto"] / costs["none"]
            vs_mask = costs["auto"] / costs["mask(5)"]
            vs_opt = costs["auto"] / costs["optimal"]
            say(row + f"{float(vs_none):>10.3f}{float(vs_mask):>10.3f}{float(vs_opt):>9.3f}")
            rows.append(
                {
                    "workload": name,
                    "model": model,
                    "cost_usd": {k: str(v) for k, v in costs.items()},
                    "auto_vs_none": float(vs_none),
                    "auto_vs_mask": float(vs_mask),
                    "auto_vs_optimal": float(vs_opt),
                }
            )
            if vs_none > 1 or vs_mask > 1 or vs_opt > Decimal("1.15"):
                failures.append(f"{name} / {model}")
            if (
                name.startswith("published")
                and model.startswith("claude")
                and vs_none > Decimal("0.5")
            ):
                failures.append(f"{name} / {model}: auto/none {vs_none:.3f} > 0.5")
            limited = await replay(
                trace,
                model,
                AutoPolicy(window=WINDOW),
                prices=prices,
                counter=counter,
                max_context=LIMIT,
            )
            if limited["peak_context_tokens"] > LIMIT:
                failures.append(
                    f"{name} / {model}: peak {limited['peak_context_tokens']} > --max-context {LIMIT}"
                )
            peaks.append(limited["peak_context_tokens"])
    say()
    say(
        "targets: auto ≤ none, auto ≤ mask(5), auto ≤ 1.15× optimal everywhere; published/Anthropic auto ≤ 0.5× none"
    )
    say(f"auto with --max-context {LIMIT:,}: highest peak context {max(peaks):,} tokens")
    say("missed: " + ("; ".join(failures) if failures else "none"))
    emit(
        {
            "bench": "context_policies",
            "rows": rows,
            "max_context": LIMIT,
            "highest_peak_tokens": max(peaks),
            "missed": failures,
        }
    )
    return 1 if failures else 0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--quick", action="store_true", help="a 60-step synthetic workload instead of 200"
    )
    ap.add_argument("--json", action="store_true", help="Print one JSON document of the figures.")
    args = ap.parse_args()
    raise SystemExit(asyncio.run(run_all(args.quick, args.json)))


if __name__ == "__main__":
    main()

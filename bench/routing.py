"""Cost and modelled latency of model routing on simulated agent workloads.

    python bench/routing.py [--quick]

Each workload is a long agent run whose steps are labelled easy or hard (a per-step
difficulty oracle, i.e. a perfect per-step classifier). Four strategies serve it:

* ``fixed-strong`` — the strong model on every step;
* ``fixed-cheap`` — the cheap model on every step (its "hard steps on cheap" column is the
  quality it gives up; cost alone flatters it);
* ``per-step`` — the strong model on hard steps, the cheap one on easy steps, switching
  whenever the label changes: routing that ignores the prompt cache (stayer's ``Router``
  with ``cache_aware = false``);
* ``cache-aware`` — the same signals through stayer's ``Router`` with ``cache_aware = true``:
  a hard step still goes to the strong model at once (quality), but a step down to the cheap
  model is priced against the cache (``stayer.routing.switch``) and made only when it pays
  back within the expected remaining steps.

Every call goes through the offline provider simulator (``sim:``), which applies each
provider's caching rules — per-model caches, Anthropic's explicit breakpoints with their
20-block lookback, 5-minute TTLs — on a modelled clock (call latency + the step's tool
time), and is priced with genai-prices. Modelled latency is the model time of all calls:
time to first token, prefill of the uncached prompt and output, at the standard tier's
modelled speeds (``stayer.routing.tiers``). Pairs: claude-sonnet-4-5 / claude-haiku-4-5 and
gpt-5 / gpt-5-mini.

Target (issue 6): cache-aware ≤ 0.7× the cache-ignoring per-step router's cost. The figures
are printed per workload and in total, whatever they are.
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

from stayer.agent import SYSTEM_PROMPT  # noqa: E402
from stayer.context.layout import Context  # noqa: E402
from stayer.guard.breakers import StepRecord  # noqa: E402
from stayer.models.base import Message, ModelRequest, ToolCall  # noqa: E402
from stayer.models.sim import SimModel  # noqa: E402
from stayer.models.sim_policies import filler  # noqa: E402
from stayer.pricing import PriceBook  # noqa: E402
from stayer.routing.router import Router, RouteView  # noqa: E402
from stayer.routing.tiers import TIER_SPEEDS  # noqa: E402
from stayer.tokens import MessageCounter, TiktokenCounter  # noqa: E402
from stayer.tools import default_tools  # noqa: E402

PAIRS = (("claude-sonnet-4-5", "claude-haiku-4-5"), ("gpt-5", "gpt-5-mini"))
STRATEGIES = ("fixed-strong", "fixed-cheap", "per-step", "cache-aware")
TARGET = Decimal("0.7")


@dataclass(frozen=True)
class Workload:
    name: str
    hard: list[bool]
    obs_tokens: list[int]
    out_tokens: int
    tool_s: list[float]


def workloads(quick: bool) -> list[Workload]:
    n = 60 if quick else 150
    rng = random.Random(6)

    def obs() -> list[int]:
        return [int(min(rng.lognormvariate(6.5, 0.8), 8_000)) for _ in range(n)]

    def iid(p: float) -> list[bool]:
        return [rng.random() < p for _ in range(n)]

    def bursts(every: int, length: int) -> list[bool]:
        return [(i % every) >= every - length for i in range(n)]

    return [
        Workload("sparse hard steps (10 %), quick tools (5 s)", iid(0.10), obs(), 250, [5.0] * n),
        Workload("sparse hard steps (10 %), slow tools (60 s)", iid(0.10), obs(), 250, [60.0] * n),
        Workload("hard bursts (3 of every 15), tools 20 s", bursts(15, 3), obs(), 250, [20.0] * n),
        Workload("noisy classifier (40 % hard), tools 20 s", iid(0.40), obs(), 250, [20.0] * n),
        Workload(
            "noisy classifier (40 % hard), slow tools (120 s)", iid(0.40), obs(), 250, [120.0] * n
        ),
    ]


class Script:
    """The simulated models' behaviour: the workload's step, whoever answers it."""

    def __init__(self, w: Workload, rng: random.Random) -> None:
        self.turns = [
            Message(
                "assistant",
                filler(w.out_tokens, rng),
                (ToolCall(f"c{i}", "bash", f'{{"command": "step {i}"}}'),),
            )
            for i in range(len(w.hard))
        ]

    def next_message(self, request: ModelRequest) -> Message:
        return self.turns[sum(1 for m in request.messages if m.role == "assistant")]


@dataclass
class Outcome:
    cost: Decimal
    latency_s: float
    switches: int
    hard_on_cheap: int
    cache_hit: float


async def serve(
    w: Workload,
    strong_id: str,
    cheap_id: str,
    strategy: str,
    prices: PriceBook,
    counter: MessageCounter,
) -> Outcome:
    rng = random.Random(11)
    script = Script(w, rng)
    clock = [1_000_000.0]
    strong = SimModel(strong_id, script, counter, clock=lambda: clock[0])
    cheap = SimModel(cheap_id, script, counter, clock=lambda: clock[0])
    if strategy == "fixed-strong":
        router = Router(strong, prices)
    elif strategy == "fixed-cheap":
        router = Router(cheap, prices)
    else:
        router = Router(
            cheap,
            prices,
            cascade=[cheap, strong],
            relax_after=1,
            cache_aware=strategy == "cache-aware",
        )
    ctx = Context(
        SYSTEM_PROMPT,
        [t.spec for t in default_tools(counter.counter)],
        "Solve the task in /app.",
        counter,
    )
    cost, latency, switches, hard_on_cheap, read, total = Decimal(0), 0.0, 0, 0, 0, 0
    for i, hard in enumerate(w.hard):
        if hard:
            router.escalate("hard step")
        else:
            router.relax()
        view = RouteView(
            i + 1,
            len(w.hard),
            ctx.tokens,
            ctx.tokens_before(ctx.prefix_messages),
            0,
            clock[0],
            len(ctx.messages),
        )
        route = router.choose(view)
        switches += route.switched
        model = route.model
        hard_on_cheap += hard and model is cheap
        response = await model.complete(
            ctx.request(max_tokens=4096, cache_key="bench", now=clock[0])
        )
        u = response.usage
        c = prices.cost(u, model.model_id, model.provider)
        assert c.total is not None
        cost += c.total
        read, total = read + u.cache_read_tokens, total + u.input_tokens
        speed = TIER_SPEEDS[model.provider][None]
        call_s = speed.latency(u.input_tokens - u.cache_read_tokens, u.output_tokens)
        latency += call_s
        clock[0] += call_s + w.tool_s[i]
        ctx.append(response.message)
        call = response.message.tool_calls[0]
        ctx.append(
            Message("tool", filler(w.obs_tokens[i], rng), tool_call_id=call.id, kind="observation")
        )
        router.record_step(StepRecord(i + 1, c.total, (), output_tokens=u.output_tokens))
    return Outcome(cost, latency, switches, hard_on_cheap, read / total if total else 0.0)


async def main(quick: bool, as_json: bool = False) -> int:
    emit = json_only(as_json)
    say = functools.partial(print, file=sys.stderr if as_json else sys.stdout)
    rows: list[dict] = []
    prices = PriceBook.load()
    counter = MessageCounter(TiktokenCounter())
    totals = {s: Decimal(0) for s in STRATEGIES}
    say(
        f"{'workload':<50} {'models':<34} {'strategy':<13} {'cost $':>9} {'latency s':>10} {'switches':>8} {'hard→cheap':>10} {'cache hit':>9}"
    )
    ratios = []
    for w in workloads(quick):
        for strong_id, cheap_id in PAIRS:
            outcomes = {}
            for s in STRATEGIES:
                o = outcomes[s] = await serve(w, strong_id, cheap_id, s, prices, counter)
                totals[s] += o.cost
                say(
                    f"{w.name:<50} {strong_id + ' / ' + cheap_id:<34} {s:<13} {o.cost:>9.4f} {o.latency_s:>10.1f} "
                    f"{o.switches:>8} {o.hard_on_cheap:>10} {o.cache_hit:>9.1%}"
                )
            rows += [
                {
                    "workload": w.name,
                    "strong": strong_id,
                    "cheap": cheap_id,
                    "strategy": s,
                    "cost_usd": str(o.cost),
                    "latency_s": o.latency_s,
                    "switches": o.switches,
                    "hard_on_cheap": o.hard_on_cheap,
                    "cache_hit": o.cache_hit,
                }
                for s, o in outcomes.items()
            ]
            ratio = outcomes["cache-aware"].cost / outcomes["per-step"].cost
            ratios.append(ratio)
            say(f"{'':<50} {'':<34} {'ratio':<13} cache-aware / per-step = {ratio:.3f}")
    overall = totals["cache-aware"] / totals["per-step"]
    say()
    for s in STRATEGIES:
        say(f"total {s:<13} ${totals[s]:.4f}")
    say(
        f"cache-aware / per-step (total cost): {overall:.3f}  (target ≤ {TARGET}: {'met' if overall <= TARGET else 'NOT met'})"
    )
    say(
        f"per workload: {min(ratios):.3f} … {max(ratios):.3f}; met on {sum(r <= TARGET for r in ratios)} of {len(ratios)}"
    )
    if as_json:
        emit(
            {
                "bench": "routing",
                "rows": rows,
                "totals_usd": {k: str(v) for k, v in totals.items()},
                "cache_aware_vs_per_step": float(overall),
                "target": float(TARGET),
            }
        )
    return 0


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="60 steps per workload instead of 150")
    ap.add_argument("--json", action="store_true", help="Print one JSON document of the figures.")
    args = ap.parse_args()
    sys.exit(asyncio.run(main(args.quick, args.json)))

"""Scale-out figures: the Ray backend against the local runner, over-provisioning against
stragglers, and the per-domain allocation over time, measured side by side in one run.

    python bench/scale.py --json [--trials 16] [--reps 2] [--latency 0.5]

1. **Throughput**: trials/min of the local asyncio runner and of Ray on a one-machine
   cluster (``--ray local``) at concurrency 4 and 16, interleaved ``--reps`` times (min and
   median). Every trial is a real eval trial: the simulator's oracle with ``--latency``
   seconds per model call, a bubblewrap sandbox, verification in a fresh one. Also the
   journal's work per trial (events, bytes), which bounds a cluster (docs/scale.md).
2. **Stragglers**: one sample per group, step counts drawn from a lognormal (median 4,
   σ 1, at most 40; ``--step-latency`` s per call), the same draws with and without
   over-provisioning (F = 0.5): seconds and groups/min to the target, dollars spent,
   dollars abandoned. Without over-provisioning the target waits for the slowest group.
3. **Allocation**: two domains, one whose groups all pass (no learning signal) and one
   whose groups are split; the scheduler's share of each over the finished groups.

Figures come from this script only; the machine's other load shows in the spread.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import random
import shutil
import statistics
import sys
import tempfile
import time
from decimal import Decimal
from pathlib import Path

from _stdout import json_only  # bench/: --json prints one document on stdout

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from stayer.eval.runner import EvalConfig, plan_trials, run_trials  # noqa: E402
from stayer.eval.suite import load_suite  # noqa: E402
from stayer.eval.task import load_task  # noqa: E402
from stayer.journal import open_store  # noqa: E402
from stayer.pricing import PriceBook  # noqa: E402

EXAMPLES = ROOT / "examples"
MODEL = "sim:claude-sonnet-4-5"


def throughput(args: argparse.Namespace, prices: PriceBook, home: Path) -> dict:
    from stayer.scale import ray_backend

    tasks = load_suite(str(EXAMPLES))
    config = EvalConfig(MODEL, sim_latency=args.latency)
    epochs = math.ceil(args.trials / len(tasks))
    trials = plan_trials(tasks, [config], epochs)[: args.trials]
    started = time.perf_counter()
    ray_backend.connect("local", num_cpus=2)
    startup_s = time.perf_counter() - started
    executors = {"local": None, "ray": ray_backend.RayTrials()}
    # one warm-up trial each: Ray starts its worker processes on first use
    for ex in executors.values():
        asyncio.run(run_trials(trials[:1], concurrency=1, prices=prices, executor=ex))
    runs: dict[str, list[float]] = {}
    records: list[dict] = []
    for _ in range(args.reps):
        for level in (4, 16):
            for name, ex in executors.items():
                t0 = time.perf_counter()
                out = asyncio.run(run_trials(trials, concurrency=level, prices=prices, executor=ex))
                seconds = time.perf_counter() - t0
                assert all(r["status"] == "succeeded" for r in out), [r.get("error") for r in out]
                runs.setdefault(f"{name}@{level}", []).append(len(out) / seconds * 60)
                records += out
    ray_backend.shutdown()
    store = open_store(home)
    try:
        events = [len(store.events(r["run_id"])) for r in records]
    finally:
        store.close()
    db_bytes = sum(f.stat().st_size for f in home.glob("stayer.db*"))
    return {
        "trials": len(trials),
        "latency_s_per_call": args.latency,
        "ray_startup_s": round(startup_s, 1),
        "trials_per_min": {
            k: {
                "min": round(min(v), 1),
                "median": round(statistics.median(v), 1),
                "runs": [round(x, 1) for x in v],
            }
            for k, v in runs.items()
        },
        "per_trial": {
            "wall_s_median": round(statistics.median(r["wall_s"] for r in records), 3),
            "cost_usd_mean": str(sum(Decimal(r["cost_usd"]) for r in records) / len(records)),
            "steps_mean": statistics.fmean(r["steps"] for r in records),
            "journal_events_mean": statistics.fmean(events),
            "journal_bytes_mean": round(db_bytes / len(records)),
        },
    }


def stragglers(args: argparse.Namespace, prices: PriceBook, work: Path) -> dict:
    from stayer.scale.rollouts import RolloutSpec, collect

    task = load_task(EXAMPLES / "hello-file")
    rng = random.Random(args.seed)
    target, factor = args.target, 0.5
    launched = math.ceil(target * (1 + factor))
    steps = [max(1, min(40, round(rng.lognormvariate(math.log(4), 1.0)))) for _ in range(launched)]

    def config_of(_task, epoch: int) -> EvalConfig:
        policy = f"synthetic:steps={steps[epoch - 1]},obs_tokens=300,out_tokens=60"
        return EvalConfig(MODEL, None, policy, 60, sim_latency=args.step_latency, sandbox="local")

    out: dict = {"target_groups": target, "step_counts": steps}
    for name, f in (("no_overprovision", 0.0), ("overprovision_0.5", factor)):
        spec = RolloutSpec(
            EvalConfig(MODEL), samples=1, target=target, overprovision=f, concurrency=launched
        )
        doc = asyncio.run(collect({"d": [task]}, spec, prices, work / name, config_of=config_of))
        out[name] = {
            "seconds_to_target": doc["seconds_to_target"],
            "groups_per_min_to_target": round(
                doc["groups_at_target"] / doc["seconds_to_target"] * 60, 1
            ),
            "cost_at_target_usd": doc["cost_at_target_usd"],
            "groups_launched": doc["groups_launched"],
            "cost_usd": doc["cost_usd"],
            "abandoned_cost_usd": doc["abandoned_cost_usd"],
            "stragglers": {k: len(v) for k, v in doc["stragglers"].items()},
            "wall_s": doc["wall_s"],
        }
    return out


def allocation(args: argparse.Namespace, prices: PriceBook, work: Path) -> dict:
    from stayer.scale.rollouts import RolloutSpec, collect

    easy = load_task(EXAMPLES / "hello-file")
    split_dir = work / "split-suite" / "sales-report"
    shutil.copytree(EXAMPLES / "sales-report", split_dir)
    split = load_task(split_dir)
    fail = EvalConfig(MODEL, None, "synthetic:steps=2,obs_tokens=100,out_tokens=20", 10)

    def config_of(task, epoch: int) -> EvalConfig:
        # the split domain: the second sample of every group fails (a learning signal)
        return fail if task.path == split.path and epoch % 2 == 0 else EvalConfig(MODEL)

    spec = RolloutSpec(
        EvalConfig(MODEL), samples=2, target=args.alloc_groups, concurrency=4, min_share=0.1
    )
    doc = asyncio.run(
        collect(
            {"all-pass": [easy], "split": [split]},
            spec,
            prices,
            work / "alloc",
            config_of=config_of,
        )
    )
    launched: dict[str, int] = {}
    for p in (work / "alloc" / "trials").rglob("*.json"):
        r = json.loads(p.read_text())
        launched[r["domain"]] = launched.get(r["domain"], 0) + 1
    return {
        "groups": doc["groups_complete"],
        "samples_by_domain": launched,
        "allocation_over_time": [
            {"finished": h["finished"], **{d: round(s, 3) for d, s in h["allocation"].items()}}
            for h in doc["allocation_history"]
        ],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=16)
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument(
        "--latency", type=float, default=0.5, help="simulated seconds per model call (throughput)"
    )
    ap.add_argument("--target", type=int, default=8, help="groups wanted (stragglers)")
    ap.add_argument(
        "--step-latency",
        type=float,
        default=0.3,
        help="simulated seconds per model call (stragglers)",
    )
    ap.add_argument("--alloc-groups", type=int, default=10)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--only", choices=("throughput", "stragglers", "allocation"))
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    emit = json_only(args.json)
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    prices = PriceBook.load()
    work = Path(tempfile.mkdtemp(prefix="stayer-bench-scale-"))
    home = work / "home"
    os.environ["STAYER_HOME"] = str(home)
    result: dict = {"cpus": os.cpu_count()}
    try:
        for part, fn in (
            ("stragglers", stragglers),
            ("allocation", allocation),
            ("throughput", throughput),
        ):
            if args.only in (None, part):
                result[part] = fn(args, prices, home if part == "throughput" else work)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    if args.json:
        emit(result)
    else:  # its figures, readable: the same document, indented
        print(json.dumps(result, indent=2), file=sys.stdout)


if __name__ == "__main__":
    main()

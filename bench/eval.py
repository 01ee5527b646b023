"""Evaluation throughput: trials per minute at concurrency 1, 4 and 16, and the speed-up
over sequential (concurrency 1), measured side by side in one run.

    python bench/eval.py [--tasks 20] [--levels 1,4,16] [--latencies 0,0.5]

The suite is generated in a temporary directory: ``--tasks`` copies and variants of the
examples (hello-file variants ask for a different greeting each). Every trial is a real
``stayer eval`` trial with the simulator's oracle policy: fresh workspace, agent loop in the
bubblewrap sandbox, verification in a fresh sandbox. With ``--latencies 0`` the model
answers at once, so the figure is the harness and sandbox cost per trial; a simulated model
latency (seconds per call) shows how concurrency hides waiting on a provider.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

from _stdout import json_only  # bench/: --json prints one document on stdout

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from stayer.eval.runner import EvalConfig, plan_trials, run_trials  # noqa: E402
from stayer.eval.suite import load_suite  # noqa: E402
from stayer.pricing import PriceBook  # noqa: E402

EXAMPLES = ROOT / "examples"
GREETING = "Hello, world!"


def make_suite(dest: Path, n: int) -> Path:
    """``n`` tasks cycling through the examples; hello-file copies greet task i by number."""
    examples = sorted(p for p in EXAMPLES.iterdir() if p.is_dir())
    for i in range(n):
        src = examples[i % len(examples)]
        task = dest / f"{src.name}-{i:02d}"
        shutil.copytree(src, task)
        if src.name == "hello-file":
            for rel in ("instruction.md", "tests/test.sh", "solution/solve.sh"):
                f = task / rel
                f.write_text(f.read_text().replace(GREETING, f"Hello, task {i}!"))
    return dest


def measure(
    suite: Path, concurrency: int, latency: float, prices: PriceBook
) -> tuple[float, int, int]:
    tasks = load_suite(suite)
    config = EvalConfig("sim:claude-sonnet-4-5", sim_latency=latency)
    trials = plan_trials(tasks, [config], epochs=1)
    start = time.perf_counter()
    records = asyncio.run(run_trials(trials, concurrency=concurrency, prices=prices))
    seconds = time.perf_counter() - start
    return seconds, len(records), sum(r["status"] == "succeeded" for r in records)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tasks", type=int, default=20)
    ap.add_argument("--levels", default="1,4,16")
    ap.add_argument("--latencies", default="0,0.5", help="simulated seconds per model call")
    ap.add_argument("--json", action="store_true", help="Print one JSON document of the figures.")
    args = ap.parse_args()
    emit = json_only(args.json)
    say = functools.partial(print, file=sys.stderr if args.json else sys.stdout)
    rows = []
    levels = [int(x) for x in args.levels.split(",")]
    latencies = [float(x) for x in args.latencies.split(",")]
    prices = PriceBook.load()
    with tempfile.TemporaryDirectory(prefix="stayer-bench-eval-") as tmp:
        os.environ["STAYER_HOME"] = str(Path(tmp) / "home")  # this process only: run dirs go here
        suite = make_suite(Path(tmp) / "suite", args.tasks)
        say(f"{args.tasks}-task suite, oracle policy, sim:claude-sonnet-4-5, {os.cpu_count()} CPUs")
        # Warm-up (tokenizer, price tables, bwrap probe), so that no level pays it.
        measure(suite, max(levels), 0.0, prices)
        for latency in latencies:
            say(f"\nmodel latency {latency:g} s per call")
            say(
                f"{'concurrency':>11} {'trials':>6} {'solved':>6} {'seconds':>8} {'trials/min':>10} {'speed-up':>8}"
            )
            base = None
            for level in levels:
                seconds, n, solved = measure(suite, level, latency, prices)
                rate = n / seconds * 60
                base = base or rate
                say(
                    f"{level:>11} {n:>6} {solved:>6} {seconds:>8.2f} {rate:>10.1f} {rate / base:>7.2f}x"
                )
                rows.append(
                    {
                        "latency_s": latency,
                        "concurrency": level,
                        "trials": n,
                        "solved": solved,
                        "seconds": seconds,
                        "trials_per_min": rate,
                        "speedup": rate / base,
                    }
                )
    if args.json:
        emit(
            {
                "bench": "eval",
                "tasks": args.tasks,
                "cpus": os.cpu_count(),
                "loadavg": os.getloadavg(),
                "rows": rows,
            }
        )


if __name__ == "__main__":
    main()

"""The example tasks against a real model on this machine: success, steps, tokens, cached
share, wall time and how close the budget's prompt counts came to the server's.

    python bench/real_model.py [--tasks hello-file,fix-median,sales-report] [--repeat 1]
                               [--max-steps 30] [--base-url URL] [--json]

Needs ``stayer local-model build``; starts its own server (its own run directory and port)
unless ``--base-url`` names one, and stops it at the end. Each task is run with
``stayer run … --model local:qwen2.5-coder-0.5b-instruct --json`` in a fresh
``$STAYER_HOME``; ``--repeat`` rounds go through the tasks in turn (interleaved), and wall
times are given as min and median. At temperature 0 the model's replies repeat, so the
other figures are the same in every round (the bench checks and says so). Count error:
|estimate − reported| / reported of each prompt from the second step on (the first is
counted by the server itself under a cap, or estimated from our own tokenizer without).
A success is reward ≥ 1 from the task's tests.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _stdout import json_only  # bench/: --json prints one document on stdout

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from stayer.models import local  # noqa: E402

REPO = Path(__file__).resolve().parent.parent


def run_task(task: str, base_url: str, max_steps: int, home: Path) -> dict:
    home.parent.mkdir(parents=True)
    t0 = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-m", "stayer.cli", "run", str(REPO / "examples" / task), "--model", local.SPEC,
         "--base-url", base_url, "--max-steps", str(max_steps), "--json"],
        capture_output=True, text=True, env={**os.environ, "STAYER_HOME": str(home)}, cwd=home.parent,
    )  # fmt: skip
    wall = time.perf_counter() - t0
    if not proc.stdout:
        raise SystemExit(
            f"{task}: stayer run printed nothing (exit {proc.returncode}): {proc.stderr[-500:]}"
        )
    doc = json.loads(proc.stdout)
    u = doc["usage"]
    errors = [
        abs(e["prompt_estimate"]["tokens"] - e["usage"]["input_tokens"])
        / e["usage"]["input_tokens"]
        for e in doc["ledger"][1:]
        if e.get("prompt_estimate") and e["usage"]["input_tokens"]
    ]
    return {
        "task": task,
        "success": doc["reward"] is not None and doc["reward"] >= 1,
        "status": doc["status"],
        "stop_reason": doc["stop_reason"],
        "steps": doc["steps"],
        "tool_errors": sum(e["tool_errors"] for e in doc["ledger"]),
        "input_tokens": u["input_tokens"],
        "cached_tokens": u["cache_read_tokens"],
        "output_tokens": u["output_tokens"],
        "cached_share": round(u["cache_read_tokens"] / u["input_tokens"], 4)
        if u["input_tokens"]
        else 0.0,
        "count_error_max": round(max(errors), 4) if errors else None,
        "count_error_mean": round(sum(errors) / len(errors), 4) if errors else None,
        "wall_s": round(wall, 2),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tasks", default="hello-file,fix-median,sales-report")
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--max-steps", type=int, default=30)
    ap.add_argument("--base-url", default=None)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    emit = json_only(args.json)
    tasks = [t for t in args.tasks.split(",") if t]
    for t in tasks:
        if not (REPO / "examples" / t).is_dir():
            raise SystemExit(f"--tasks: no examples/{t}")
    gaps = local.missing(local.LocalModelPaths.default())
    if gaps and not args.base_url:
        raise SystemExit(f"no local model ({', '.join(gaps)}): run `stayer local-model build`")

    with tempfile.TemporaryDirectory(prefix="stayer-bench-real-") as tmp:
        paths = local.LocalModelPaths(local.LocalModelPaths.default().root, Path(tmp) / "server")
        base_url = args.base_url or local.start(paths).base_url
        rounds: dict[str, list[dict]] = {t: [] for t in tasks}
        try:
            for r in range(args.repeat):
                for t in tasks:  # interleaved: round r runs every task once
                    rounds[t].append(
                        run_task(t, base_url, args.max_steps, Path(tmp) / f"{t}-{r}" / ".stayer")
                    )
        finally:
            if not args.base_url:
                local.stop(paths)

    results = []
    for runs in rounds.values():
        walls = [x["wall_s"] for x in runs]
        first = {k: v for k, v in runs[0].items() if k != "wall_s"}
        repeatable = all({k: v for k, v in x.items() if k != "wall_s"} == first for x in runs)
        results.append(
            {
                **first,
                "wall_s_min": min(walls),
                "wall_s_median": statistics.median(walls),
                "runs": len(runs),
                "repeatable": repeatable,
            }
        )
    doc = {
        "model": local.SPEC,
        "threads": os.cpu_count(),
        "load_avg": os.getloadavg(),
        "tasks": results,
    }
    if args.json:
        emit(doc)
        return
    print(
        f"{'task':<14}{'ok':>4}{'steps':>6}{'input':>8}{'cached':>8}{'share':>7}{'out':>6}{'cnt err':>9}{'wall min':>10}{'median':>8}"
    )
    for x in results:
        err = "-" if x["count_error_max"] is None else f"{x['count_error_max']:.1%}"
        print(
            f"{x['task']:<14}{'yes' if x['success'] else 'no':>4}{x['steps']:>6}{x['input_tokens']:>8}{x['cached_tokens']:>8}"
            f"{x['cached_share']:>7.0%}{x['output_tokens']:>6}{err:>9}{x['wall_s_min']:>9.1f}s{x['wall_s_median']:>7.1f}s"
        )


if __name__ == "__main__":
    main()

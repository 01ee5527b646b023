"""Re-rendering reports: ``stayer eval --out DIR`` again when every trial is done, and
``stayer audit --html`` over the same runs.

    python bench/report.py [--runs 10] [--json]

Set-up (not measured): one evaluation of the example tasks × two simulated models × two
epochs into a temporary ``--out``. Then each round runs, in a fresh process and in a
shuffled order: the re-run of that evaluation (all trials reused: only the summary, the
report and the per-run pages are written), the audit with ``--html``, and ``stayer --help``
as the floor of starting the command at all. Reports min and median wall time of each, and
of CPU time (user + system), which a loaded machine disturbs less. Byte code is cached, as
it is for an installed package.
Target (issue 13): re-rendering an existing ``--out`` under 2 s.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _stdout import json_only  # bench/: --json prints one document on stdout

ROOT = Path(__file__).resolve().parent.parent


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=10, help="measured rounds")
    ap.add_argument("--json", action="store_true", help="print one JSON document")
    args = ap.parse_args()
    emit = json_only(args.json)
    with tempfile.TemporaryDirectory(prefix="stayer-bench-report-") as tmp:
        home, out = Path(tmp) / "home", Path(tmp) / "out"
        env = {**os.environ, "STAYER_HOME": str(home)}
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
        # As installed: byte code cached (pip writes it), so no round compiles stayer's source.
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        env["PYTHONPYCACHEPREFIX"] = str(Path(tmp) / "pycache")
        eval_args = [
            "eval",
            str(ROOT / "examples"),
            "--model",
            "sim:claude-sonnet-4-5,sim:gpt-5",
            "--epochs",
            "2",
            "--out",
            str(out),
        ]
        commands = {
            "stayer --help (floor)": ["--help"],
            "stayer eval --out (all reused)": eval_args,
            "stayer audit --html": [
                "audit",
                str(home / "runs"),
                "--html",
                str(Path(tmp) / "audit.html"),
            ],
        }

        def run(argv: list[str]) -> tuple[float, float]:
            """Wall and CPU (user + system) seconds of ``stayer ARGV``."""
            t0 = time.perf_counter()
            proc = subprocess.Popen(
                [sys.executable, "-m", "stayer.cli", *argv],
                env=env,
                cwd=tmp,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            _, status, usage = os.wait4(proc.pid, 0)
            wall = time.perf_counter() - t0
            if os.waitstatus_to_exitcode(status) != 0:
                raise SystemExit(
                    f"stayer {' '.join(argv)}: exit code {os.waitstatus_to_exitcode(status)}"
                )
            return wall, usage.ru_utime + usage.ru_stime

        run(eval_args)  # set-up: the trials themselves
        samples: dict[str, list[float]] = {k: [] for k in commands}
        cpu: dict[str, list[float]] = {k: [] for k in commands}
        order = list(commands)
        load_before = os.getloadavg()[0]
        for i in range(args.runs + 1):  # one warm-up round
            random.shuffle(order)
            for name in order:
                wall, used = run(commands[name])
                if i:
                    samples[name].append(wall)
                    cpu[name].append(used)
        trials = len(list((out / "trials").rglob("*.json")))
    result = {
        "runs": args.runs,
        "trials": trials,
        "cores": os.cpu_count(),
        "load_1min_before": round(load_before, 2),
        "load_1min_after": round(os.getloadavg()[0], 2),
        "commands": {
            k: {
                "min_s": round(min(v), 3),
                "median_s": round(statistics.median(v), 3),
                "cpu_min_s": round(min(cpu[k]), 3),
                "cpu_median_s": round(statistics.median(cpu[k]), 3),
            }
            for k, v in samples.items()
        },
        "target_s": {"stayer eval --out (all reused)": 2.0},
    }
    if args.json:
        emit(result)
        return
    print(
        f"{args.runs} rounds, {trials} trials, load {result['load_1min_before']} → {result['load_1min_after']}"
    )
    for name, row in result["commands"].items():
        print(
            f"{name:<34} min {row['min_s']:6.3f} s  median {row['median_s']:6.3f} s  "
            f"(CPU min {row['cpu_min_s']:6.3f} s  median {row['cpu_median_s']:6.3f} s)"
        )


if __name__ == "__main__":
    main()

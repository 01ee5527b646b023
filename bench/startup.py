"""Start-up time of the ``stayer`` command against the floor of any Typer CLI.

    python bench/startup.py [--runs 20] [--json]

Each round runs, in a fresh interpreter and in a shuffled order, the floor
``python -c "import typer, rich.console"``, ``stayer --help``, ``stayer runs`` (on an empty
``$STAYER_HOME``) and ``stayer --version``; rounds are interleaved so that a machine busy
for a while slows all of them alike. Byte code is cached (in a temporary directory) as it is
for an installed package. Reports min and median wall time of each, and each
command's ratio to the floor (min to min, median to median), for wall time and for CPU time
(user + system, which a loaded machine disturbs less).
Targets (issue 13): ``stayer --help`` ≤ 1.5× the floor, ``stayer runs`` ≤ 2×.
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

COMMANDS = {
    "floor: import typer, rich.console": ["-c", "import typer, rich.console"],
    "stayer --help": ["-m", "stayer.cli", "--help"],
    "stayer runs": ["-m", "stayer.cli", "runs"],
    "stayer --version": ["-m", "stayer.cli", "--version"],
}
TARGETS = {"stayer --help": 1.5, "stayer runs": 2.0}


def measure(runs: int) -> tuple[dict[str, list[float]], dict[str, list[float]]]:
    """Wall and CPU (user + system) seconds of each command, per round. CPU time is what a
    shared machine's load disturbs least."""
    samples: dict[str, list[float]] = {name: [] for name in COMMANDS}
    cpu: dict[str, list[float]] = {name: [] for name in COMMANDS}
    with tempfile.TemporaryDirectory(prefix="stayer-bench-startup-") as home:
        env = {**os.environ, "STAYER_HOME": str(Path(home) / "empty")}
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
        # As installed: pip writes .pyc files, so no command compiles its source each time
        # (PYTHONDONTWRITEBYTECODE would make every run compile stayer's, but not typer's).
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        env["PYTHONPYCACHEPREFIX"] = str(Path(home) / "pycache")
        order = list(COMMANDS)
        for i in range(runs + 2):  # two warm-up rounds fill the page cache and .pyc files
            random.shuffle(order)
            for name in order:
                t0 = time.perf_counter()
                proc = subprocess.Popen(
                    [sys.executable, *COMMANDS[name]],
                    env=env,
                    cwd=home,
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                )
                _, status, usage = os.wait4(proc.pid, 0)
                wall = time.perf_counter() - t0
                proc.returncode = os.waitstatus_to_exitcode(status)
                if proc.returncode != 0:
                    raise SystemExit(f"{name}: exit code {proc.returncode}")
                if i >= 2:
                    samples[name].append(wall)
                    cpu[name].append(usage.ru_utime + usage.ru_stime)
    return samples, cpu


def summarise(samples: dict[str, list[float]], prefix: str = "") -> dict[str, dict[str, float]]:
    floor = next(iter(samples))
    fmin, fmed = min(samples[floor]), statistics.median(samples[floor])
    out = {}
    for name, xs in samples.items():
        row = {
            f"{prefix}min_s": round(min(xs), 4),
            f"{prefix}median_s": round(statistics.median(xs), 4),
        }
        if name != floor:
            row[f"{prefix}ratio_min"] = round(min(xs) / fmin, 2)
            row[f"{prefix}ratio_median"] = round(statistics.median(xs) / fmed, 2)
        out[name] = row
    return out


def combine(
    wall: dict[str, list[float]], cpu: dict[str, list[float]]
) -> dict[str, dict[str, float]]:
    rows = summarise(wall)
    for name, row in summarise(cpu, "cpu_").items():
        rows[name].update(row)
        if name in TARGETS:
            rows[name]["target_ratio"] = TARGETS[name]
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=20, help="measured rounds (after 2 warm-up rounds)")
    ap.add_argument("--json", action="store_true", help="print one JSON document")
    args = ap.parse_args()
    emit = json_only(args.json)
    load = os.getloadavg()[0]
    result = {
        "runs": args.runs,
        "python": sys.version.split()[0],
        "cores": os.cpu_count(),
        "load_1min_before": round(load, 2),
        "commands": combine(*measure(args.runs)),
        "load_1min_after": round(os.getloadavg()[0], 2),
        "when": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    if args.json:
        emit(result)
        return
    print(f"{args.runs} rounds, load {result['load_1min_before']} → {result['load_1min_after']}")
    for name, row in result["commands"].items():
        for kind, p in (("wall", ""), ("cpu ", "cpu_")):
            ratio = (
                f"  ×{row[p + 'ratio_min']} (min)  ×{row[p + 'ratio_median']} (median)"
                if p + "ratio_min" in row
                else ""
            )
            target = f"  target ≤ ×{row['target_ratio']}" if "target_ratio" in row and not p else ""
            ms = f"min {row[p + 'min_s'] * 1000:7.1f} ms  median {row[p + 'median_s'] * 1000:7.1f} ms"
            print(f"{name if not p else '':<36} {kind} {ms}{ratio}{target}")


if __name__ == "__main__":
    main()

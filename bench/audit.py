"""Throughput and peak memory of ``stayer audit`` against ccusage on the same Claude Code logs.

    python bench/audit.py [--mb 200] [--runs 5] [--ccusage PATH] [--baseline DIR] [--keep DIR] [--json]

The real Claude Code transcripts in ../shared/corpus/claude-code/ are replicated with fresh
session, message and request ids (so nothing deduplicates away) into a temporary
``projects/<name>/*.jsonl`` tree of about ``--mb`` MB, plus a tree a quarter that size to
see whether memory grows with the input. Both tools read the same tree, cold process each
time: ``stayer audit PROJECTS --json`` (all cores) and ccusage's native binary
``ccusage claude session --json --offline`` with ``CLAUDE_CONFIG_DIR`` pointing at it.

Each stayer checkout's bytecode is compiled first (``compileall``), as an installed package's
is; without that, a shell with ``PYTHONDONTWRITEBYTECODE`` set would have every run compile
stayer from source. ``--source`` times it that way instead.

The tools are timed in ``--runs`` interleaved rounds (the order alternates each round, so
a change of machine load hits both alike); each figure is given as min and median, wall
time and CPU time (user + system of the whole process tree), with the load average before
and after. ``--baseline DIR`` times another stayer checkout (e.g. main's) in the same
rounds, for a before/after. stayer keeps the price steps it compiled between audits (see
``stayer.audit.costing``), in a cache directory of the benchmark's own: its first run, with
that cache empty, is reported apart as ``cold``. Peak memory is sampled from /proc every
20 ms in a separate run and summed over the process tree (stayer's workers included). The
token totals of the tools are compared, so all are known to have done the same work.

ccusage: ``--ccusage PATH`` to its native binary, else ``$CCUSAGE_BIN``, else it is
installed with npm (``ccusage@20.0.24`` and ``@ccusage/ccusage-linux-x64@20.0.24``) into
``~/.cache/stayer-bench/ccusage``. Target (issue 20): stayer at least 1.0× ccusage's
throughput, memory not growing with input size.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from _stdout import json_only  # bench/: --json prints one document on stdout

ROOT = Path(__file__).resolve().parent.parent
# ../shared next to the checkout, or next to the folder holding it (a worktree under wt/)
CORPUS = next(
    (
        d / "shared" / "corpus" / "claude-code"
        for d in (ROOT.parent, ROOT.parent.parent)
        if (d / "shared" / "corpus" / "claude-code").is_dir()
    ),
    ROOT.parent / "shared" / "corpus" / "claude-code",
)
CCUSAGE_VERSION = "20.0.24"

_IDS = re.compile(rb"\b(msg|req)_([0-9A-Za-z]+)")
_UUID = re.compile(rb"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


def corpus_sessions() -> list[tuple[str, list[Path]]]:
    """(project name, files) per project directory of the corpus, in a stable order."""
    by_dir: dict[Path, list[Path]] = {}
    for f in sorted(CORPUS.rglob("*.jsonl")):
        by_dir.setdefault(f.parent, []).append(f)
    return [(f"p{i}", files) for i, files in enumerate(by_dir.values())]


def _fresh(data: bytes, tag: bytes) -> bytes:
    """``data`` with every message/request id and uuid replaced by a new one of the same shape."""
    data = _IDS.sub(lambda m: m.group(1) + b"_" + m.group(2) + b"R" + tag, data)
    return _UUID.sub(lambda m: m.group(0)[: -len(tag)] + tag, data)


def replicate(dest: Path, target_bytes: int) -> tuple[int, int]:
    """Copies of the corpus with fresh ids until ``target_bytes``; (bytes, replicas)."""
    sessions = corpus_sessions()
    written, k = 0, 0
    while written < target_bytes:
        tag = f"{k:06x}".encode()
        for project, files in sessions:
            out = dest / "projects" / f"{project}-r{k}"
            out.mkdir(parents=True, exist_ok=True)
            for f in files:
                data = _fresh(f.read_bytes(), tag)
                name = _fresh(f.name.encode(), tag).decode()
                (out / name).write_bytes(data)
                written += len(data)
        k += 1
    return written, k


def find_ccusage(explicit: str | None) -> Path:
    for candidate in (explicit, os.environ.get("CCUSAGE_BIN")):
        if candidate:
            return Path(candidate)
    cache = Path.home() / ".cache" / "stayer-bench" / "ccusage"
    found = sorted(cache.glob("node_modules/@ccusage/ccusage-*/bin/ccusage"))
    if not found:
        if shutil.which("npm") is None:
            sys.exit("ccusage not found: give --ccusage PATH (its native binary) or install npm")
        cache.mkdir(parents=True, exist_ok=True)
        subprocess.run(
            [
                "npm",
                "install",
                "--silent",
                f"ccusage@{CCUSAGE_VERSION}",
                f"@ccusage/ccusage-linux-x64@{CCUSAGE_VERSION}",
            ],
            cwd=cache,
            check=True,
        )
        found = sorted(cache.glob("node_modules/@ccusage/ccusage-*/bin/ccusage"))
    if not found:
        sys.exit(f"npm did not install a native ccusage binary under {cache}")
    binary = found[0]
    if not os.access(
        binary, os.X_OK
    ):  # npm unpacks it without the exec bit; ccusage's wrapper sets it
        binary.chmod(binary.stat().st_mode | 0o111)
    return binary


def _tree_rss_kb(pid: int) -> int:
    total, stack = 0, [pid]
    while stack:
        p = stack.pop()
        try:
            with open(f"/proc/{p}/status") as f:
                for line in f:
                    if line.startswith("VmRSS:"):
                        total += int(line.split()[1])
                        break
            for task in os.listdir(f"/proc/{p}/task"):
                with open(f"/proc/{p}/task/{task}/children") as f:
                    stack.extend(int(c) for c in f.read().split())
        except (OSError, ValueError):
            continue
    return total


@dataclass
class Run:
    wall: float
    cpu: float  # user + system seconds of the process and every child it waited for
    peak_kb: int
    out: bytes


def run(cmd: list[str], env: dict[str, str], sample: bool = False) -> Run:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    peak = [0]
    done = threading.Event()

    def sampler() -> None:
        while not done.is_set():
            peak[0] = max(peak[0], _tree_rss_kb(proc.pid))
            done.wait(0.02)

    thread = threading.Thread(target=sampler) if sample else None
    if thread:
        thread.start()
    out, _ = proc.communicate()
    wall = time.perf_counter() - t0
    done.set()
    if thread:
        thread.join()
    if proc.returncode != 0:
        sys.exit(f"{cmd[0]} failed with exit code {proc.returncode}")
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime
    return Run(wall, cpu, peak[0], out)


def stayer_cmd(tree: Path) -> list[str]:
    # -P: the stayer on PYTHONPATH, not one in the current directory (``-m`` would put it first)
    return [sys.executable, "-P", "-m", "stayer.cli", "audit", str(tree / "projects"), "--json"]


def ccusage_cmd(binary: Path) -> list[str]:
    return [str(binary), "claude", "session", "--json", "--offline"]


def totals_stayer(out: bytes) -> dict[str, int]:
    u = json.loads(out)["totals"]["usage"]
    return {
        "input": u["uncached_input_tokens"],
        "output": u["output_tokens"],
        "cache_write": u["cache_write_tokens"],
        "cache_read": u["cache_read_tokens"],
    }


def totals_ccusage(out: bytes) -> dict[str, int]:
    t = json.loads(out)["totals"]
    return {
        "input": t["inputTokens"],
        "output": t["outputTokens"],
        "cache_write": t["cacheCreationTokens"],
        "cache_read": t["cacheReadTokens"],
    }


def summary(runs: list[Run]) -> dict[str, float]:
    walls, cpus = [r.wall for r in runs], [r.cpu for r in runs]
    return {
        "wall_min_s": min(walls),
        "wall_median_s": statistics.median(walls),
        "cpu_min_s": min(cpus),
        "cpu_median_s": statistics.median(cpus),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mb", type=float, default=200.0, help="size of the replicated logs (MB)")
    ap.add_argument("--runs", type=int, default=5, help="interleaved rounds (min and median)")
    ap.add_argument("--ccusage", help="path to ccusage's native binary")
    ap.add_argument("--baseline", help="another stayer checkout to time in the same rounds")
    ap.add_argument("--keep", help="build the trees here and keep them (reused when present)")
    ap.add_argument(
        "--json",
        action="store_true",
        help="Print one JSON document of the figures on stdout (the tables on stderr).",
    )
    ap.add_argument(
        "--source", action="store_true", help="do not compile stayer's bytecode before timing"
    )
    args = ap.parse_args()
    emit = json_only(args.json)
    if not CORPUS.is_dir():
        sys.exit(f"skipped: corpus not found at {CORPUS}")
    binary = find_ccusage(args.ccusage)
    base = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="stayer-audit-bench-"))
    try:
        sizes = {"small": args.mb * 1e6 / 4, "full": args.mb * 1e6}
        trees: dict[str, tuple[Path, int]] = {}
        for label, target in sizes.items():
            tree = base / label
            done = tree / f".replicated-{int(target)}"
            if done.is_file():
                trees[label] = (tree, int(done.read_text()))
                continue
            if tree.exists():
                shutil.rmtree(tree)
            written, _ = replicate(tree, int(target))
            done.write_text(str(written))
            trees[label] = (tree, written)
        caches = Path(tempfile.mkdtemp(prefix="stayer-audit-bench-cache-"))
        tools: dict[str, tuple[list[str], dict[str, str]]] = {}
        roots = {
            "stayer": ROOT,
            **({"stayer-baseline": Path(args.baseline).resolve()} if args.baseline else {}),
        }
        for name, root in roots.items():
            if not args.source:
                subprocess.run(
                    [sys.executable, "-m", "compileall", "-q", str(root / "stayer")],
                    check=True,
                    stdout=subprocess.DEVNULL,
                )
            env = dict(os.environ, PYTHONPATH=str(root), XDG_CACHE_HOME=str(caches / name))
            tools[name] = (stayer_cmd(trees["full"][0]), env)
        tools["ccusage"] = (
            ccusage_cmd(binary),
            dict(os.environ, CLAUDE_CONFIG_DIR=str(trees["full"][0])),
        )
        load_before = os.getloadavg()
        cold = {name: run(*tools[name]).wall for name in roots}  # empty price-steps cache
        run(*tools["ccusage"])  # page cache and binary warm
        timed: dict[str, list[Run]] = {name: [] for name in tools}
        order = list(tools)
        for r in range(args.runs):
            for name in order if r % 2 == 0 else order[::-1]:
                timed[name].append(run(*tools[name]))
        load_after = os.getloadavg()
        peaks: dict[str, dict[str, float]] = {}
        for name, (cmd, env) in tools.items():
            peaks[name] = {}
            for label, (tree, _) in trees.items():
                if name == "ccusage":
                    env = dict(env, CLAUDE_CONFIG_DIR=str(tree))
                else:
                    cmd = stayer_cmd(tree)
                peaks[name][label] = run(cmd, env, sample=True).peak_kb / 1024
        full_bytes = trees["full"][1]
        reference = totals_ccusage(timed["ccusage"][-1].out)
        same = {name: totals_stayer(timed[name][-1].out) == reference for name in roots}
        figures = {name: summary(runs) for name, runs in timed.items()}
        cc = figures["ccusage"]
        doc: dict[str, object] = {
            "mb": full_bytes / 1e6,
            "cores": os.cpu_count(),
            "runs": args.runs,
            "bytecode_compiled": not args.source,
            "load_before": load_before,
            "load_after": load_after,
            "tools": {
                name: {
                    **f,
                    "mb_per_s_median": full_bytes / 1e6 / f["wall_median_s"],
                    "throughput_vs_ccusage_median": cc["wall_median_s"] / f["wall_median_s"],
                    "throughput_vs_ccusage_min": cc["wall_min_s"] / f["wall_min_s"],
                    "cpu_vs_ccusage_median": f["cpu_median_s"] / cc["cpu_median_s"],
                    "cold_wall_s": cold.get(name),
                    "peak_rss_mb": peaks[name]["full"],
                    "peak_rss_mb_quarter_input": peaks[name]["small"],
                    "token_totals_equal_ccusage": same.get(name, True),
                }
                for name, f in figures.items()
            },
        }
        print(
            f"logs: {full_bytes / 1e6:.1f} MB (and {trees['small'][1] / 1e6:.1f} MB), {os.cpu_count()} cores, "
            f"{args.runs} interleaved rounds; load {load_before[0]:.1f} before, {load_after[0]:.1f} after"
        )
        print(
            f"{'tool':<16}{'wall min':>9}{'median':>8}{'cpu min':>9}{'median':>8}{'MB/s':>7}"
            f"{'× ccusage':>10}{'cold s':>8}{'RSS MB':>8}{'at 1/4':>8}"
        )
        for name, t in doc["tools"].items():  # type: ignore[union-attr]
            cold_s = "" if t["cold_wall_s"] is None else f"{t['cold_wall_s']:.2f}"
            print(
                f"{name:<16}{t['wall_min_s']:>9.2f}{t['wall_median_s']:>8.2f}{t['cpu_min_s']:>9.2f}"
                f"{t['cpu_median_s']:>8.2f}{t['mb_per_s_median']:>7.0f}{t['throughput_vs_ccusage_median']:>10.2f}"
                f"{cold_s:>8}{t['peak_rss_mb']:>8.0f}{t['peak_rss_mb_quarter_input']:>8.0f}"
            )
        ratio = doc["tools"]["stayer"]["throughput_vs_ccusage_median"]  # type: ignore[index]
        print(f"throughput stayer / ccusage (median wall): {ratio:.2f}x (target >= 1.0x)")
        for name in roots:
            print(f"token totals by kind of {name} equal ccusage's: {same[name]}")
        emit(doc)
        shutil.rmtree(caches, ignore_errors=True)
    finally:
        if not args.keep:
            shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()

"""Throughput and peak memory of ``stayer audit`` against ccusage on the same Claude Code logs.

    python bench/audit.py [--mb 200] [--runs 3] [--ccusage PATH] [--keep DIR]

The real Claude Code transcripts in ../shared/corpus/claude-code/ are replicated with fresh
session, message and request ids (so nothing deduplicates away) into a temporary
``projects/<name>/*.jsonl`` tree of about ``--mb`` MB, plus a tree a quarter that size to
see whether memory grows with the input. Both tools read the same tree, cold process each
time: ``stayer audit PROJECTS --json`` (all cores) and ccusage's native binary
``ccusage claude session --json --offline`` with ``CLAUDE_CONFIG_DIR`` pointing at it.
Wall time is the median of ``--runs`` runs; peak memory is sampled from /proc every 20 ms
in a separate run and summed over the process tree (stayer's workers included). The token
totals of the two are compared, so both are known to have done the same work.

ccusage: ``--ccusage PATH`` to its native binary, else ``$CCUSAGE_BIN``, else it is
installed with npm (``ccusage@20.0.24`` and ``@ccusage/ccusage-linux-x64@20.0.24``) into
``~/.cache/stayer-bench/ccusage``. Target (issue 8): stayer at least 0.5× ccusage's
throughput, memory not growing with input size.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CORPUS = ROOT.parent / "shared" / "corpus" / "claude-code"
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
            ["npm", "install", "--silent", f"ccusage@{CCUSAGE_VERSION}", f"@ccusage/ccusage-linux-x64@{CCUSAGE_VERSION}"],
            cwd=cache,
            check=True,
        )
        found = sorted(cache.glob("node_modules/@ccusage/ccusage-*/bin/ccusage"))
    if not found:
        sys.exit(f"npm did not install a native ccusage binary under {cache}")
    binary = found[0]
    if not os.access(binary, os.X_OK):  # npm unpacks it without the exec bit; ccusage's wrapper sets it
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


def run(cmd: list[str], env: dict[str, str], sample: bool = False) -> tuple[float, int, bytes]:
    """(wall seconds, peak RSS of the process tree in KiB if sampled, stdout)."""
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
    return wall, peak[0], out


def stayer_cmd(tree: Path) -> list[str]:
    return [sys.executable, "-m", "stayer.cli", "audit", str(tree / "projects"), "--json"]


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


def measure(name: str, cmd: list[str], env: dict[str, str], runs: int) -> dict[str, object]:
    run(cmd, env)  # warm the page cache and the binary
    walls = []
    out = b""
    for _ in range(runs):
        wall, _, out = run(cmd, env)
        walls.append(wall)
    _, peak_kb, _ = run(cmd, env, sample=True)
    return {"name": name, "wall": statistics.median(walls), "peak_mb": peak_kb / 1024, "out": out}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mb", type=float, default=200.0, help="size of the replicated logs (MB)")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--ccusage", help="path to ccusage's native binary")
    ap.add_argument("--keep", help="build the trees here and keep them")
    args = ap.parse_args()
    if not CORPUS.is_dir():
        sys.exit(f"skipped: corpus not found at {CORPUS}")
    binary = find_ccusage(args.ccusage)
    base = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="stayer-audit-bench-"))
    try:
        sizes = {"small": args.mb * 1e6 / 4, "full": args.mb * 1e6}
        trees: dict[str, tuple[Path, int]] = {}
        for label, target in sizes.items():
            tree = base / label
            if tree.exists():
                shutil.rmtree(tree)
            written, _ = replicate(tree, int(target))
            trees[label] = (tree, written)
        env = dict(os.environ, PYTHONPATH=str(ROOT))
        results: dict[tuple[str, str], dict[str, object]] = {}
        for label, (tree, _) in trees.items():
            results[("stayer", label)] = measure("stayer", stayer_cmd(tree), env, args.runs)
            cc_env = dict(env, CLAUDE_CONFIG_DIR=str(tree))
            results[("ccusage", label)] = measure("ccusage", ccusage_cmd(binary), cc_env, args.runs)
        full_bytes = trees["full"][1]
        same = totals_stayer(results[("stayer", "full")]["out"]) == totals_ccusage(  # type: ignore[arg-type]
            results[("ccusage", "full")]["out"]  # type: ignore[arg-type]
        )
        print(f"logs: {full_bytes / 1e6:.1f} MB (and {trees['small'][1] / 1e6:.1f} MB), {os.cpu_count()} cores")
        print(f"{'tool':<9}{'MB/s':>9}{'wall s':>9}{'peak RSS MB':>13}{'RSS at 1/4 size':>17}")
        for tool in ("stayer", "ccusage"):
            full, small = results[(tool, "full")], results[(tool, "small")]
            mbps = full_bytes / 1e6 / full["wall"]  # type: ignore[operator]
            print(f"{tool:<9}{mbps:>9.1f}{full['wall']:>9.2f}{full['peak_mb']:>13.1f}{small['peak_mb']:>17.1f}")
        ratio = results[("ccusage", "full")]["wall"] / results[("stayer", "full")]["wall"]  # type: ignore[operator]
        print(f"throughput stayer / ccusage: {ratio:.2f}x (target >= 0.5x)")
        for tool in ("stayer", "ccusage"):
            growth = results[(tool, "full")]["peak_mb"] / max(results[(tool, "small")]["peak_mb"], 1e-9)  # type: ignore[operator]
            print(f"peak memory {tool}: 4x the input -> {growth:.2f}x the memory")
        print(f"token totals by kind identical: {same}")
    finally:
        if not args.keep:
            shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()

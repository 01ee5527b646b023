"""What MCP tool schemas cost a long run, and what a mid-run list change costs.

    python bench/mcp.py [--json] [--steps 30]

Servers: ``@modelcontextprotocol/server-everything`` (npm) and ``mcp-server-time`` (PyPI),
as ``.ci/run`` installs them under ``~/.cache/stayer-bench/mcp-servers``, and
``tests/mcp_servers/tiny.py`` with 100 extra tools of a usual schema size (so the run
carries 100+ tools). Each run is a ``--steps``-step scripted run of ``stayer run`` on the
simulator (``sim:claude-sonnet-4-5``): bash commands printing ~150 tokens each, two MCP
calls, then submit. Runs: ``no_mcp`` (no servers: the baseline), ``eager`` (every schema in
the prompt's prefix), ``lazy``, ``auto``, ``eager_list_change`` (the tiny server's list changes at step 10 and
the agent calls that server at step 20: the change is taken then, one priced cache break).
For each: step-1 prompt tokens, total cost, cache read share, cache breaks by reason.

``lazy`` and ``auto`` (``--mcp-tools``) run the same script: under lazy the simulator's
script policy searches (``tool_search``) before each MCP call it cannot see, one more step
each. Targets: auto ≤ the cheaper of eager and lazy + 2 %; lazy ≥ 80 % fewer step-1 prompt
tokens than eager. The document gives both, whether met or not.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path
from typing import Any

from _stdout import json_only  # bench/: --json prints one document on stdout

ROOT = Path(__file__).resolve().parent.parent
# This file is named mcp.py: bench/ must not shadow the SDK's package of that name.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != ROOT / "bench"]
sys.path.insert(0, str(ROOT))

CACHE = Path(os.environ.get("STAYER_MCP_SERVERS", Path.home() / ".cache/stayer-bench/mcp-servers"))
TINY = ROOT / "tests" / "mcp_servers" / "tiny.py"
MODEL = "sim:claude-sonnet-4-5"


def servers_toml() -> str:
    everything = CACHE / "node_modules" / ".bin" / "mcp-server-everything"
    time_server = CACHE / "venv" / "bin" / "mcp-server-time"
    missing = [str(p) for p in (everything, time_server) if not p.exists()]
    if missing:
        sys.exit(f"bench/mcp.py: not installed (see .ci/run): {', '.join(missing)}")
    py = sys.executable
    return (
        f'[mcp.servers.everything]\ncommand = ["{everything}", "stdio"]\ntrust = "host"\n\n'
        f'[mcp.servers.time]\ncommand = ["{time_server}"]\ntrust = "host"\n\n'
        f'[mcp.servers.store]\ncommand = ["{py}", "{TINY}", "--many=100"]\ntrust = "host"\n\n'
        f'[mcp.servers.t]\ncommand = ["{py}", "{TINY}"]\ntrust = "host"\n'
    )


def script(steps: int, mcp: bool, change: bool) -> str:
    words = " ".join(["alpha beta gamma delta"] * 35)
    turns = []
    for k in range(1, steps):
        if mcp and change and k == 10:
            turns.append("- tool: t__change\n")
        elif mcp and k == 20:
            turns.append("- tool: t__echo\n  input: {text: twenty}\n")
        elif mcp and k == 5:
            turns.append("- tool: time__get_current_time\n  input: {timezone: UTC}\n")
        else:
            cmd = f"echo {k} {words} | tee -a log.txt"  # the workspace changes: progress
            turns.append(f"- tool: bash\n  input: {{command: '{cmd}'}}\n")
    turns.append("- tool: submit\n  input: {summary: done}\n")
    return "".join(turns)


def run(
    work: Path, name: str, steps: int, mcp: bool, change: bool, mode: str = "eager"
) -> dict[str, Any]:
    task = work / name / "task"
    (task / "tests").mkdir(parents=True)
    (task / "instruction.md").write_text("Run the script.\n")
    (task / "tests" / "test.sh").write_text("#!/bin/bash\necho 1 > /logs/verifier/reward.txt\n")
    (work / name / "script.yaml").write_text(script(steps, mcp, change))
    args = [sys.executable, "-m", "stayer.cli", "run", str(task), "--model", MODEL,
            "--sim-policy", f"script:{work / name / 'script.yaml'}",
            "--max-steps", str(steps * 4), "--mcp-tools", mode, "--json"]  # fmt: skip
    if mcp:
        (work / name / "stayer.toml").write_text(servers_toml())
        args += ["--config", str(work / name / "stayer.toml")]
    env = {**os.environ, "STAYER_HOME": str(work / name / "home"), "PYTHONPATH": str(ROOT)}
    r = subprocess.run(args, capture_output=True, text=True, env=env, timeout=1800)
    if r.returncode != 0:
        sys.exit(f"bench/mcp.py: run {name} failed: {r.stderr[-2000:]}")
    doc = json.loads(r.stdout)
    ledger = doc["ledger"]
    prompt = sum(e["usage"]["input_tokens"] for e in ledger)
    read = sum(e["usage"]["cache_read_tokens"] for e in ledger)
    breaks = Counter((e.get("cache_break") or {}).get("reason") for e in ledger)
    breaks.pop(None, None)
    return {
        "steps": len(ledger),
        "stop_reason": doc["stop_reason"],
        "step1_prompt_tokens": ledger[0]["usage"]["input_tokens"],
        "cost_usd": doc["cost_usd"],
        "cache_read_share": round(read / prompt, 4) if prompt else None,
        "cache_breaks": dict(breaks),
        "tool_errors": sum(c["is_error"] for e in ledger for c in e["tool_calls"]),
        "mcp_tools": doc.get("mcp_tools"),
    }


async def schema_tokens() -> dict[str, Any]:
    from stayer.mcp.config import parse_servers
    from stayer.mcp.tools import McpTools, reserved_names
    from stayer.settings import read_toml
    from stayer.tokens import canonical_tools, counter_for

    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "stayer.toml"
        path.write_text(servers_toml())
        servers = parse_servers(read_toml(path)["mcp"], str(path))
    counter = counter_for("anthropic", "claude-sonnet-4-5")
    async with McpTools(servers, None, counter, reserved_names(counter)) as mcp:
        by_server = Counter(t.source for t in mcp.tools)
        return {
            "servers": dict(sorted(by_server.items())),
            "mcp_tools": len(mcp.tools),
            "mcp_schema_tokens": counter.count(canonical_tools(t.spec for t in mcp.tools)),
        }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", action="store_true", help="Print one JSON document on stdout.")
    ap.add_argument("--steps", type=int, default=30)
    opts = ap.parse_args()
    emit = json_only(opts.json)
    work = Path(tempfile.mkdtemp(prefix="stayer-bench-mcp-"))
    try:
        doc: dict[str, Any] = {"model": MODEL, "load": os.getloadavg()[0]}
        doc.update(asyncio.run(schema_tokens()))
        doc["runs"] = {
            "no_mcp": run(work, "no_mcp", opts.steps, mcp=False, change=False),
            "eager": run(work, "eager", opts.steps, mcp=True, change=False),
            "eager_list_change": run(work, "change", opts.steps, mcp=True, change=True),
            "lazy": run(work, "lazy", opts.steps, mcp=True, change=False, mode="lazy"),
            "auto": run(work, "auto", opts.steps, mcp=True, change=False, mode="auto"),
        }
        r = doc["runs"]
        cheaper = min(float(r["eager"]["cost_usd"]), float(r["lazy"]["cost_usd"]))
        fewer = 1 - r["lazy"]["step1_prompt_tokens"] / r["eager"]["step1_prompt_tokens"]
        doc["targets"] = {
            "auto_over_cheaper": round(float(r["auto"]["cost_usd"]) / cheaper - 1, 4),
            "auto_within_2pct": float(r["auto"]["cost_usd"]) <= cheaper * 1.02,
            "lazy_step1_fewer": round(fewer, 4),
            "lazy_80pct_fewer_step1": fewer >= 0.8,
        }
    finally:
        shutil.rmtree(work, ignore_errors=True)
    for name, r in doc["runs"].items():
        print(
            f"{name:18} step-1 prompt {r['step1_prompt_tokens']:>7,}  cost ${r['cost_usd']}  "
            f"cache read {r['cache_read_share']:.1%}  breaks {r['cache_breaks'] or '-'}"
        )
    print(f"{doc['mcp_tools']} MCP tools, {doc['mcp_schema_tokens']:,} schema tokens")
    emit(doc)


if __name__ == "__main__":
    main()

"""stayer audit against ccusage 20 on the real Claude Code logs of the corpus.

Needs ccusage's native binary: ``$CCUSAGE_BIN``, ``ccusage`` on PATH, or the copy
``bench/audit.py`` installs under ``~/.cache/stayer-bench/ccusage``; skipped otherwise (the
default test run never reaches the network). ccusage reports each ``agent-<id>.jsonl``
file as a session of its own; stayer attributes it to its parent session, so ccusage's
rows are summed per stayer session before comparing. Token totals by kind must be equal;
costs within 1 % (ccusage prices from LiteLLM's table, stayer from genai-prices).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections import defaultdict
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from stayer.audit.document import build
from stayer.audit.engine import analyse_all, discover
from stayer.pricing import PriceBook

ROOT = Path(__file__).resolve().parent.parent
CORPUS = ROOT.parent / "shared" / "corpus" / "claude-code"
KINDS = {
    "inputTokens": "uncached_input_tokens",
    "outputTokens": "output_tokens",
    "cacheCreationTokens": "cache_write_tokens",
    "cacheReadTokens": "cache_read_tokens",
}


def ccusage_binary() -> Path | None:
    explicit = os.environ.get("CCUSAGE_BIN") or shutil.which("ccusage")
    if explicit:
        return Path(explicit)
    cache = Path.home() / ".cache" / "stayer-bench" / "ccusage"
    found = [
        b
        for b in sorted(cache.glob("node_modules/@ccusage/ccusage-*/bin/ccusage"))
        if os.access(b, os.X_OK)
    ]
    return found[0] if found else None


BINARY = ccusage_binary()
pytestmark = pytest.mark.skipif(
    BINARY is None, reason="ccusage not installed (set CCUSAGE_BIN; see bench/audit.py)"
)


@pytest.fixture(scope="module")
def laid_out(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The corpus as ``projects/<name>/*.jsonl``, the layout ccusage reads."""
    if not CORPUS.is_dir():
        pytest.skip(f"corpus not found at {CORPUS}")
    root = tmp_path_factory.mktemp("claude")
    by_dir: dict[Path, list[Path]] = defaultdict(list)
    for f in sorted(CORPUS.rglob("*.jsonl")):
        by_dir[f.parent].append(f)
    for i, files in enumerate(by_dir.values()):
        dest = root / "projects" / f"p{i}"
        dest.mkdir(parents=True)
        for f in files:
            shutil.copyfile(f, dest / f.name)
    return root


def ccusage(root: Path, *args: str) -> dict[str, Any]:
    assert BINARY is not None
    env = dict(os.environ, CLAUDE_CONFIG_DIR=str(root))
    p = subprocess.run(
        [str(BINARY), "claude", *args, "--json", "--offline"],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout)


@pytest.fixture(scope="module")
def stayer_doc(laid_out: Path) -> dict[str, Any]:
    found = discover([laid_out / "projects"])
    return build(analyse_all(found.refs, PriceBook(), jobs=1)).to_json()


def test_sessions_match_ccusage(laid_out: Path, stayer_doc: dict[str, Any]) -> None:
    theirs = ccusage(laid_out, "session")
    owner = {}
    for s in stayer_doc["sessions"]:
        owner[(s["project"], s["id"])] = s["id"]
        for sub in s["subagents"]:
            owner[(s["project"], f"agent-{sub['id']}")] = s["id"]
    summed: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    for row in theirs["sessions"]:
        mine = owner[(row["projectPath"], row["sessionId"])]
        for k in (*KINDS, "totalCost"):
            summed[mine][k] += row[k]
    assert set(summed) == {s["id"] for s in stayer_doc["sessions"]}
    for s in stayer_doc["sessions"]:
        row = summed[s["id"]]
        assert {KINDS[k]: int(row[k]) for k in KINDS} == {
            v: s["usage"][v] for v in KINDS.values()
        }, s["id"]
        assert float(Decimal(s["cost_usd"])) == pytest.approx(row["totalCost"], rel=0.01), s["id"]
    totals = theirs["totals"]
    assert {KINDS[k]: totals[k] for k in KINDS} == {
        v: stayer_doc["totals"]["usage"][v] for v in KINDS.values()
    }
    assert float(Decimal(stayer_doc["totals"]["cost_usd"])) == pytest.approx(
        totals["totalCost"], rel=0.01
    )


def test_days_match_ccusage(laid_out: Path) -> None:
    theirs = ccusage(laid_out, "daily", "--timezone", "UTC")
    found = discover([laid_out / "projects"])
    mine = {
        g["key"]: g
        for g in build(analyse_all(found.refs, PriceBook(), jobs=1), "day").to_json()["groups"]
    }
    assert set(mine) == {d["date"] for d in theirs["daily"]}
    for d in theirs["daily"]:
        g = mine[d["date"]]
        assert {KINDS[k]: d[k] for k in KINDS} == {v: g["usage"][v] for v in KINDS.values()}
        assert float(Decimal(g["cost_usd"])) == pytest.approx(d["totalCost"], rel=0.01)


def test_codex_fixture_matches_ccusage(tmp_path: Path) -> None:
    """The Codex fixture is built from the format's documentation; ccusage's Codex reader is
    an independent reading of the same format."""
    assert BINARY is not None
    shutil.copytree(ROOT / "tests" / "fixtures" / "audit" / "codex", tmp_path / "sessions")
    env = dict(os.environ, CODEX_HOME=str(tmp_path))
    p = subprocess.run(
        [str(BINARY), "codex", "session", "--json", "--offline"],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert p.returncode == 0, p.stderr
    theirs = json.loads(p.stdout)["totals"]
    found = discover([tmp_path / "sessions"])
    mine = build(analyse_all(found.refs, PriceBook(), jobs=1)).to_json()["totals"]
    u = mine["usage"]
    assert (
        theirs["inputTokens"],
        theirs["cacheReadTokens"],
        theirs["outputTokens"],
        theirs["reasoningOutputTokens"],
    ) == (
        u["uncached_input_tokens"],
        u["cache_read_tokens"],
        u["output_tokens"],
        u["reasoning_tokens"],
    )
    assert float(Decimal(mine["cost_usd"])) == pytest.approx(theirs["costUSD"], rel=0.01)

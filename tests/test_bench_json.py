"""``bench/*.py --json``: stdout is exactly one JSON document; tables and progress go to
stderr (issue 35: some printed their table first)."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from sandbox_helpers import needs_bwrap

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "bench"
SCRIPTS = sorted(p for p in BENCH.glob("*.py") if not p.name.startswith("_"))


def _takes_json(tree: ast.Module) -> bool:
    return any(
        isinstance(n, ast.Call)
        and isinstance(n.func, ast.Attribute)
        and n.func.attr == "add_argument"
        and any(isinstance(a, ast.Constant) and a.value == "--json" for a in n.args)
        for n in ast.walk(tree)
    )


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_every_bench_script_writes_its_json_through_json_only(script: Path) -> None:
    """Every script with --json calls ``json_only`` (which points stdout at stderr for all
    but the one document) and prints no JSON of its own to stdout."""
    tree = ast.parse(script.read_text())
    assert _takes_json(tree), f"{script.name} has no --json"
    calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call)]
    assert any(isinstance(c.func, ast.Name) and c.func.id == "json_only" for c in calls)
    for c in calls:
        if isinstance(c.func, ast.Name) and c.func.id == "print" and c.args:
            first = c.args[0]
            dumps = (
                isinstance(first, ast.Call)
                and isinstance(first.func, ast.Attribute)
                and first.func.attr == "dumps"
            )
            to_file = any(k.arg == "file" for k in c.keywords)
            assert not dumps or to_file, f"{script.name}:{c.lineno} prints JSON to stdout"


def test_json_only_leaves_one_document_on_stdout(tmp_path: Path) -> None:
    """print(), a child process and the document: only the document reaches stdout."""
    program = (
        "import subprocess, sys\n"
        f"sys.path.insert(0, {str(BENCH)!r})\n"
        "from _stdout import json_only\n"
        "emit = json_only(True)\n"
        "print('a table row')\n"
        "subprocess.run(['echo', 'a child line'])\n"
        "emit({'figure': 1})\n"
    )
    r = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout) == {"figure": 1}
    assert "a table row" in r.stderr and "a child line" in r.stderr


@needs_bwrap
def test_the_sandbox_bench_with_json_prints_only_its_document(tmp_path: Path) -> None:
    """Before: its exec table, then the JSON line."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    r = subprocess.run(
        [sys.executable, str(BENCH / "sandbox.py"), "--runs", "2", "--exec-only", "--json"],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)  # the whole of stdout
    assert doc["runs"] == 2 and "exec" in doc
    assert "p50" in r.stderr  # the table went to stderr

"""The CLI keeps its contracts on Typer's public API alone (issue 36): with every import of
a private Typer module (``typer._click``, ``typer._coercion``, …) refused to stayer's own
modules, bad input is still one line and exit 2, help is still help, and commands run."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

# Runs the CLI with ``__import__`` refusing stayer a private Typer module.
GUARDED_CLI = """
import builtins, sys
real = builtins.__import__

def guarded(name, globals=None, locals=None, fromlist=(), level=0):
    importer = (globals or {}).get("__name__") or ""
    if importer.startswith("stayer") and level == 0 and name.split(".")[0] == "typer":
        parts = name.split(".")[1:] + [f for f in fromlist or () if name == "typer"]
        if any(p.startswith("_") for p in parts):
            raise ImportError(f"{importer} imports a private part of Typer: {name} {fromlist}")
    return real(name, globals, locals, fromlist, level)

builtins.__import__ = guarded
sys.argv = ["stayer", *sys.argv[1:]]
from stayer.cli import main
main()
"""


def guarded_cli(*args: str, home: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "STAYER_HOME": str(home), "PYTHONPATH": str(ROOT), "COLUMNS": "80"}
    return subprocess.run(
        [sys.executable, "-c", GUARDED_CLI, *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=home.parent,
        timeout=300,
    )


@pytest.mark.parametrize(
    ("args", "names"),
    [
        (["runs", "--limit", "ten"], "--limit"),
        (["runs", "--no-such-flag"], "--no-such-flag"),
        (["no-such-command"], "no-such-command"),
        (["sandbox", "--bogus"], "--bogus"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(tmp_path: Path, args: list[str], names: str) -> None:
    p = guarded_cli(*args, home=tmp_path / "home")
    assert p.returncode == 2, p.stderr[-2000:]
    lines = p.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and names in lines[0], p.stderr
    assert p.stdout == ""


def test_help_and_a_command_run(tmp_path: Path) -> None:
    top = guarded_cli("--help", home=tmp_path / "home")
    assert top.returncode == 0, top.stderr[-2000:]
    assert "Commands" in top.stdout and "runs " in top.stdout
    bare = guarded_cli(home=tmp_path / "home")  # no arguments: the help, exit 2
    assert bare.returncode == 2 and "Commands" in bare.stderr and "error" not in bare.stderr
    runs = guarded_cli("runs", "--limit", "3", "--json", home=tmp_path / "home")
    assert runs.returncode == 0, runs.stderr[-2000:]
    assert runs.stdout.startswith(("[", "{"))

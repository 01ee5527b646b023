"""Which bwrap runs the sandbox, and ``stayer doctor``: a fresh machine works without apt."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from stayer.sandbox.locate import bundled_bwrap, choose_bwrap

ROOT = Path(__file__).resolve().parent.parent
linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="bwrap is Linux-only")


def stayer(*args: str, env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess:
    full_env = {
        k: v for k, v in os.environ.items() if not k.endswith("_API_KEY") and k != "STAYER_BWRAP"
    }
    full_env.update(env)
    return subprocess.run(
        [sys.executable, "-m", "stayer.cli", *args],
        capture_output=True,
        text=True,
        env=full_env,
        cwd=cwd,
        timeout=300,
    )


def path_without_bwrap() -> str:
    """``$PATH`` less every directory that holds a ``bwrap``: a machine without bubblewrap."""
    dirs = os.environ.get("PATH", "").split(os.pathsep)
    return os.pathsep.join(d for d in dirs if d and not os.path.exists(os.path.join(d, "bwrap")))


def fake_system_bwrap(directory: Path, version: str) -> Path:
    """A ``bwrap`` on PATH that reports ``version`` (it is never asked to do more here)."""
    directory.mkdir(parents=True, exist_ok=True)
    fake = directory / "bwrap"
    fake.write_text(f'#!/bin/sh\necho "bubblewrap {version}"\n')
    fake.chmod(0o755)
    return fake


@linux_only
def test_bundled_bwrap_is_installed_with_stayer() -> None:
    # A dependency on Linux (pyproject), so a fresh `pip install` has a sandbox.
    assert bundled_bwrap() is not None


@linux_only
def test_readme_command_1_runs_without_system_bwrap(tmp_path: Path) -> None:
    env = {"PATH": path_without_bwrap(), "STAYER_HOME": str(tmp_path / "home")}
    r = stayer(
        "run",
        str(ROOT / "examples" / "hello-file"),
        "--model",
        "sim:claude-sonnet-4-5",
        "--json",
        env=env,
        cwd=tmp_path,
    )
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["status"] == "succeeded"
    # and it was the bundled bwrap that ran it
    d = stayer("doctor", "--json", env=env, cwd=tmp_path)
    bwrap = next(c for c in json.loads(d.stdout)["checks"] if c["name"] == "bwrap")
    assert bwrap["ok"] and bwrap["detail"].startswith("bundled "), bwrap


@linux_only
def test_a_newer_system_bwrap_wins_an_older_one_does_not(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.delenv("STAYER_BWRAP", raising=False)
    newer = fake_system_bwrap(tmp_path / "newer", "99.1.0")
    monkeypatch.setenv("PATH", str(newer.parent))
    choice = choose_bwrap()
    assert choice is not None
    assert (choice.source, choice.path, choice.version) == ("system", str(newer), (99, 1, 0))

    older = fake_system_bwrap(tmp_path / "older", "0.1.0")
    monkeypatch.setenv("PATH", str(older.parent))
    choice = choose_bwrap()
    assert choice is not None and choice.source == "bundled" and choice.path == bundled_bwrap()


@linux_only
def test_configured_bwrap_is_used_as_given(tmp_path: Path, monkeypatch) -> None:
    older = fake_system_bwrap(tmp_path / "older", "0.1.0")
    monkeypatch.setenv("PATH", str(older.parent))
    monkeypatch.setenv("STAYER_BWRAP", "system")
    choice = choose_bwrap()
    assert choice is not None and (choice.source, choice.path) == ("STAYER_BWRAP", str(older))
    monkeypatch.setenv("STAYER_BWRAP", str(tmp_path / "nowhere" / "bwrap"))
    choice = choose_bwrap()
    assert choice is not None and choice.path == str(tmp_path / "nowhere" / "bwrap")
    assert choice.version is None


def test_doctor_reports_every_check_as_json(tmp_path: Path) -> None:
    r = stayer("doctor", "--json", env={"STAYER_HOME": str(tmp_path / "home")}, cwd=tmp_path)
    doc = json.loads(r.stdout)
    names = [c["name"] for c in doc["checks"]]
    assert names[:5] == ["bwrap", "user namespaces", "journal", "price data", "tokenizer"]
    assert any(n.startswith("extra [") for n in names)
    assert r.returncode == (0 if doc["ok"] else 1)
    for c in doc["checks"]:
        assert set(c) == {"name", "ok", "required", "detail", "fix"}
        assert c["ok"] or c["fix"], c  # every problem says what to do
    journal = next(c for c in doc["checks"] if c["name"] == "journal")
    assert journal["ok"] and "WAL" in journal["detail"]
    assert not (tmp_path / "home").exists()  # a check, not a set-up


def test_doctor_fails_with_what_to_do(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    env = {"STAYER_HOME": str(blocker / "home"), "STAYER_BWRAP": str(tmp_path / "no-bwrap")}
    r = stayer("doctor", env=env, cwd=tmp_path)
    assert r.returncode == 1
    lines = r.stdout.splitlines()
    fails = [line for line in lines if line.startswith("FAIL")]
    assert [f.split()[1] for f in fails] == ["bwrap", "journal"], r.stdout
    # each FAIL line is followed by what to do about it
    for f in fails:
        assert lines[lines.index(f) + 1].lstrip().startswith("→")
    assert "unset it to use the default" in r.stdout
    assert "set STAYER_HOME to a writable directory" in r.stdout
    assert "not ready" in r.stdout

"""tests/leftovers.py, which .ci/run calls on a kept machine: a killed run's directories go,
a live one's and anything not the suite's stay, and no link is followed."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from leftovers import sweep

HERE = Path(__file__).parent


def _gone_pid() -> int:
    """A pid no process can have: above the kernel's largest."""
    return int(Path("/proc/sys/kernel/pid_max").read_text()) + 1


def _dir(top: Path, name: str, files: dict[str, str]) -> Path:
    d = top / name
    for rel, text in files.items():
        (d / rel).parent.mkdir(parents=True, exist_ok=True)
        (d / rel).write_text(text)
    return d


def test_a_dead_runs_directories_go_and_live_ones_stay(tmp_path: Path) -> None:
    dead, live = str(_gone_pid()), str(os.getpid())
    top = tmp_path / "tmp"
    top.mkdir()
    gone = [
        _dir(top, "stayer-ci-pg.abc123", {"data/postmaster.pid": f"{dead}\n/x\n", "x": "1"}),
        _dir(top, "stayer-pg-stopped", {"data/PG_VERSION": "15\n"}),  # stopped: no pid file
        _dir(top, "stayer-dockerd-k1", {"dockerd.pid": dead, "data/layer": "x" * 1000}),
        _dir(top, f"stayer-test-workspaces-{dead}-q", {"run/ws/f": "x"}),
    ]
    kept = [
        _dir(top, "stayer-pg-running", {"data/postmaster.pid": f"{live}\n"}),
        _dir(top, "stayer-dockerd-up", {"dockerd.pid": live}),
        _dir(top, f"stayer-test-workspaces-{live}-w", {"f": "x"}),
        _dir(top, "stayer-test-venv-z", {"f": "x"}),  # no way to tell: not touched
        _dir(top, "stayer-something-else", {"f": "x"}),
        _dir(top, "other-pg-data", {"data/postmaster.pid": dead}),
    ]
    outside = _dir(tmp_path, "precious", {"data/postmaster.pid": dead})
    (top / "stayer-pg-link").symlink_to(outside, target_is_directory=True)

    removed = sweep(top)

    assert sorted(p for p, _ in removed) == sorted(gone)
    assert dict(removed)[gone[2]] == len(dead) + 1000  # the bytes it held
    assert not any(p.exists() for p in gone)
    assert all(p.is_dir() for p in kept)
    assert (outside / "data" / "postmaster.pid").is_file()  # the link was not followed
    assert (top / "stayer-pg-link").is_symlink()


def test_the_script_says_what_it_removed(tmp_path: Path) -> None:
    _dir(tmp_path, "stayer-pg-old", {"data/postmaster.pid": f"{_gone_pid()}\n"})
    r = subprocess.run(
        [sys.executable, str(HERE / "leftovers.py"), str(tmp_path)], capture_output=True, text=True
    )
    assert r.returncode == 0, r.stderr
    assert f"leftovers: removed {tmp_path / 'stayer-pg-old'} (0.0 MB)" in r.stdout
    assert r.stdout.endswith("leftovers: 1 removed, 0.0 MB freed\n")
    assert not (tmp_path / "stayer-pg-old").exists()


@pytest.mark.parametrize("text", ["", "not a pid\n", "-1\n", "0\n"])
def test_a_pid_file_that_names_no_pid_counts_as_gone(tmp_path: Path, text: str) -> None:
    d = _dir(tmp_path, "stayer-dockerd-x", {"dockerd.pid": text})
    assert [p for p, _ in sweep(tmp_path)] == [d]

"""``stayer sandbox exec`` through the real command line."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from sandbox_helpers import needs_bwrap
from typer.testing import CliRunner

from stayer.errors import ConfigError

KEYS = {"exit_code", "stdout", "stderr", "timed_out", "truncated", "duration_s"}


def stayer(
    *args: str, cwd: Path | None = None, tmpdir: Path | None = None
) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.endswith("_API_KEY")}
    if tmpdir is not None:  # where the command's scratch workspace goes (TMPDIR)
        env["TMPDIR"] = str(tmpdir)
    return subprocess.run(
        [sys.executable, "-m", "stayer.cli", "sandbox", "exec", *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=cwd,
        timeout=120,
    )


def doc(proc: subprocess.CompletedProcess) -> dict:
    d = json.loads(proc.stdout)  # exactly one JSON document on stdout
    assert set(d) == KEYS
    return d


@needs_bwrap
def test_json_report_and_exit_codes(tmp_path: Path) -> None:
    ok = stayer("--json", "--", "printf", "%s\\n", "a b", "$HOME")
    assert ok.returncode == 0, ok.stderr
    d = doc(ok)
    # Several words are one command, quoted word by word: no expansion of "$HOME".
    assert d["stdout"] == "a b\n$HOME\n" and d["exit_code"] == 0
    assert d["timed_out"] is False and d["truncated"] is False and d["duration_s"] > 0

    failed = stayer("--json", "echo oops >&2; exit 3")  # one word: a shell script
    assert failed.returncode == 3  # the command's own exit code
    d = doc(failed)
    assert d["exit_code"] == 3 and d["stderr"] == "oops\n"

    slow = stayer("--json", "--timeout", "1", "sleep 30 & sleep 30")
    assert slow.returncode == 124  # as timeout(1)
    d = doc(slow)
    # Killed at its timeout (that the background sleep dies with it is tests/test_sandbox.py's).
    assert d["timed_out"] is True

    chatty = stayer("--json", "yes | head -c 5000000")
    d = doc(chatty)
    assert chatty.returncode == 0 and d["truncated"] is True and len(d["stdout"]) < 1_100_000


@needs_bwrap
def test_plain_output_passes_the_streams_through(tmp_path: Path) -> None:
    p = stayer("--workspace", str(tmp_path), "pwd; echo made > out.txt; echo err >&2")
    assert p.returncode == 0
    assert p.stdout == "/app\n"
    assert p.stderr.startswith("err\n") and "exit code 0" in p.stderr
    assert (tmp_path / "out.txt").read_text() == "made\n"  # --workspace is /app, read-write


@needs_bwrap
def test_a_timed_out_command_says_the_exit_code_it_exits_with() -> None:
    """Before: "exit code 137" printed, 124 returned."""
    p = stayer("--timeout", "1", "sleep 30")
    assert p.returncode == 124
    note = " ".join(p.stderr.split())
    assert "exit code 124 ·" in note and "exit code 137" not in note
    assert "timed out after 1 s" in note


@needs_bwrap
def test_default_workspace_is_fresh_and_removed(tmp_path: Path) -> None:
    # A private TMPDIR: other tests running beside this one make scratch workspaces too.
    # (tempfile.mkdtemp honours TMPDIR, so the scratch workspace is made in tmp_path.)
    p = stayer("--json", "ls -A /app; touch /app/x", tmpdir=tmp_path)
    assert p.returncode == 0 and doc(p)["stdout"] == ""
    assert list(tmp_path.iterdir()) == []


@needs_bwrap
def test_limit_flags(tmp_path: Path) -> None:
    with socket.socket() as srv:
        srv.bind(("127.0.0.1", 0))
        srv.listen(4)
        probe = f"exec 3<>/dev/tcp/127.0.0.1/{srv.getsockname()[1]} && echo connected"
        assert doc(stayer("--json", probe))["stdout"] == ""
        assert doc(stayer("--json", "--allow-net", probe))["stdout"] == "connected\n"
    d = doc(stayer("--json", "--memory", "128", "python3 -c 'bytearray(1 << 30)'"))
    assert d["exit_code"] != 0 and "MemoryError" in d["stderr"]
    d = doc(stayer("--json", "--max-file-mb", "1", "head -c 3000000 /dev/zero > /app/f"))
    assert d["exit_code"] == 153
    d = doc(stayer("--json", "--storage-mb", "5", "df -k --output=size /tmp | tail -1"))
    assert d["stdout"].strip() == str(5 * 1024)


def test_local_only_by_name(tmp_path: Path) -> None:
    p = stayer("--json", "--sandbox", "local", "--workspace", str(tmp_path), "pwd")
    assert p.returncode == 0 and doc(p)["stdout"] == f"{tmp_path.resolve()}\n"


@pytest.mark.parametrize(
    ("args", "names"),
    [
        (["--workspace", "/nonexistent/dir", "true"], "--workspace"),
        (["--timeout", "0", "true"], "--timeout"),
        (["--memory", "-5", "true"], "--memory"),
        (["--sandbox", "docker", "true"], "--sandbox"),
    ],
)
def test_bad_input_is_exit_2_with_one_line(args: list[str], names: str) -> None:
    p = stayer("--json", *args)
    assert p.returncode == 2 and p.stdout == ""
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and names in lines[0]


def test_no_bubblewrap_says_how_to_fix_it(monkeypatch) -> None:
    import stayer.sandbox.bwrap as bwrap
    from stayer.cli import app

    def unavailable() -> str:
        raise ConfigError("sandbox: bwrap (bubblewrap) not found on PATH; " + bwrap._FIX)

    monkeypatch.setattr(bwrap, "check_bwrap", unavailable)
    result = CliRunner().invoke(app, ["sandbox", "exec", "--json", "true"])
    assert result.exit_code == 2
    assert "install bubblewrap" in result.output and "--sandbox local" in result.output
    assert "{" not in result.output  # no half-written JSON

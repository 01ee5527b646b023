"""The sandbox contains what it claims to contain, and its limits hold.

Each isolation test states a concrete escape and checks that it fails; where it matters a
positive control shows the probe itself works (e.g. the network probe connects when the
network is allowed), so a broken probe cannot pass as isolation.
"""

from __future__ import annotations

import asyncio
import os
import resource
import socket
import time
import uuid
from pathlib import Path

import pytest

from stayer.errors import ConfigError
from stayer.sandbox import make_sandbox
from stayer.sandbox.base import Mount
from stayer.sandbox.local import LocalSandbox
from stayer.sandbox.process import pids_cgroup_parent

try:
    from stayer.sandbox.bwrap import BwrapSandbox, check_bwrap

    check_bwrap()
    _NO_BWRAP = ""
except ConfigError as e:  # pragma: no cover - depends on the machine
    _NO_BWRAP = str(e)

needs_bwrap = pytest.mark.skipif(bool(_NO_BWRAP), reason=f"bwrap unavailable: {_NO_BWRAP}")


def run(coro):
    return asyncio.run(coro)


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    d = tmp_path / "ws"
    d.mkdir()
    return d


def _procs_with(marker: str) -> list[int]:
    """Host pids whose command line contains ``marker``."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            cmd = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ")
            state = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if marker.encode() in cmd and state != "Z":
            found.append(int(entry))
    return found


def _wait_gone(marker: str, within: float = 2.0) -> list[int]:
    deadline = time.monotonic() + within
    while (left := _procs_with(marker)) and time.monotonic() < deadline:
        time.sleep(0.05)
    return left


# ----------------------------------------------------------------------------- factory


def test_make_sandbox_unknown_kind(ws: Path) -> None:
    with pytest.raises(ConfigError, match="unknown sandbox 'docker'"):
        make_sandbox("docker", ws)


def test_missing_bwrap_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="--sandbox local"):
        check_bwrap("/nonexistent/bwrap")


def test_workspace_must_exist(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="not a directory"):
        make_sandbox("local", tmp_path / "missing")


# ----------------------------------------------------------------------------- bwrap


@needs_bwrap
def test_workspace_is_app_read_write(ws: Path) -> None:
    (ws / "given.txt").write_text("from host\n")
    sb = BwrapSandbox(ws)
    r = run(sb.exec("pwd; cat given.txt; echo made > /app/made.txt; exit 3"))
    assert r.exit_code == 3
    assert r.stdout == "/app\nfrom host\n"
    assert (ws / "made.txt").read_text() == "made\n"
    assert not r.timed_out and not r.truncated and r.duration_s > 0


@needs_bwrap
def test_writes_outside_app_fail(ws: Path) -> None:
    sb = BwrapSandbox(ws)
    for target in ("/usr/x", "/x", "/root/x", "/etc/x"):
        r = run(sb.exec(f"echo pwned > {target}"))
        assert r.exit_code != 0, target
    assert not Path("/usr/x").exists() and not Path("/x").exists()
    r = run(sb.exec("echo ok > /tmp/scratch && cat /tmp/scratch"))  # private tmpfs is writable
    assert r.stdout == "ok\n"


@needs_bwrap
def test_host_tmp_home_and_cwd_are_invisible(ws: Path, tmp_path: Path, monkeypatch) -> None:
    secret = Path("/tmp") / f"stayer-secret-{uuid.uuid4().hex}"
    secret.write_text("secret")
    home = tmp_path / "home"
    home.mkdir()
    (home / ".netrc").write_text("password hunter2")
    monkeypatch.setenv("HOME", str(home))
    try:
        sb = BwrapSandbox(ws)
        for path in (secret, home / ".netrc", Path.cwd() / "pyproject.toml", "/root", "/home"):
            r = run(sb.exec(f"test -e {path}"))
            assert r.exit_code == 1, f"{path} is visible in the sandbox"
        r = run(sb.exec("echo $HOME; ls -A /tmp"))
        assert r.stdout == "/tmp\n"
    finally:
        secret.unlink()


@needs_bwrap
def test_host_env_is_not_inherited(ws: Path, monkeypatch) -> None:
    monkeypatch.setenv("STAYER_TEST_SECRET", "hunter2")
    sb = BwrapSandbox(ws, env={"GIVEN": "yes"})
    r = run(sb.exec("env"))
    assert "hunter2" not in r.stdout
    env = dict(line.split("=", 1) for line in r.stdout.splitlines() if "=" in line)
    assert env["GIVEN"] == "yes"
    assert env["PATH"] == "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
    assert env["HOME"] == "/tmp" and env["LANG"] == "C.UTF-8" and env["TERM"] == "dumb"


@needs_bwrap
def test_no_network_unless_allowed(ws: Path) -> None:
    with socket.socket() as srv:
        srv.bind(("127.0.0.1", 0))
        srv.listen(4)
        port = srv.getsockname()[1]
        probe = f"exec 3<>/dev/tcp/127.0.0.1/{port} && echo connected"
        r = run(BwrapSandbox(ws).exec(probe, timeout=10))
        assert r.exit_code != 0 and "connected" not in r.stdout
        # Positive control: the same probe does connect when the network is shared.
        r = run(BwrapSandbox(ws, allow_net=True).exec(probe, timeout=10))
        assert r.stdout == "connected\n", r.stderr


@needs_bwrap
def test_timeout_kills_background_children(ws: Path) -> None:
    marker = f"1000.{uuid.uuid4().int % 10**6:06d}"
    sb = BwrapSandbox(ws)
    t0 = time.monotonic()
    r = run(sb.exec(f"sleep {marker} & sleep {marker}", timeout=1))
    assert time.monotonic() - t0 < 3
    assert r.timed_out and r.exit_code != 0
    assert _wait_gone(marker) == []


@needs_bwrap
def test_background_child_does_not_outlive_a_finished_command(ws: Path) -> None:
    marker = f"1000.{uuid.uuid4().int % 10**6:06d}"
    r = run(BwrapSandbox(ws).exec(f"sleep {marker} > /dev/null 2>&1 & echo started", timeout=10))
    assert r.stdout == "started\n" and r.duration_s < 3
    assert _wait_gone(marker) == []


@needs_bwrap
def test_output_cap_keeps_head_and_tail_in_bounded_memory(ws: Path) -> None:
    sb = BwrapSandbox(ws, max_output_bytes=100_000)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    r = run(sb.exec("echo START; yes | head -c 50000000; echo; echo END", timeout=30))
    grown_mb = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024
    assert r.exit_code == 0 and r.truncated
    assert r.stdout.startswith("START\ny\n") and r.stdout.endswith("y\n\nEND\n")
    assert "bytes dropped" in r.stdout and len(r.stdout) < 100_200
    assert grown_mb < 40  # 50 MB went through the pipe; it was not kept


@needs_bwrap
def test_memory_limit(ws: Path) -> None:
    sb = BwrapSandbox(ws, memory_mb=256)
    r = run(sb.exec("python3 -c 'x = bytearray(2 * 1024**3)'", timeout=20))
    assert r.exit_code != 0 and "MemoryError" in r.stderr
    r = run(sb.exec("python3 -c 'x = bytearray(32 * 1024**2); print(len(x))'", timeout=20))
    assert r.stdout == f"{32 * 1024**2}\n"


_FORK_PROBE = """python3 - <<'EOF'
import os, time
n = 0
try:
    while n < 200:
        if os.fork() == 0:
            time.sleep(5)
            os._exit(0)
        n += 1
except OSError:
    pass
print(n)
EOF"""


@needs_bwrap
@pytest.mark.skipif(
    pids_cgroup_parent() is None and os.geteuid() == 0,
    reason="max_processes is not enforceable here: root and no writable pids cgroup",
)
def test_process_limit(ws: Path) -> None:
    r = run(BwrapSandbox(ws, max_processes=20).exec(_FORK_PROBE, timeout=20))
    assert r.exit_code == 0, r.stderr
    assert 5 <= int(r.stdout) < 20
    r = run(BwrapSandbox(ws).exec(_FORK_PROBE, timeout=20))
    assert int(r.stdout) == 200  # control: without the limit the probe is not capped


@needs_bwrap
def test_mounts_ro_and_rw(ws: Path, tmp_path: Path) -> None:
    tests, logs = tmp_path / "tests", tmp_path / "logs"
    tests.mkdir()
    logs.mkdir()
    (tests / "test.sh").write_text("echo 1 > /logs/verifier/reward.txt\n")
    sb = BwrapSandbox(ws)
    mounts = (Mount(str(tests), "/tests"), Mount(str(logs), "/logs/verifier", writable=True))
    r = run(sb.exec("bash /tests/test.sh && touch /tests/x", mounts=mounts, cwd="/tests"))
    assert r.exit_code != 0 and "Read-only" in r.stderr
    assert (logs / "reward.txt").read_text() == "1\n"
    assert not (tests / "x").exists()


@needs_bwrap
def test_stdin_and_undecodable_output(ws: Path) -> None:
    sb = BwrapSandbox(ws)
    assert run(sb.exec("cat", stdin=b"hello")).stdout == "hello"
    r = run(sb.exec("true", stdin=b"x" * 3_000_000, timeout=10))  # unread stdin: no hang
    assert r.exit_code == 0 and not r.timed_out
    r = run(sb.exec("printf 'a\\377b'"))
    assert r.stdout == "a\ufffdb"
    assert run(sb.exec("cat")).stdout == ""  # no stdin given: EOF, not a hang


# ----------------------------------------------------------------------------- local


def test_local_runs_in_workspace_with_app_mapped(ws: Path) -> None:
    (ws / "sub").mkdir()
    sb = LocalSandbox(ws)
    r = run(sb.exec('pwd; echo "$APP"', cwd="/app/sub"))
    assert r.stdout == f"{ws / 'sub'}\n{ws}\n"
    r = run(sb.exec("true", cwd="/app/missing"))
    assert r.exit_code != 0 and "no such directory" in r.stderr


def test_local_refuses_mounts(ws: Path) -> None:
    with pytest.raises(ConfigError, match="cannot mount /tests"):
        run(LocalSandbox(ws).exec("true", mounts=(Mount(str(ws), "/tests"),)))


def test_local_does_not_pass_through_secrets(ws: Path, monkeypatch) -> None:
    monkeypatch.setenv("STAYER_TEST_SECRET", "hunter2")
    assert "hunter2" not in run(LocalSandbox(ws).exec("env")).stdout


def test_local_timeout_kills_background_children(ws: Path) -> None:
    marker = f"1000.{uuid.uuid4().int % 10**6:06d}"
    t0 = time.monotonic()
    r = run(LocalSandbox(ws).exec(f"sleep {marker} & sleep {marker}", timeout=1))
    assert time.monotonic() - t0 < 3
    assert r.timed_out
    assert _wait_gone(marker) == []


def test_local_output_cap(ws: Path) -> None:
    r = run(LocalSandbox(ws, max_output_bytes=1000).exec("seq 1 100000 >&2", timeout=10))
    assert r.truncated and r.stderr.startswith("1\n2\n") and r.stderr.endswith("100000\n")
    assert len(r.stderr) < 1100


def test_local_straggler_holding_the_pipe_is_not_a_timeout(ws: Path, monkeypatch) -> None:
    import stayer.sandbox.process as process

    monkeypatch.setattr(process, "pids_cgroup_parent", lambda: None)  # worst case: no cgroup
    marker = f"1000.{uuid.uuid4().int % 10**6:06d}"
    try:
        r = run(LocalSandbox(ws).exec(f"setsid sleep {marker} & echo hi", timeout=10))
        assert r.stdout == "hi\n" and not r.timed_out and r.duration_s < 3
    finally:
        for pid in _procs_with(marker):
            os.kill(pid, 9)


@pytest.mark.skipif(pids_cgroup_parent() is None, reason="no writable pids cgroup here")
def test_local_setsid_escapee_is_killed_via_the_cgroup(ws: Path) -> None:
    marker = f"1000.{uuid.uuid4().int % 10**6:06d}"
    r = run(LocalSandbox(ws).exec(f"setsid sleep {marker} > /dev/null 2>&1 & echo hi", timeout=10))
    assert r.stdout == "hi\n" and not r.timed_out
    assert _wait_gone(marker) == []

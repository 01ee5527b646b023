"""The sandbox contains what it claims to contain, and its limits hold.

Each isolation test states a concrete escape and checks that it fails; where it matters a
positive control shows the probe itself works (e.g. the network probe connects when the
network is allowed), so a broken probe cannot pass as isolation.
"""

from __future__ import annotations

import os
import resource
import shutil
import socket
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from sandbox_helpers import NO_BWRAP as _NO_BWRAP
from sandbox_helpers import count_forks, marker, needs_bwrap, procs_with, run, wait_gone

from stayer.errors import ConfigError
from stayer.sandbox import make_sandbox
from stayer.sandbox.base import ExecResult, Mount
from stayer.sandbox.bwrap import BwrapSandbox, check_bwrap
from stayer.sandbox.local import LocalSandbox
from stayer.sandbox.process import ProcessLimits as Limits
from stayer.sandbox.process import StartGate, pids_cgroup_parent, run_process


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    d = tmp_path / "ws"
    d.mkdir()
    return d


# ----------------------------------------------------------------------------- factory


def test_make_sandbox_unknown_kind(ws: Path) -> None:
    with pytest.raises(ConfigError, match="unknown sandbox 'podman'"):
        make_sandbox("podman", ws)


def test_image_sandboxes_need_a_task(ws: Path) -> None:
    for kind in ("docker", "bwrap-image"):
        with pytest.raises(ConfigError, match=f"--sandbox {kind}: runs a task's image"):
            make_sandbox(kind, ws)


def test_missing_bwrap_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="--sandbox local"):
        check_bwrap("/nonexistent/bwrap")


def test_no_bubblewrap_on_another_platform_says_what_to_do(monkeypatch) -> None:
    import stayer.sandbox.bwrap as bwrap

    monkeypatch.setattr(bwrap, "locate_bwrap", lambda: None)
    monkeypatch.setattr(bwrap.sys, "platform", "darwin")
    with pytest.raises(ConfigError, match="Linux VM or container.*--sandbox local"):
        check_bwrap.__wrapped__()
    monkeypatch.setattr(bwrap.sys, "platform", "linux")
    with pytest.raises(ConfigError, match="apt install bubblewrap.*--sandbox local"):
        check_bwrap.__wrapped__()


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
    mark = marker()
    sb = BwrapSandbox(ws)
    r = run(sb.exec(f"sleep {mark} & sleep {mark}", timeout=1))
    assert r.timed_out and r.exit_code != 0
    assert wait_gone(mark) == []


@needs_bwrap
def test_background_child_does_not_outlive_a_finished_command(ws: Path) -> None:
    mark = marker()
    r = run(BwrapSandbox(ws).exec(f"sleep {mark} > /dev/null 2>&1 & echo started", timeout=10))
    assert r.stdout == "started\n" and r.duration_s < 3
    assert wait_gone(mark) == []


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


@needs_bwrap
@pytest.mark.skipif(
    pids_cgroup_parent() is None and os.geteuid() == 0,
    reason="max_processes is not enforceable here: root and no writable pids cgroup",
)
def test_process_limit(ws: Path) -> None:
    r = run(BwrapSandbox(ws, max_processes=20).exec(count_forks(200), timeout=20))
    assert r.exit_code == 0, r.stderr
    assert 5 <= int(r.stdout) < 20
    r = run(BwrapSandbox(ws).exec(count_forks(200), timeout=20))
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
    mark = marker()
    r = run(LocalSandbox(ws).exec(f"sleep {mark} & sleep {mark}", timeout=1))
    assert r.timed_out
    assert wait_gone(mark) == []


def test_local_output_cap(ws: Path) -> None:
    r = run(LocalSandbox(ws, max_output_bytes=1000).exec("seq 1 100000 >&2", timeout=10))
    assert r.truncated and r.stderr.startswith("1\n2\n") and r.stderr.endswith("100000\n")
    assert len(r.stderr) < 1100


def test_local_straggler_holding_the_pipe_is_not_a_timeout(ws: Path, monkeypatch) -> None:
    import stayer.sandbox.process as process

    monkeypatch.setattr(process, "pids_cgroup_parent", lambda: None)  # worst case: no cgroup
    mark = marker()
    try:
        r = run(LocalSandbox(ws).exec(f"setsid sleep {mark} & echo hi", timeout=10))
        assert r.stdout == "hi\n" and not r.timed_out and r.duration_s < 3
    finally:
        for pid in procs_with(mark):
            os.kill(pid, 9)


@pytest.mark.skipif(pids_cgroup_parent() is None, reason="no writable pids cgroup here")
@needs_bwrap
def test_a_command_cancelled_as_it_starts_leaves_nothing_running(
    ws: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The caller's time limit can fire while asyncio is still starting the process
    (connecting its pipes): the whole sandbox is killed and the caller gets its
    cancellation. Held here at that point: the process exists, the start has not returned."""
    import asyncio

    mark = marker()

    async def scenario() -> None:
        loop = asyncio.get_running_loop()
        real = loop.subprocess_exec
        spawned, finish = asyncio.Event(), asyncio.Event()

        async def slow_start(*args: object, **kwargs: object) -> object:
            started = await real(*args, **kwargs)  # type: ignore[arg-type]
            spawned.set()
            await finish.wait()  # a cancellation lands while the start is under way
            return started

        monkeypatch.setattr(loop, "subprocess_exec", slow_start)
        command = asyncio.create_task(BwrapSandbox(ws).exec(f"sleep {mark}", timeout=600))
        await spawned.wait()
        command.cancel()
        await asyncio.sleep(0)
        finish.set()
        with pytest.raises(asyncio.CancelledError):
            await command

    run(scenario())
    assert wait_gone(mark) == []


def test_local_setsid_escapee_is_killed_via_the_cgroup(ws: Path) -> None:
    mark = marker()
    r = run(LocalSandbox(ws).exec(f"setsid sleep {mark} > /dev/null 2>&1 & echo hi", timeout=10))
    assert r.stdout == "hi\n" and not r.timed_out
    assert wait_gone(mark) == []


# ----------------------------------------------------------------------------- what is hidden


def test_etc_secrets_are_what_other_users_cannot_read(tmp_path: Path) -> None:
    from stayer.sandbox.bwrap import etc_secrets

    etc = tmp_path / "etc"
    (etc / "ssl" / "private").mkdir(parents=True)
    (etc / "ssl" / "private" / "key.pem").write_text("k")
    (etc / "ssl" / "cert.pem").write_text("c")
    (etc / "shadow").write_text("s")
    (etc / "hosts").write_text("h")
    os.chmod(etc / "ssl" / "private", 0o700)
    os.chmod(etc / "shadow", 0o640)
    os.chmod(etc / "hosts", 0o644)
    os.chmod(etc / "ssl" / "cert.pem", 0o644)
    os.symlink("shadow", etc / "shadow-link")  # links are judged where they point
    assert etc_secrets(str(etc)) == (
        (str(etc / "shadow"), False),
        (str(etc / "ssl" / "private"), True),
    )


@pytest.mark.parametrize("inotify", [True, False], ids=["watched", "no-inotify"])
def test_etc_secrets_written_after_the_first_probe_are_found(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, inotify: bool
) -> None:
    """A long-lived process (the server) asks for /etc's secrets before every command: a
    secret written since the last answer (dockerd writing /etc/docker/key.json, a file
    made private by chmod, a private directory) is in the next one, whether inotify
    vouches for the tree in between or, where there is none, the tree is walked again."""
    from stayer.sandbox import bwrap
    from stayer.workspace import watch

    if not inotify:
        monkeypatch.setattr(watch, "_libc", lambda: None)
    monkeypatch.setattr(bwrap, "_ETC_SECRETS", bwrap._SecretsProbe())
    etc = tmp_path / "etc"
    (etc / "docker").mkdir(parents=True)
    (etc / "hosts").write_text("h")
    os.chmod(etc / "hosts", 0o644)
    assert bwrap.etc_secrets(str(etc)) == ()
    assert bwrap.etc_secrets(str(etc)) == ()  # the kept answer

    key = etc / "docker" / "key.json"
    key.write_text("k")
    os.chmod(key, 0o600)
    assert bwrap.etc_secrets(str(etc)) == ((str(key), False),)
    os.chmod(etc / "hosts", 0o600)  # no new entry: only its mode changes
    (etc / "private").mkdir(mode=0o700)
    assert bwrap.etc_secrets(str(etc)) == (
        (str(key), False),
        (str(etc / "hosts"), False),
        (str(etc / "private"), True),
    )
    os.chmod(etc / "hosts", 0o644)
    assert bwrap.etc_secrets(str(etc)) == ((str(key), False), (str(etc / "private"), True))


@needs_bwrap
def test_etc_secrets_are_covered_in_the_sandbox(ws: Path) -> None:
    from stayer.sandbox.bwrap import etc_secrets

    secrets = etc_secrets()
    if not secrets:
        pytest.skip("this host's /etc has nothing unreadable to others")
    probe = "; ".join(f"ls -A {p}" if is_dir else f"cat {p}" for p, is_dir in secrets)
    r = run(BwrapSandbox(ws).exec(probe))
    assert r.stdout == "", r.stdout  # empty directories, unreadable files
    r = run(BwrapSandbox(ws).exec("cat /etc/hosts > /dev/null && cat /etc/passwd | head -1"))
    assert r.exit_code == 0 and r.stdout.startswith("root:")  # the rest of /etc is there


@pytest.fixture
def outside_tmp() -> Iterator[Path]:
    """A scratch directory not under /tmp (which the sandbox's private /tmp covers)."""
    d = Path(tempfile.mkdtemp(dir="/var/tmp" if os.path.isdir("/var/tmp") else None))
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


@needs_bwrap
def test_private_dirs_inside_system_dirs_are_covered(
    ws: Path, outside_tmp: Path, monkeypatch
) -> None:
    """A checkout in /usr/src, a home in /etc...: whatever system directory is mounted, the
    directory stayer runs from, the home directory and $STAYER_HOME stay out of sight."""
    import stayer.sandbox.bwrap as bwrap

    system = outside_tmp
    checkout, home, state = system / "checkout", system / "home", system / "state"
    for d in (checkout, home, state):
        d.mkdir(parents=True)
        (d / "private.txt").write_text("private")
    (system / "public.txt").write_text("public")
    monkeypatch.setattr(bwrap, "SYSTEM_DIRS", (*bwrap.SYSTEM_DIRS, str(system)))
    monkeypatch.chdir(checkout)
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("STAYER_HOME", str(state))
    sb = BwrapSandbox(ws)
    r = run(sb.exec(f"cat {system}/public.txt; ls -A {checkout} {home} {state}; touch {state}/x"))
    assert r.stdout.startswith("public") and "private" not in r.stdout
    assert "Read-only file system" in r.stderr and not (state / "x").exists()


@needs_bwrap
def test_bwrap_command_line_is_not_readable_inside(ws: Path, monkeypatch) -> None:
    import stayer.sandbox.bwrap as bwrap

    probe = "tr '\\0' ' ' < /proc/1/cmdline"
    r = run(BwrapSandbox(ws).exec(probe))
    assert str(ws) not in r.stdout and "--args" in r.stdout
    # Options that do not fit in the pipe are passed on the command line instead.
    monkeypatch.setattr(bwrap, "_options_pipe", lambda options: None)
    r = run(BwrapSandbox(ws).exec(f"{probe}; echo; pwd"))
    assert str(ws) in r.stdout and r.stdout.endswith("\n/app\n")


# ----------------------------------------------------------------------------- size limits


def test_disk_usage_counts_what_is_allocated_once(tmp_path: Path) -> None:
    from stayer.workspace.tree import disk_usage, iter_tree

    root = tmp_path / "root"
    (root / "sub").mkdir(parents=True)
    (root / "sub" / "a").write_bytes(b"x" * 100_000)
    os.link(root / "sub" / "a", root / "hardlink")
    with open(root / "sparse", "wb") as f:
        f.truncate(10**9)
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "big").write_bytes(b"y" * 1_000_000)
    os.symlink(outside, root / "link")
    assert sorted(rel for rel, _ in iter_tree(root)) == [
        "hardlink",
        "link",
        "sparse",
        "sub",
        "sub/a",
    ]
    used = disk_usage(root)
    assert 100_000 <= used < 200_000  # the file once; not the sparse hole, not the link's target
    assert disk_usage(tmp_path / "missing") == 0


@pytest.mark.parametrize("kind", ["bwrap", "local"])
def test_file_size_limit(ws: Path, kind: str) -> None:
    if kind == "bwrap" and _NO_BWRAP:
        pytest.skip(_NO_BWRAP)
    sb = make_sandbox(kind, ws, max_file_mb=1)
    r = run(sb.exec("head -c 5000000 /dev/zero > big", timeout=20))
    assert r.exit_code == 153 and "File size limit exceeded" in r.stderr  # 128 + SIGXFSZ
    assert (ws / "big").stat().st_size == 2**20
    r = run(sb.exec("head -c 500000 /dev/zero > small && wc -c < small", timeout=20))
    assert r.exit_code == 0 and r.stdout == "500000\n"


def test_storage_limit_polls_and_stops_growth_local(ws: Path, monkeypatch) -> None:
    import stayer.sandbox.process as process

    sb = LocalSandbox(ws, storage_mb=10)
    assert sb.limits.max_file_mb == 10  # no single file beyond what the whole may hold
    script = "for i in $(seq 1 200); do head -c 1000000 /dev/zero > f$i; sleep 0.01; done"
    r = run(sb.exec(script, timeout=30))
    assert r.exit_code == 137 and not r.timed_out, r  # killed by the watcher, not the clock
    assert f"[storage limit: {ws} holds" in r.stderr and "limit of 10 MiB" in r.stderr
    assert len(list(ws.iterdir())) < 40
    # Growth that finishes between two polls is still reported, by the check at the end
    # (the first poll comes at once, the next one only after the command is done).
    monkeypatch.setattr(process, "_STORAGE_POLL_MIN_S", 600)
    for f in ws.glob("f*"):
        f.unlink()
    r = run(sb.exec("sleep 1; head -c 9000000 /dev/zero > a; head -c 9000000 /dev/zero > b"))
    assert r.exit_code == 1 and "the command went over it" in r.stderr, r
    r = run(sb.exec("rm a b && echo freed"))
    assert r.exit_code == 0 and r.stdout == "freed\n" and "storage limit" not in r.stderr


@needs_bwrap
def test_tmp_is_a_sized_tmpfs(ws: Path) -> None:
    from stayer.sandbox.bwrap import DEFAULT_TMP_MB

    df = "df -k --output=size /tmp | tail -1"
    assert int(run(BwrapSandbox(ws).exec(df)).stdout) == DEFAULT_TMP_MB * 1024
    assert int(run(BwrapSandbox(ws, storage_mb=50).exec(df)).stdout) == 50 * 1024


def test_task_toml_sets_the_sandbox_limits(tmp_path: Path) -> None:
    from stayer.eval.task import load_task

    task = tmp_path / "task"
    (task / "tests").mkdir(parents=True)
    (task / "instruction.md").write_text("Do it.\n")
    (task / "tests" / "test.sh").write_text("echo 1 > /logs/verifier/reward.txt\n")
    (task / "task.toml").write_text("[environment]\nmemory_mb = 512\nstorage_mb = 64\n")
    t = load_task(task)
    assert (t.memory_mb, t.storage_mb) == (512, 64)
    (task / "task.toml").write_text("[environment]\nstorage_mb = -1\n")
    with pytest.raises(ConfigError, match="environment.storage_mb"):
        load_task(task)


# --- the start gate: limits applied from outside before the command starts -------------


def _gated(script: str, gate: StartGate, limits: Limits) -> ExecResult:
    import asyncio

    try:
        return asyncio.run(
            run_process(
                ["/bin/bash", "-c", script],
                timeout=60,
                limits=limits,
                pass_fds=[gate.child_report, gate.child_release],
                gate=gate,
            )
        )
    finally:
        gate.close()


def test_a_gated_child_gets_its_limits_before_it_is_released(tmp_path: Path) -> None:
    gate = StartGate()
    script = (
        f"printf '{{\"child-pid\": %d}}' $$ >&{gate.child_report}; exec {gate.child_report}>&-; "
        f"read -r -n1 -u {gate.child_release} _; ulimit -f; ulimit -v; cat /proc/self/cgroup"
    )
    r = _gated(script, gate, Limits(memory_mb=512, max_file_mb=3))
    assert r.exit_code == 0, r
    assert r.stdout.split()[:2] == [str(3 * 1024), str(512 * 1024)]
    if pids_cgroup_parent() is not None:
        assert "stayer-" in r.stdout  # it was moved into its own pids cgroup


def test_a_gated_child_that_reports_nothing_usable_is_killed_not_released(tmp_path: Path) -> None:
    """bwrap reads end of file on its block descriptor as a release: a child whose limits
    could not be applied must be dead before the gate closes, so the command never runs."""
    ran = tmp_path / "ran"
    gate = StartGate()
    script = (
        f"echo not-json >&{gate.child_report}; exec {gate.child_report}>&-; "
        f"read -r -n1 -u {gate.child_release} _; touch {ran}"
    )
    r = _gated(script, gate, Limits(max_file_mb=1))
    assert r.exit_code == 137 and not r.timed_out, r
    assert not ran.exists()


def test_a_caller_cancelled_as_the_gate_opens_is_cancelled_and_kills_the_command(
    tmp_path: Path, monkeypatch
) -> None:
    """A run's time limit cancels the command in flight wherever it is. Cancelled at the
    instant the child is released, the call must still end at once with the cancellation
    and take the command with it: ``asyncio.wait_for`` on Python 3.11 returned the gate's
    result instead when both came together, so the command ran on to its end, past the limit."""
    import asyncio

    from stayer.sandbox import process

    mark = marker()
    real = process._confine_and_release

    async def confine_then_cancel(*args, **kwargs):
        opened = await real(*args, **kwargs)
        caller.cancel()  # the limit fires just as the gate opens
        return opened

    monkeypatch.setattr(process, "_confine_and_release", confine_then_cancel)
    gate = StartGate()
    script = (
        f"printf '{{\"child-pid\": %d}}' $$ >&{gate.child_report}; exec {gate.child_report}>&-; "
        f"read -r -n1 -u {gate.child_release} _; exec sleep {mark}"
    )

    async def main() -> str:
        nonlocal caller
        caller = asyncio.ensure_future(
            run_process(
                ["/bin/bash", "-c", script],
                timeout=60,  # the bug's outcome: the command's own time, then a result
                pass_fds=[gate.child_report, gate.child_release],
                gate=gate,
            )
        )
        await asyncio.wait({caller})
        return "cancelled" if caller.cancelled() else f"finished: {caller.result()}"

    caller: asyncio.Future[ExecResult]
    try:
        assert asyncio.run(main()) == "cancelled"
    finally:
        gate.close()
    assert wait_gone(mark, within=30) == []


def test_cgroups_left_by_a_killed_stayer_are_removed_with_what_is_in_them() -> None:
    """A stayer process killed as a sandbox started leaves its cgroup, maybe with a process
    in it that waits for good. The next stayer process removes it; a live maker's stays."""
    import os
    import subprocess
    import uuid

    from stayer.sandbox import process

    parent = process.pids_cgroup_parent()
    if parent is None:
        pytest.skip("no pids cgroup can be made here")
    gone = subprocess.Popen(["true"])
    gone.wait()  # a pid whose process is gone
    ns = os.stat("/proc/self/ns/pid").st_ino
    left = parent / f"stayer-{gone.pid}.{ns}-{uuid.uuid4().hex[:12]}"
    mine = parent / f"stayer-{os.getpid()}.{ns}-{uuid.uuid4().hex[:12]}"
    stuck = subprocess.Popen(["sleep", "1000"])
    try:
        for d in (left, mine):
            d.mkdir()
        (left / "cgroup.procs").write_text(str(stuck.pid))
        process.remove_orphans(parent)
        assert stuck.wait(timeout=60) == -9
        assert not left.exists() and mine.is_dir()
    finally:
        stuck.kill()
        for d in (left, mine):
            if d.exists():
                process._PidsCgroup(d).remove_now()


def test_a_backend_that_cannot_run_here_says_why_and_how_to_fix_it(tmp_path: Path) -> None:
    from stayer.sandbox.docker import check_docker

    fake = tmp_path / "docker"
    fake.write_text("#!/bin/sh\necho 'Cannot connect to the Docker daemon' >&2\nexit 1\n")
    fake.chmod(0o755)
    with pytest.raises(
        ConfigError,
        match=r"^--sandbox docker: no Docker daemon answers "
        r"\(Cannot connect to the Docker daemon\); install Docker",
    ):
        check_docker(str(fake))
    with pytest.raises(ConfigError, match=r"^--sandbox docker: cannot run .*/missing: .*; install"):
        check_docker(str(tmp_path / "missing"))

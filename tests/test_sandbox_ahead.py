"""The sandbox started ahead (``--sandbox bwrap``'s default): a command in it sees exactly
what it would see in a sandbox started for it, nothing lasts from one to the next, and a
sandbox started over a host that changed since, or that died, is not used. The isolation
suites (tests/test_security_sandbox.py, tests/test_sandbox_escapes.py) run over it too."""

from __future__ import annotations

import asyncio
import gc
import os
import shutil
import time
from pathlib import Path

import pytest
from sandbox_helpers import (
    cancel_once_running,
    dropped_holding_locks,
    gone_within,
    marker,
    needs_bwrap,
    run,
    wait_dead,
    wait_gone,
)

from stayer.sandbox.ahead import AheadBwrap
from stayer.sandbox.bwrap import BwrapSandbox

pytestmark = needs_bwrap

# What a command can see of its sandbox: who and where it is, its environment, descriptors,
# limits, mounts, processes, /etc.
PROBE = (
    "echo pid=$$ ppid=$PPID; id; pwd; env | sort; ls -l /proc/self/fd | awk '{print $9, $10, $11}' | sed 's/:\\[[0-9]*\\]//';"
    " ulimit -a; awk '{print $5, $6}' /proc/self/mountinfo | sort;"
    # The processes it sees, counted after ls has read them: in ``ls /proc | grep -c``
    # grep is, or under load is not yet, started when ls reads /proc (3 or 4).
    " p=$(ls /proc); echo \"$p\" | grep -c '^[0-9]';"
    " ls -A /tmp; stat -c '%a %U' /tmp /app; md5sum /etc/passwd; cat /proc/self/status | grep -E '^(Cap|NoNewPrivs|Seccomp)'"
)


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    d = tmp_path / "ws"
    d.mkdir()
    return d


def primed(ws: Path, **kw: object) -> BwrapSandbox:
    """A sandbox whose next command runs in a sandbox started ahead for it."""
    sb = BwrapSandbox(ws, **kw)  # type: ignore[arg-type]
    assert run(sb.exec("true")).exit_code == 0
    assert isinstance(sb._kept_box, AheadBwrap) and sb._kept_box._next is not None
    return sb


def spare_pid(sb: BwrapSandbox) -> int:
    """bwrap's host pid in the sandbox started ahead (waiting until it is started)."""
    box = sb._kept_box
    assert isinstance(box, AheadBwrap) and box._next is not None
    return box._next.result(timeout=60).proc.pid


def test_a_command_sees_what_it_would_in_a_sandbox_started_for_it(ws: Path) -> None:
    cold = BwrapSandbox(ws, ahead=False)
    ahead = primed(ws)
    pid = spare_pid(ahead)
    got_cold = run(cold.exec(PROBE))
    got_ahead = run(ahead.exec(PROBE))
    assert spare_pid(ahead) != pid  # it ran in the one started ahead
    assert got_cold.exit_code == got_ahead.exit_code == 0, (got_cold, got_ahead)
    assert got_ahead.stdout == got_cold.stdout
    assert got_ahead.stderr == got_cold.stderr
    assert "pid=2 ppid=1\n" in got_ahead.stdout


def test_the_command_runs_in_the_sandbox_started_ahead_and_the_next_starts(ws: Path) -> None:
    sb = primed(ws)
    box = sb._kept_box
    assert isinstance(box, AheadBwrap)
    pid = spare_pid(sb)
    used: list[int] = []
    run_in = box._run

    async def recorded(ahead, *rest):  # type: ignore[no-untyped-def]
        used.append(ahead.proc.pid)
        return await run_in(ahead, *rest)

    box._run = recorded  # type: ignore[method-assign]
    r = run(sb.exec("echo $$ $PPID"))
    assert (r.exit_code, r.stdout, used) == (0, "2 1\n", [pid]), r
    assert not Path(f"/proc/{pid}").exists()  # killed and reaped with its command
    assert spare_pid(sb) not in (pid, None)


def test_stdin_is_the_commands_or_dev_null(ws: Path) -> None:
    sb = primed(ws)
    r = run(sb.exec("readlink /proc/self/fd/0; cat", stdin=b"fed\n"))
    assert r.stdout.startswith("pipe:") and r.stdout.endswith("fed\n"), r
    r = run(sb.exec("readlink /proc/self/fd/0; cat"))
    assert r.stdout == "/dev/null\n", r


def test_nothing_lasts_from_one_command_to_the_next(ws: Path) -> None:
    sb = primed(ws)
    mark = marker()
    r = run(sb.exec(f"echo x > /tmp/left; (setsid sleep {mark} &) ; echo started"))
    assert r.stdout == "started\n", r
    assert wait_gone(mark) == []
    r = run(sb.exec("ls -A /tmp"))
    assert (r.exit_code, r.stdout) == (0, ""), r


def test_a_timeout_kills_the_whole_tree(ws: Path) -> None:
    sb = primed(ws)
    mark = marker()
    r = run(sb.exec(f"sleep {mark} & sleep {mark}", timeout=1))
    assert r.timed_out and r.exit_code == 137, r
    assert wait_gone(mark) == []
    assert run(sb.exec("echo next")).stdout == "next\n"


def test_a_cancelled_command_leaves_nothing_running(ws: Path) -> None:
    sb = primed(ws)
    mark = marker()
    cancel_once_running(sb, mark)
    assert wait_gone(mark) == []
    assert run(sb.exec("echo after")).stdout == "after\n"


def test_a_new_workspace_under_the_same_path_is_the_one_mounted(ws: Path) -> None:
    """A workspace put back by moving a directory into place (a restore elsewhere, a
    ``git worktree``) is a new directory: the sandbox started over the old one is not used."""
    sb = primed(ws)
    (ws / "old").write_text("old\n")
    shutil.move(ws, ws.with_name("gone"))
    ws.mkdir()
    (ws / "new").write_text("new\n")
    r = run(sb.exec("ls /app"))
    assert r.stdout == "new\n", r


def test_a_changed_etc_is_not_shown_by_a_sandbox_started_before(
    ws: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The view of the host a sandbox started ahead holds is compared with the current one
    when the command comes; here the host's /etc copy is swapped for another meanwhile."""
    import stayer.sandbox.bwrap as bwrap_mod
    from stayer.sandbox.etc_copy import EtcCopies

    source = ws.parent / "etc"
    source.mkdir()
    (source / "hostname").write_text("before\n")
    copies = EtcCopies(str(source), home=ws.parent / "copies")
    monkeypatch.setattr(bwrap_mod, "_ETC_COPIES", copies)
    try:
        sb = primed(ws)
        spare_pid(sb)
        (source / "hostname").write_text("after\n")
        r = run(sb.exec("cat /etc/hostname"))
        assert r.stdout == "after\n", r
    finally:
        copies.close()


def test_a_dead_sandbox_started_ahead_is_not_used(ws: Path) -> None:
    sb = primed(ws)
    pid = spare_pid(sb)
    os.kill(pid, 9)
    while not Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].startswith(" Z"):
        run(asyncio.sleep(0.01))  # dead before the command comes (not as it is handed over)
    r = run(sb.exec("echo still"))
    assert (r.exit_code, r.stdout) == (0, "still\n"), r


def test_commands_at_once_each_get_a_sandbox(ws: Path) -> None:
    sb = primed(ws)

    async def both() -> list[str]:
        rs = await asyncio.gather(*(sb.exec(f"echo {i}; echo $$") for i in range(3)))
        return [r.stdout for r in rs]

    assert run(both()) == [f"{i}\n2\n" for i in range(3)]


def test_a_command_in_another_directory_or_too_long_gets_a_sandbox_of_its_own(ws: Path) -> None:
    (ws / "sub").mkdir()
    sb = primed(ws)
    pid = spare_pid(sb)
    assert run(sb.exec("pwd", cwd="/app/sub")).stdout == "/app/sub\n"
    assert spare_pid(sb) == pid  # kept for the next command
    long = "echo " + "x" * 200_000
    with pytest.raises(OSError):  # as in a sandbox started for it: too long for exec
        run(sb.exec(long))
    assert spare_pid(sb) == pid


def test_next_ready_waits_for_the_next_commands_sandbox(ws: Path) -> None:
    sb = BwrapSandbox(ws)
    assert not sb.next_ready()  # none before the first command
    assert run(sb.exec("true")).exit_code == 0
    assert sb.next_ready(timeout=120)
    box = sb._kept_box
    assert isinstance(box, AheadBwrap) and box._next is not None and box._next.done()
    assert box._next.result().proc.poll() is None  # started, waiting for its command
    cold = BwrapSandbox(ws, ahead=False)
    assert run(cold.exec("true")).exit_code == 0
    assert not cold.next_ready()  # a sandbox per command: nothing started ahead
    kept = BwrapSandbox(ws, persistent=True)
    assert run(kept.exec("true")).exit_code == 0
    assert kept.next_ready()


def test_the_sandbox_started_ahead_goes_with_its_owner(ws: Path) -> None:
    sb = primed(ws)
    pid = spare_pid(sb)
    del sb
    gc.collect()
    assert wait_dead(pid), "the sandbox started ahead outlived its sandbox object"


def test_the_finaliser_takes_no_lock(ws: Path) -> None:
    assert dropped_holding_locks(ws, persistent=False) == "ok"


def test_the_whole_sandbox_is_in_its_cgroup_from_birth(ws: Path) -> None:
    """bwrap is started inside the command's cgroup, not moved there afterwards: a child
    it cloned before a move stayed outside, and if bwrap was killed then (stayer killed
    as a sandbox started), that child waited for good, out of reach of the cgroup's kill."""
    from stayer.sandbox.process import pids_cgroup_parent

    if pids_cgroup_parent() is None:
        pytest.skip("no pids cgroup can be made here")
    sb = primed(ws)
    pid = spare_pid(sb)

    def cgroup(p: int) -> str:  # in the hierarchy with the pids controller (v1), or v2's
        lines = Path(f"/proc/{p}/cgroup").read_text().splitlines()
        line = next((x for x in lines if ":pids:" in x), None) or next(
            x for x in lines if x.startswith("0::")
        )
        return line.rsplit("/", 1)[-1]

    def walk() -> list[int]:
        tree, todo = [], [pid]
        while todo:
            p = todo.pop()
            tree.append(p)
            for task in Path(f"/proc/{p}/task").iterdir():
                todo += [int(c) for c in (task / "children").read_text().split()]
        return tree

    # Started means released from its gate: pid 1 may not have forked the shell yet.
    deadline = time.monotonic() + 60
    while len(tree := walk()) < 3 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert len(tree) == 3  # bwrap, the sandbox's pid 1, the shell waiting for its command
    assert {cgroup(p) for p in tree} == {cgroup(pid)} and cgroup(pid).startswith("stayer-")


def test_the_cgroup_of_the_sandbox_started_ahead_goes_with_its_owner(ws: Path) -> None:
    sb = primed(ws)
    box = sb._kept_box
    assert isinstance(box, AheadBwrap) and box._next is not None
    cgroup = box._next.result(timeout=60).cgroup
    if cgroup is None:
        pytest.skip("no pids cgroup can be made here")
    del sb, box
    gc.collect()
    assert gone_within(cgroup.path), cgroup.path

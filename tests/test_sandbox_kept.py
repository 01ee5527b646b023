"""Attacks on the persistent sandbox (``--sandbox bwrap-persistent``): what lasts between
commands is the runner inside the sandbox and its control channel, so these commands go
after them. The isolation suites (tests/test_security_sandbox.py,
tests/test_sandbox_escapes.py) run over this sandbox too.

Each attack is followed by an honest command whose report must be its own.
"""

from __future__ import annotations

import asyncio
import gc
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
from sandbox_helpers import (
    cancel_once_running,
    dropped_holding_locks,
    gone_within,
    marker,
    needs_bwrap,
    procs_with,
    run,
    wait_dead,
    wait_gone,
)

from stayer.sandbox import make_sandbox
from stayer.sandbox.base import Mount
from stayer.sandbox.bwrap import BwrapSandbox

pytestmark = needs_bwrap


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    d = tmp_path / "ws"
    d.mkdir()
    return d


@pytest.fixture
def sb(ws: Path) -> BwrapSandbox:
    box = BwrapSandbox(ws, persistent=True)
    assert run(box.exec("echo $PPID")).stdout == "2\n"  # the runner started it
    return box


def honest(sb: BwrapSandbox) -> None:
    """A command after the attack reports exactly what it did."""
    r = run(sb.exec("echo real; echo err >&2; exit 5", timeout=30))
    assert (r.exit_code, r.stdout, r.stderr, r.timed_out) == (5, "real\n", "err\n", False), r


# A command that looks for any way to the runner's control socket and writes a forged
# report ({"seq": N, "status": 0}) for the next few commands into whatever it reaches.
_FORGER = r"""
import ctypes, json, os, socket
libc = ctypes.CDLL(None, use_errno=True)
runner = os.getppid()
forged = [json.dumps({"seq": n, "status": 0}).encode() for n in range(1, 50)]
def report(what, ok):
    print(what, "OPEN" if ok else "shut", flush=True)
# 1. descriptors of our own beyond stdio
own = sorted(int(fd) for fd in os.listdir("/proc/self/fd"))
report("own-fds " + ",".join(map(str, own)), any(fd > 3 for fd in own))
for fd in range(3, 256):
    try:
        os.fstat(fd)
    except OSError:
        continue
    for msg in forged:
        try:
            os.write(fd, msg)
        except OSError:
            pass
# 2. the runner's descriptors through /proc (started by root, the command may list their
# numbers: the directory is root's, and so is the command to the host; not follow them)
try:
    names = os.listdir("/proc/%d/fd" % runner)
except OSError:
    names = [str(n) for n in range(32)]
for name in names:
    path = "/proc/%d/fd/%s" % (runner, name)
    try:
        report("runner-fd-link " + name + " " + os.readlink(path), True)
    except OSError:
        pass
    try:
        fd = os.open(path, os.O_WRONLY)
        report("runner-fd-open " + name, True)
        for msg in forged:
            os.write(fd, msg)
    except OSError:
        pass
report("runner-fds %d" % len(names), False)
# 3. the runner's descriptors through pidfd_getfd, and ptrace
pidfd = libc.syscall(434, runner, 0)  # pidfd_open
got = [libc.syscall(438, pidfd, n, 0) for n in range(0, 32)] if pidfd >= 0 else []
report("pidfd_getfd", any(g >= 0 for g in got))
for g in got:
    if g >= 0:
        for msg in forged:
            try:
                socket.socket(fileno=g).send(msg)
            except OSError:
                pass
report("ptrace", libc.ptrace(16, runner, 0, 0) == 0)  # PTRACE_ATTACH
# 4. the runner's memory and environment
for what in ("mem", "environ", "cmdline"):
    try:
        open("/proc/%d/%s" % (runner, what), "rb").read(1)
        report("runner-" + what, what == "mem")
    except OSError:
        report("runner-" + what, False)
print("forger done")
"""


def test_a_command_cannot_reach_the_control_channel_or_forge_a_report(sb: BwrapSandbox) -> None:
    r = run(sb.exec("python3 -", stdin=_FORGER.encode(), timeout=60))
    assert r.exit_code == 0 and "forger done" in r.stdout, r
    assert "OPEN" not in r.stdout, r.stdout
    honest(sb)
    honest(sb)


def test_a_daemon_cannot_write_into_a_later_commands_output(sb: BwrapSandbox) -> None:
    """A daemon that would write into every process's stdout, or forge reports, is gone
    before the next command starts: the next output is that command's alone."""
    mark = marker()
    # It starts forging once this command's bash is gone (before that, writing into the
    # command's own output is the command's doing, and whether it lands first is a race).
    daemon = (
        f"p=$$; setsid nohup bash -c 'sleep {mark} & while [ -e /proc/'$p' ]; do sleep 0.01; "
        "done; while :; do for f in /proc/[0-9]*/fd/[12]; do echo FORGED > $f; done "
        "2>/dev/null; done' > /dev/null 2>&1 < /dev/null & echo left"
    )
    r = run(sb.exec(daemon, timeout=30))
    assert (r.exit_code, r.stdout) == (0, "left\n"), r
    assert procs_with(mark) == []  # killed before the report came
    for _ in range(5):
        r = run(sb.exec("sleep 0.05; echo mine", timeout=30))
        assert (r.exit_code, r.stdout, r.stderr) == (0, "mine\n", ""), r
    r = run(sb.exec("echo $$; ps -e -o pid=,ppid=", timeout=30))
    me, *procs = r.stdout.split("\n")[:-1]
    # bwrap, the runner, this command's bash and its ps: nothing else lives
    assert len(procs) == 4, r.stdout
    assert all(p.split()[0] in ("1", "2", me) or p.split()[1] == me for p in procs), r.stdout
    honest(sb)


def test_killing_the_runner_ends_that_sandbox_and_the_next_gets_a_fresh_one(
    sb: BwrapSandbox,
) -> None:
    mark = marker()
    assert run(sb.exec("echo planted > /tmp/left")).exit_code == 0
    r = run(sb.exec(f"sleep {mark} > /dev/null 2>&1 & kill -9 $PPID; sleep 1; echo after"))
    assert r.exit_code == 137 and "runner stopped" in r.stderr, r
    assert wait_gone(mark) == [], "a process of the killed sandbox lived on"
    r = run(sb.exec("echo $PPID; cat /tmp/left", timeout=30))
    assert r.stdout == "2\n" and r.exit_code == 1, r  # a new runner, a new /tmp
    honest(sb)


def test_a_stopped_runner_holds_only_its_command_to_the_deadline(sb: BwrapSandbox) -> None:
    r = run(sb.exec("kill -STOP $PPID; echo stopped", timeout=2))
    assert r.timed_out and r.exit_code == 137, r
    honest(sb)


def test_a_command_that_kills_everything_it_can(sb: BwrapSandbox) -> None:
    r = run(sb.exec("kill -9 -1; echo survived", timeout=30))
    assert r.exit_code in (0, 137), r  # it may take itself along
    honest(sb)


def test_a_timed_out_command_and_all_it_started_are_killed(sb: BwrapSandbox) -> None:
    mark = marker()
    r = run(sb.exec(f"setsid sleep {mark} & sleep {mark}", timeout=1))
    assert r.timed_out and r.exit_code == 137, r
    assert wait_gone(mark) == []
    honest(sb)


def test_each_command_gets_a_fresh_environment_and_directory(sb: BwrapSandbox) -> None:
    first = run(sb.exec("env | sort; pwd"))
    r = run(sb.exec("export LEAK=1; cd /tmp; echo $LEAK"))
    assert r.stdout == "1\n"
    assert run(sb.exec("env | sort; pwd")).stdout == first.stdout
    assert "LEAK" not in first.stdout and first.stdout.endswith("\n/app\n")
    r = run(sb.exec("pwd", cwd="/tmp"))
    assert r.stdout == "/tmp\n"
    r = run(sb.exec("true", cwd="/app/missing"))
    assert r.exit_code == 1 and "Can't chdir to /app/missing" in r.stderr, r


def test_limits_hold_for_each_command(ws: Path) -> None:
    sb = BwrapSandbox(ws, persistent=True, memory_mb=256, max_file_mb=1)
    r = run(sb.exec("ulimit -v; ulimit -f; ulimit -v unlimited || echo refused", timeout=30))
    assert r.stdout.startswith(f"{256 * 1024}\n{1024}\n") and "refused" in r.stdout, r
    r = run(sb.exec("head -c 2000000 /dev/zero > big; echo $?", timeout=30))
    assert r.stdout == "153\n", r  # SIGXFSZ, as in a fresh sandbox (not ignored as in Python)
    r = run(sb.exec("yes | head -c 10", timeout=30))  # SIGPIPE is the default again
    assert (r.exit_code, r.stdout) == (0, "y\ny\ny\ny\ny\n"), r


def test_stdin_output_cap_and_signals(ws: Path) -> None:
    sb = BwrapSandbox(ws, persistent=True, max_output_bytes=1000)
    r = run(sb.exec("cat; echo", stdin=b"x" * 200_000, timeout=30))
    assert r.truncated and len(r.stdout) < 1100 and "bytes dropped" in r.stdout, r
    r = run(sb.exec("kill -TERM $$", timeout=30))
    assert r.exit_code == 128 + 15, r


def test_mounts_and_concurrent_commands_get_a_fresh_sandbox(
    sb: BwrapSandbox, tmp_path: Path
) -> None:
    logs = tmp_path / "logs"
    logs.mkdir()
    r = run(
        sb.exec(
            "echo $PPID > /logs/verifier/ppid",
            mounts=(Mount(str(logs), "/logs/verifier", writable=True),),
        )
    )
    assert r.exit_code == 0 and (logs / "ppid").read_text() == "1\n", r  # bwrap's own child

    async def both() -> list[str]:
        rs = await asyncio.gather(*(sb.exec("sleep 0.3; echo $PPID") for _ in range(2)))
        return sorted(r.stdout for r in rs)

    assert run(both()) == ["1\n", "2\n"]  # one in the kept sandbox, one in a fresh one
    honest(sb)


def test_the_cli_and_make_sandbox_select_it(ws: Path) -> None:
    assert run(make_sandbox("bwrap-persistent", ws).exec("echo $PPID")).stdout == "2\n"
    assert run(make_sandbox("bwrap", ws).exec("echo $PPID")).stdout == "1\n"
    proc = subprocess.run(
        [sys.executable, "-m", "stayer.cli", "sandbox", "exec", "--json", "--workspace", str(ws)]
        + ["--sandbox", "bwrap-persistent", "--", "echo $PPID"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert json.loads(proc.stdout)["stdout"] == "2\n", proc.stderr


def test_long_commands_and_output(sb: BwrapSandbox) -> None:
    r = run(sb.exec(": '" + "x" * 100_000 + "'; echo $PPID; head -c 3000000 /dev/zero | wc -c"))
    assert (r.exit_code, r.stdout) == (0, "2\n3000000\n"), r  # still the kept sandbox
    r = run(sb.exec("head -c 3000000 /dev/zero", timeout=30))
    assert r.truncated and "bytes dropped" in r.stdout, r.stdout[:200]
    honest(sb)


def test_the_cgroup_of_a_persistent_sandbox_goes_with_its_owner(ws: Path) -> None:
    sb = BwrapSandbox(ws, persistent=True)
    assert run(sb.exec("true")).exit_code == 0
    live = sb._kept_box._live  # type: ignore[union-attr]
    assert live is not None
    if live.cgroup is None:
        pytest.skip("no pids cgroup can be made here")
    path, pid = live.cgroup.path, live.proc.pid
    del sb, live
    gc.collect()
    assert wait_dead(pid)  # killed by the finaliser
    assert gone_within(path), path  # removed by the janitor's thread


def test_the_finaliser_of_a_persistent_sandbox_takes_no_lock(ws: Path) -> None:
    assert dropped_holding_locks(ws, persistent=True) == "ok"


# Each command's bash is started ahead, when the command before it ended (kept.PRESTARTED):
# a command in /app without stdin of its own runs in it, and must find what a bash started
# for it would show it.


def test_a_command_runs_in_the_bash_started_ahead_for_it(sb: BwrapSandbox) -> None:
    kept = sb._kept_box
    assert kept is not None and sb.next_ready(timeout=60)
    slot = kept._live.slot  # type: ignore[union-attr]
    assert slot is not None and slot.pid is not None
    assert run(sb.exec("echo $$")).stdout == f"{slot.pid}\n"
    # Not for a command with stdin of its own, or elsewhere than /app: that bash is killed.
    assert sb.next_ready(timeout=60)
    ahead = kept._live.slot.pid  # type: ignore[union-attr]
    r = run(sb.exec("cat; echo $$; ps -e -o pid=", stdin=b"in\n"))
    mine, *pids = r.stdout.split("\n")[1:-1]
    assert r.stdout.startswith("in\n") and mine != str(ahead), r
    assert str(ahead) not in [p.strip() for p in pids], r.stdout
    assert sb.next_ready(timeout=60)
    ahead = kept._live.slot.pid  # type: ignore[union-attr]
    assert run(sb.exec("echo $$", cwd="/tmp")).stdout != f"{ahead}\n"
    honest(sb)


def test_no_command_runs_beside_the_next_ones_bash(sb: BwrapSandbox) -> None:
    """The next command's bash starts after this command and all it left are gone: while
    a command runs, the only bash waiting for its text is none (it is the command's own)."""
    for _ in range(3):
        r = run(sb.exec("sleep 1000 & ps -e -o pid=,ppid=,args=; echo $$", timeout=30))
        *procs, me = r.stdout.split("\n")[:-1]
        # the runner's children that wait for a text (a fork of this bash has its args too)
        waiting = [p.split()[0] for p in procs if p.split()[1] == "2" and "BASH_EXEC" in p]
        assert waiting in ([], [me]), r.stdout


@pytest.mark.parametrize(
    "command",
    [
        'echo "$_" "$0" "$-" "$#" "$SECONDS" "$BASH_EXECUTION_STRING"',
        'echo "$BASH_COMMAND" "${BASH_SOURCE[*]}" "${BASH_LINENO[*]}" "$BASH_SUBSHELL" "$SHLVL"',
        "shopt; set -o; history | wc -l; caller",
        "echo $LINENO\n\necho $LINENO; f() { echo $LINENO; }; f",
        "exit 7",
        "set -u; echo $nope",
        "trap 'echo bye' EXIT; false",
        'read -r x; echo "[$x] $?"',
        "cd /tmp && pwd; echo $PWD $OLDPWD",
        "printf '%s\\n' 'é ü \\ \"' $'\\t'",
        "env | sort; ulimit -a",
        "cd /proc/$$/fd && echo *",  # the glob's own directory is 3: none of ours is left
        "grep -E '^(Cap|NoNewPrivs|Seccomp)' /proc/self/status",
        "echo " + "x" * 100_000 + " | wc -c",
        "",
    ],
    ids=lambda c: c.split("\n")[0][:30],
)
def test_a_command_started_ahead_sees_what_bash_c_shows(
    sb: BwrapSandbox, ws: Path, command: str
) -> None:
    fresh = BwrapSandbox(ws, ahead=False)
    assert sb.next_ready(timeout=60)
    got, want = run(sb.exec(command, timeout=30)), run(fresh.exec(command, timeout=30))
    assert (got.exit_code, got.stdout, got.stderr) == (want.exit_code, want.stdout, want.stderr)


def test_what_differs_from_a_bash_started_for_the_command(sb: BwrapSandbox, ws: Path) -> None:
    """The command is eval's: a syntax error is reported as eval's, and a last program is
    that bash's child rather than run in its place, so bash reports its death by a signal
    too (`bash -c` reports none for the program it becomes). Exit statuses are the same."""
    fresh = BwrapSandbox(ws, ahead=False)
    for command in ("echo a\nif", "sh -c 'kill -SEGV $$'"):
        assert sb.next_ready(timeout=60)
        got, want = run(sb.exec(command, timeout=30)), run(fresh.exec(command, timeout=30))
        assert (got.exit_code, got.stdout) == (want.exit_code, want.stdout), (got, want)
        if command.startswith("sh"):
            assert want.stderr == "" and got.stderr.endswith(
                "Segmentation fault      " + command + "\n"
            )
        else:
            assert got.stderr == want.stderr.replace(": -c: ", ": eval: ") != want.stderr


def test_what_bash_reads_as_it_starts_is_read_when_the_command_comes(ws: Path) -> None:
    """BASH_ENV names a file bash runs as it starts: a bash started ahead would run the
    file as it was then, so there is none; and TMOUT= would end its wait for the text."""
    (ws / "rc").write_text("X=first\n")
    sb = BwrapSandbox(ws, persistent=True, env={"BASH_ENV": "/app/rc", "TMOUT": "1"})
    assert run(sb.exec("echo $X $TMOUT")).stdout == "first 1\n"
    assert not sb.next_ready(timeout=60)  # running, no bash ahead of the next command
    (ws / "rc").write_text("X=second\n")
    assert run(sb.exec("echo $X")).stdout == "second\n"
    tmout = BwrapSandbox(ws, persistent=True, env={"TMOUT": "1"})
    assert run(tmout.exec("true")).exit_code == 0 and tmout.next_ready(timeout=60)
    ahead = tmout._kept_box._live.slot.pid  # type: ignore[union-attr]
    time.sleep(1.5)  # longer than TMOUT: a read that honoured it would have ended by now
    assert run(tmout.exec("echo $$ $TMOUT")).stdout == f"{ahead} 1\n"


def test_a_cancelled_command_started_ahead_leaves_nothing_running(sb: BwrapSandbox) -> None:
    mark = marker()
    assert sb.next_ready(timeout=60)
    cancel_once_running(sb, mark)
    assert wait_gone(mark) == []
    honest(sb)
    assert sb.next_ready(timeout=60)  # a fresh kept sandbox, with a bash ahead again


def test_the_runner_is_the_shipped_module_and_its_command_line_shows_no_host_path(
    sb: BwrapSandbox,
) -> None:
    """The runner is stayer/sandbox/runner.py, sent whole over the control socket: the
    sandbox runs the shipped file's text, and neither its command line nor a mount names
    where that file (or stayer) lies on the host."""
    from stayer.sandbox import persistent, runner

    shipped = Path(runner.__file__).resolve()
    assert persistent.runner_code() == shipped.read_bytes()
    r = run(
        sb.exec(
            "for p in /proc/[0-9]*; do tr '\\0' ' ' < $p/cmdline; echo; done; "
            "cat /proc/self/mountinfo",
            timeout=60,
        )
    )
    assert r.exit_code == 0, r
    assert persistent.BOOT in r.stdout  # the runner is running, started as always
    assert str(shipped.parent.parent.parent) not in r.stdout and "runner.py" not in r.stdout
    honest(sb)


# What the runner (and the line that boots it) imports, as modules a command could plant in
# /app, the directory a fresh runner starts in; site's hooks too.
_RUNNER_IMPORTS = (
    "socket json ctypes contextlib fcntl resource signal time typing collections "
    "__future__ sitecustomize usercustomize"
)


def test_modules_planted_where_the_runner_starts_are_never_imported(
    sb: BwrapSandbox, ws: Path
) -> None:
    """A command plants a module under the name of each one the runner imports in /app,
    then kills the runner: the next command's runner starts in /app, and imports only the
    system's own modules (``python3 -I -S``: no current directory on its path)."""
    plant = (
        f"for m in {_RUNNER_IMPORTS}; do "
        "echo \"open('/app/IMPORTED-$m', 'w')\" > /app/$m.py; done; kill -9 $PPID"
    )
    r = run(sb.exec(plant, timeout=30))
    assert r.exit_code == 137 and "runner stopped" in r.stderr, r
    assert (ws / "socket.py").exists()  # planted where the next runner starts
    r = run(sb.exec("echo $PPID; ls /app | grep -c IMPORTED", timeout=60))
    assert r.stdout == "2\n0\n", r  # a new runner started it; nothing planted ran
    honest(sb)
    assert not list(ws.glob("IMPORTED-*"))

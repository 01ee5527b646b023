"""A bubblewrap sandbox kept running between commands (``--sandbox bwrap-persistent``).

Starting bubblewrap costs about 5 ms of namespaces and mounts per command, more than the
command itself for most tool calls. Here the sandbox is started once, with exactly the
options, seccomp filter, limits and cgroup of a per-command one
(:meth:`~stayer.sandbox.bwrap.BwrapSandbox.started`), and a small runner inside it (Python,
:data:`RUNNER`) starts each command. What each command still gets, as in a fresh sandbox:

* its own session and process group, the environment allow-list (sent with each command,
  not the runner's), its directory, and its rlimits (address space, file size; processes
  by the sandbox's pids cgroup, which counts the runner as one);
* stdout, stderr and stdin on pipes of its own, created here for it and handed to the
  runner over a socket (``SCM_RIGHTS``): the host reads what the command wrote, never a
  copy relayed by the runner, with the same bounded capture;
* its deadline and the storage watch from here; on a timeout, a storage limit, the
  caller's cancellation or anything unexpected the whole sandbox is killed (its process
  group and its cgroup) and the next command starts a fresh one;
* nothing it started outlives it: when it exits, the runner (a child subreaper) kills
  every other process of the sandbox (``kill(-1)`` reaches all but itself and pid 1, and
  only in the sandbox's pid namespace) and reaps them before it reports the exit status.

The runner is the one thing that lasts, so the commands must not reach it: it makes itself
non-dumpable first, so a command (same uid, no capabilities) can neither ptrace it, read
``/proc/<runner>/fd`` nor take its descriptors with ``pidfd_getfd``; its control socket is
close-on-exec and closed in each command before it runs; each report carries the number
of the command it answers, and one that does not match, or none at all, kills the
sandbox. A command can kill or stop the runner (same uid): a killed runner takes the
sandbox with it (bwrap's pid 1 exits with it, and the kernel kills the namespace), that
command is reported as killed, and the next command gets a fresh sandbox; a stopped one
holds the command to its deadline, then the same.

What differs from a fresh sandbox per command: ``/tmp`` and the pid namespace last from
one command to the next, as in a persistent shell (the workspace always does); a command
with mounts of its own (the verifier's ``/logs/verifier``), one that comes while another
runs, and any command when the runner cannot start (no ``/usr/bin/python3``) get a fresh
sandbox instead. bwrap's ``--die-with-parent`` is tied to the thread that started it: if
that thread ends, the sandbox ends, and the next command starts a fresh one.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import json
import logging
import os
import signal
import socket
import subprocess
import time
import weakref
from dataclasses import dataclass
from typing import Any, Protocol

from stayer.sandbox.base import ExecResult, Mount
from stayer.sandbox.janitor import JANITOR
from stayer.sandbox.process import (
    _DRAIN_GRACE_S,
    KeptCommand,
    Launch,
    ProcessLimits,
    StartGate,
    _Capture,
    _PidsCgroup,
    _rlimits,
    born_in,
    captured_result,
    confine_and_release_now,
    drain_fd,
    feed_fd,
    pids_cgroup_parent,
    storage_baseline,
    storage_verdict,
    watch_storage,
)


class Starts(Protocol):
    """What a kept sandbox, or one started ahead (:mod:`stayer.sandbox.ahead`), needs of
    its :class:`~stayer.sandbox.bwrap.BwrapSandbox`."""

    env: dict[str, str]

    @property
    def limits(self) -> ProcessLimits: ...

    def started(
        self, mounts: tuple[Mount, ...], cwd: str, program: list[str], host: Any = None
    ) -> contextlib.AbstractContextManager[Launch]: ...

    def hold_host(self) -> contextlib.AbstractContextManager[Any]:
        """What of the host a sandbox started now shows, held unchanged for it while the
        block lasts (for ``started``'s ``host``); two compare equal when no difference."""
        ...


@dataclass
class Spawned:
    """bwrap started by :func:`spawn`, held at its gate until released."""

    proc: subprocess.Popen[bytes]
    gate: StartGate
    cgroup: _PidsCgroup | None
    view: Any  # the host as the sandbox shows it (Starts.hold_host)
    held: contextlib.ExitStack  # keeps that view (the /etc copy it mounts): the sandbox's
    starting: contextlib.ExitStack  # bwrap's own descriptors: until it has started


def spawn(
    box: Starts,
    program: list[str],
    *,
    max_processes: int | None,
    stdio: tuple[int, int, int],
    pass_fds: tuple[int, ...] = (),
) -> Spawned:
    """Start bwrap for ``program`` in a sandbox of ``box`` in ``/app``, in a pids cgroup of
    its own from birth, held at its gate (the caller applies limits and releases it).
    bwrap's ``--die-with-parent`` is tied to the calling thread: the sandbox lasts as long
    as that thread does."""
    cgroup: _PidsCgroup | None = None
    if (parent := pids_cgroup_parent()) is not None:
        try:
            cgroup = _PidsCgroup.create(parent, max_processes)
        except OSError as e:
            log.warning("could not create pids cgroup under %s: %s", parent, e)
    held = contextlib.ExitStack()
    starting = contextlib.ExitStack()
    try:
        view = held.enter_context(box.hold_host())
        how = starting.enter_context(box.started((), "/app", program, view))
        gate = how.gate
        assert gate is not None
        try:
            proc = subprocess.Popen(
                born_in(cgroup, how.argv),
                stdin=stdio[0],
                stdout=stdio[1],
                stderr=stdio[2],
                cwd=how.cwd,
                env=dict(how.env or {}),
                start_new_session=True,
                pass_fds=(*how.pass_fds, *pass_fds),
            )
        finally:
            gate.close_child_ends()
    except BaseException:
        starting.close()
        held.close()
        if cgroup is not None:
            cgroup.remove_now()
        raise
    return Spawned(proc, gate, cgroup, view, held, starting)


log = logging.getLogger(__name__)

PYTHON = "/usr/bin/python3"
# How long the runner may take to start (Python, once per sandbox).
_START_TIMEOUT_S = 30.0
_REAP_WAIT_S = 5.0  # for a killed bwrap to exit, before its cgroup is removed anyway
# The runner counts as one process of the sandbox's pids cgroup, on top of bwrap's two.
_RUNNER_PROCESSES = 1

# What the sandbox starts: fd ``argv[1]`` is its end of a SOCK_SEQPACKET socket, whose
# first message is the runner's code (so that /proc/*/cmdline and ps show only this line).
BOOT = "import socket,sys;ctl=socket.socket(fileno=int(sys.argv[1]));exec(ctl.recv(1<<16))"
# The runner. Each message is one command (JSON) with its stdin, stdout and stderr
# attached; the answer is {"seq": n, "status": wait status}, sent once every process the
# command left is gone.
RUNNER = r"""
import ctypes, json, os, resource, signal, socket, sys, time
libc = ctypes.CDLL(None, use_errno=True)
# PR_SET_DUMPABLE 0 first: no ptrace, no /proc/<pid>/fd, no pidfd_getfd for the commands.
# PR_SET_CHILD_SUBREAPER: what a command leaves behind is reparented here, to be reaped.
if libc.prctl(4, 0, 0, 0, 0) or libc.prctl(36, 1, 0, 0, 0):
    sys.exit(3)
os.set_inheritable(ctl.fileno(), False)

def child(req, fds):
    try:
        os.setsid()
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
        os.closerange(3, 1 << 20)
        for sig in (signal.SIGPIPE, signal.SIGXFSZ):  # Python ignores them; a shell must not
            signal.signal(sig, signal.SIG_DFL)
        for which, value in req["rlimits"]:
            resource.setrlimit(which, (value, value))
        try:
            os.chdir(req["cwd"])
        except OSError as e:
            os.write(2, ("bwrap: Can't chdir to %s: %s\n" % (req["cwd"], e.strerror)).encode())
            os._exit(1)
        os.execve("/bin/bash", ["/bin/bash", "-c", req["command"]], req["env"])
    except BaseException as e:
        os.write(2, ("stayer runner: %r\n" % (e,)).encode())
    os._exit(127)

def clean():
    # Kill every process of the sandbox but pid 1 and this one, until none is left.
    deadline = time.monotonic() + 10
    while True:
        try:
            os.kill(-1, signal.SIGKILL)
        except ProcessLookupError:
            return
        try:
            while os.waitpid(-1, os.WNOHANG)[0]:
                pass
        except ChildProcessError:
            pass
        if time.monotonic() > deadline:
            os._exit(4)
        time.sleep(0.0002)

ctl.send(b"ready")
while True:
    msg, fds, _flags, _addr = socket.recv_fds(ctl, 1 << 20, 3)
    if not msg or len(fds) != 3:
        os._exit(0)
    req = json.loads(msg)
    pid = os.fork()
    if pid == 0:
        child(req, fds)
    for fd in fds:
        os.close(fd)
    _, status = os.waitpid(pid, 0)
    clean()
    ctl.send(json.dumps({"seq": req["seq"], "status": status}).encode())
"""


class _Gone(Exception):
    """The runner stopped answering, or answered something else than asked."""


class _Live:
    """The running sandbox: bwrap, the host's end of the control socket, the cgroup.
    Killing it is synchronous, so that it can run anywhere (a finaliser, a cancellation)."""

    def __init__(
        self,
        proc: subprocess.Popen[bytes],
        sock: socket.socket,
        cgroup: _PidsCgroup | None,
        view: object,
        held: contextlib.ExitStack,
    ) -> None:
        self.proc = proc
        self.sock = sock
        self.cgroup: _PidsCgroup | None = cgroup
        self.view = view  # the host as the sandbox shows it (Starts.hold_host)
        self._held = held  # keeps that view (the copy of /etc it mounts) until closed

    def alive(self) -> bool:
        return self.proc.poll() is None

    def kill(self) -> None:
        """Kill everything in the sandbox. The socket stays open until :meth:`reap` (a
        reader may still be registered on it in the event loop)."""
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        if self.cgroup is not None:
            self.cgroup.kill_all()

    def close(self) -> None:
        self.kill()
        with contextlib.suppress(OSError):
            self.sock.close()
        self._held.close()

    async def reap(self) -> None:
        """Close it here (the event loop's thread: its readers are registered here), then
        wait for bwrap and remove the cgroup in a thread."""
        self.close()
        await asyncio.to_thread(self._wait_and_remove)

    def reap_now(self) -> None:
        """:meth:`reap`, blocking (for the janitor's thread)."""
        self.close()
        self._wait_and_remove()

    def _wait_and_remove(self) -> None:
        # Killed, bwrap exits at once; one the kernel holds must not hold its reaper for good.
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(_REAP_WAIT_S)
        if self.cgroup is not None:
            self.cgroup.remove_now()


def _kill_all(lives: list[_Live], dead: list[_Live], pid: int) -> None:
    """At the owner's end (a finaliser: it runs in any thread, perhaps one holding the lock
    of the ``/etc`` copies, so it takes none): the live sandbox and those killed but not
    reaped yet, killed now; the rest is the janitor's job. In a copy made by fork, nothing
    here is its own."""
    if os.getpid() != pid:
        return
    for live in (*lives, *dead):
        live.kill()
        JANITOR.put(live.reap_now)


class KeptBwrap:
    """One kept sandbox of a :class:`~stayer.sandbox.bwrap.BwrapSandbox` (see the module
    docstring); one command at a time (``busy``)."""

    def __init__(self, box: Starts) -> None:
        self.box = box
        self.busy = False
        self._live: _Live | None = None
        self._dead: list[_Live] = []  # killed, not yet reaped
        self._seq = 0
        self._broken = False  # it could not start: every command gets a fresh sandbox
        self._lives: list[_Live] = []  # what the finaliser kills: the live one, if any
        JANITOR.ready()
        weakref.finalize(self, _kill_all, self._lives, self._dead, os.getpid())

    async def run(self, cmd: KeptCommand) -> ExecResult | None:
        self.busy = True
        try:
            while self._dead:
                await self._dead.pop().reap()
            if self._live is None or not self._live.alive():
                if self._broken:
                    return None
                self._drop()
                while self._dead:
                    await self._dead.pop().reap()
                self._live = await self._start()
                if self._live is None:
                    self._broken = True  # not again for this sandbox: each would wait
                    return None
            return await self._run(self._live, cmd)
        finally:
            self.busy = False

    def next_ready(self, timeout: float | None = None) -> bool:
        """Whether the kept sandbox is running (it starts with a command: nothing to wait
        for; ``timeout`` is :meth:`AheadBwrap.next_ready`'s)."""
        return self._live is not None and self._live.alive()

    def _drop(self) -> None:
        """Kill the sandbox now; it is reaped before the next one starts."""
        if self._live is not None:
            self._live.kill()
            self._dead.append(self._live)
            self._lives.clear()
            self._live = None

    async def _start(self) -> _Live | None:
        """A new sandbox, started and ready; None (logged) when it cannot start. bwrap
        starts from this thread (its ``--die-with-parent`` is tied to the thread that
        starts it: the event loop's); its limits, release and the runner's "ready" are
        waited for in a thread."""
        own = self.box.limits.max_processes
        host_end, runner_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            program = [PYTHON, "-I", "-S", "-c", BOOT, str(runner_end.fileno())]
            sp = spawn(
                self.box,
                program,
                max_processes=None if own is None else own + _RUNNER_PROCESSES,
                stdio=(subprocess.DEVNULL,) * 3,
                pass_fds=(runner_end.fileno(),),
            )
        except BaseException as e:
            host_end.close()
            if not isinstance(e, OSError):
                raise
            log.warning("the kept sandbox could not start (%s): a fresh one per command", e)
            return None
        finally:
            runner_end.close()
        live = _Live(sp.proc, host_end, sp.cgroup, sp.view, sp.held)
        self._lives.append(live)

        def finish() -> None:
            try:
                host_end.send(RUNNER.encode())
                # The rlimits are each command's (set by the runner), not the runner's.
                if not confine_and_release_now(sp.gate, ProcessLimits(), sp.cgroup):
                    raise _Gone("bwrap did not start")
                host_end.settimeout(_START_TIMEOUT_S)
                if host_end.recv(64) != b"ready":
                    raise _Gone("the runner did not start")
                host_end.setblocking(False)
            finally:
                sp.starting.close()

        try:
            await asyncio.to_thread(finish)
            return live
        except (OSError, TimeoutError, _Gone) as e:
            log.warning("the kept sandbox could not start (%s): a fresh one per command", e)
            self._lives.remove(live)
            await live.reap()
            return None
        except BaseException:
            self._lives.remove(live)
            live.kill()
            self._dead.append(live)
            raise

    async def _run(self, live: _Live, cmd: KeptCommand) -> ExecResult | None:
        """The command's result; None if it could not be handed to the runner."""
        timeout, stdin, storage = cmd.timeout, cmd.stdin, cmd.storage
        storage_cap = await storage_baseline(storage)
        out, err = _Capture(cmd.max_output_bytes), _Capture(cmd.max_output_bytes)
        start = time.monotonic()
        self._seq += 1
        request = {
            "seq": self._seq,
            "command": cmd.command,
            "cwd": cmd.cwd,
            "env": self.box.env,
            "rlimits": _rlimits(self.box.limits, live.cgroup),
        }
        ours: list[int] = []  # our ends: stdout's and stderr's read ends, stdin's write end
        theirs: list[int] = []  # the command's: stdin, stdout, stderr
        finished = False
        tasks: list[asyncio.Task[None]] = []
        waits: list[asyncio.Future[Any]] = []  # the runner's answer, the deadline
        try:
            if stdin is not None:
                in_r, in_w = os.pipe()
                theirs.append(in_r)
                ours.append(in_w)
            else:
                theirs.append(os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC))
            for _ in range(2):
                r, w = os.pipe()
                ours.append(r)
                theirs.append(w)
            try:
                socket.send_fds(live.sock, [json.dumps(request).encode()], theirs)
            except OSError as e:
                # Too long for one message (about 200 KiB, where bash -c refuses 128 KiB
                # anyway): a fresh sandbox says what it says. Else the runner is gone.
                finished = e.errno == errno.EMSGSIZE
                return None
            for fd in theirs:
                os.close(fd)
            theirs.clear()
            out_fd, err_fd = ours[-2:]
            tasks = [
                asyncio.create_task(drain_fd(out_fd, out)),
                asyncio.create_task(drain_fd(err_fd, err)),
            ]
            if stdin is not None:
                tasks.append(asyncio.create_task(feed_fd(ours, stdin)))
            answer = asyncio.ensure_future(_answer(live.sock, self._seq))
            exited = asyncio.ensure_future(_in_time(answer, max(timeout, 0.001)))
            waits += [answer, exited]
            storage_used: int | None = None
            if storage is None:
                timed_out = not await exited
            else:
                timed_out, storage_used = await watch_storage(exited, storage.path, storage_cap)
            note = ""
            if timed_out or storage_used is not None or not answer.done():
                code = 128 + signal.SIGKILL
                self._drop()  # everything in it dies; the next command gets a fresh one
            elif answer.exception() is not None:
                code = 128 + signal.SIGKILL
                note = (
                    "\n[the sandbox's command runner stopped during this command (was it "
                    "killed?): the sandbox was stopped, and the next command starts a fresh "
                    "one]\n"
                )
                self._drop()
            else:
                status = answer.result()
                code = (
                    os.WEXITSTATUS(status)
                    if os.WIFEXITED(status)
                    else 128 + os.WTERMSIG(status)
                    if os.WIFSIGNALED(status)
                    else 128 + signal.SIGKILL
                )
            _done, pending = await asyncio.wait(tasks, timeout=_DRAIN_GRACE_S)
            if pending:  # nothing in the sandbox may hold them now: something is wrong
                log.warning("a command of the persistent sandbox left its output open")
                self._drop()
                _done, pending = await asyncio.wait(tasks, timeout=_DRAIN_GRACE_S)
            code, stderr_text = await storage_verdict(
                storage, storage_cap, storage_used, code, err.text() + note
            )
            finished = True
        except (OSError, ValueError) as e:  # the socket broke, or pipes could not be made
            log.warning("persistent sandbox: %s; the next command starts a fresh one", e)
            self._drop()
            raise
        finally:
            if not finished:
                self._drop()  # cancelled, or broken: kill before propagating
            for task in (*tasks, *waits):
                task.cancel()
            for wait in waits:
                if wait.done() and not wait.cancelled():
                    wait.exception()  # seen: a runner gone as the deadline came
            for fd in (*ours, *theirs):
                with contextlib.suppress(OSError):
                    os.close(fd)
        return captured_result(code, out, err, stderr_text, timed_out=timed_out, start=start)


async def _answer(sock: socket.socket, seq: int) -> int:
    """The wait status the runner reports for command ``seq``; :class:`_Gone` if it closes
    the socket or says anything else."""
    data = await asyncio.get_running_loop().sock_recv(sock, 4096)
    try:
        reply = json.loads(data)
    except ValueError:
        reply = None
    if (
        not isinstance(reply, dict)
        or reply.get("seq") != seq
        or type(reply.get("status")) is not int
    ):
        raise _Gone(f"the runner answered {data[:80]!r}")
    return reply["status"]


async def _in_time(answer: asyncio.Future[int], timeout: float) -> bool:
    """Whether ``answer`` came (or failed) within ``timeout``."""
    done, _ = await asyncio.wait({answer}, timeout=timeout)
    return bool(done)

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
  only in the sandbox's pid namespace; pid 1 is out of every command's reach, see
  :mod:`stayer.sandbox.seccomp`) and reaps them before it reports the exit status.

**Each command's bash is started ahead.** Starting bash itself (fork, exec, the dynamic
loader, bash's own set-up) costs about 1 ms, more than a tool call such as ``cat`` or
``grep`` in a small tree. So once a command has returned, the runner starts the next
command's bash exactly as above (its session, descriptors, environment, directory
``/app``, rlimits), and it waits in :data:`PRESTARTED` for its text on a pipe: the
command, when it comes, is written there, read whole, and run by ``eval``. It starts
after the command before it and all that command left are gone, so no command ever runs
beside it; its pipes are closed before the command runs. A command with stdin of its own,
in another directory, or whose text ``bash -c`` would refuse, gets a bash started for it
as before (the waiting one is killed first); none is started ahead when the environment
sets ``BASH_ENV`` (bash reads that file as it starts). What ``eval`` shows differently
from ``bash -c``: a syntax error is reported as ``eval:``'s, not ``-c:``'s, and a program
run last is the bash's child rather than run in its place, so bash also reports its death
by a signal (``Segmentation fault``) on stderr; exit statuses are the same. And its
command line (``ps``, ``/proc/<pid>/cmdline``) is the program it waited in, not
``bash -c COMMAND``.

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
import select
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
    AHEAD_CWD,
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
    fits_ahead,
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
    memory_mb: int | None = None,
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
            cgroup = _PidsCgroup.create(parent, max_processes, memory_mb)
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
# What a command started ahead runs (fd 3: its text, until EOF; fd 4: closed once it
# waits), on one line so that ``$LINENO`` counts from the command's first line: the text
# read whole (``read -N`` reads a pipe in blocks, else byte by byte) and run by eval, so
# that the command sees what ``bash -c COMMAND`` shows it (``$0``, ``$-``, ``$_``,
# ``$BASH_EXECUTION_STRING``, ``$SECONDS`` from 0, its exit status), but for the
# differences the module docstring names. ``TMOUT=``: the read waits whatever the
# environment sets.
PRESTARTED = (
    "exec 4>&-; TMOUT= IFS= read -r -N 1000000000 BASH_EXECUTION_STRING <&3; exec 3<&-; "
    'SECONDS=0; : "$0"; eval "$BASH_EXECUTION_STRING"'
)
# The runner. Each message is one command (JSON) with its stdin, stdout and stderr
# attached; the answer is {"seq": n, "status": wait status}, sent once every process the
# command left is gone. A message {"prestart": n} with the next command's descriptors
# starts that command's bash ahead, in PRESTARTED, answered {"prestarted": n, "pid": pid}
# once it waits (pid null: it could not start); then {"seq": n, "go": 1, "command": ...}
# (no descriptors) runs the command in it: written to its pipe, read there, run by eval.
# Any other message kills it first.
RUNNER = (
    f"PRESTARTED = {PRESTARTED!r}\n"
    + r"""
import ctypes, fcntl, json, os, resource, signal, socket, sys, time
libc = ctypes.CDLL(None, use_errno=True)
# PR_SET_DUMPABLE 0 first: no ptrace, no /proc/<pid>/fd, no pidfd_getfd for the commands.
# PR_SET_CHILD_SUBREAPER: what a command leaves behind is reparented here, to be reaped.
if libc.prctl(4, 0, 0, 0, 0) or libc.prctl(36, 1, 0, 0, 0):
    sys.exit(3)
os.set_inheritable(ctl.fileno(), False)

def child(req, fds, argv, extra=()):
    try:
        os.setsid()
        # Out of the way of the targets first: 0-2 for stdio, 3 on for ``extra``.
        fds = [fcntl.fcntl(fd, fcntl.F_DUPFD, 64) for fd in (*fds, *extra)]
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
        os.closerange(len(fds), 1 << 20)
        for sig in (signal.SIGPIPE, signal.SIGXFSZ):  # Python ignores them; a shell must not
            signal.signal(sig, signal.SIG_DFL)
        for which, value in req["rlimits"]:
            resource.setrlimit(which, (value, value))
        try:
            os.chdir(req["cwd"])
        except OSError as e:
            os.write(2, ("bwrap: Can't chdir to %s: %s\n" % (req["cwd"], e.strerror)).encode())
            os._exit(1)
        os.execve("/bin/bash", argv, req["env"])
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

def prestart(req, fds):
    # The next command's bash, waiting on a pipe for its text; ready once it closes fd 4.
    text_r, text_w = os.pipe()
    ready_r, ready_w = os.pipe()
    try:
        pid = os.fork()
    except OSError:
        pid = None
    if pid == 0:
        child(req, fds, ["/bin/bash", "-c", PRESTARTED], (text_r, ready_w))
    for fd in (*fds, text_r, ready_w):
        os.close(fd)
    while os.read(ready_r, 64):
        pass
    os.close(ready_r)
    if pid is None:
        os.close(text_w)
        return None
    return pid, text_w

def go(req, nxt):
    pid, text_w = nxt
    try:
        os.write(text_w, os.fsencode(req["command"]))  # blocks until bash has read the rest
    except OSError:
        pass  # it died: its status says how
    os.close(text_w)
    return pid

def drop(nxt):
    if nxt is not None:
        os.kill(nxt[0], signal.SIGKILL)
        os.waitpid(nxt[0], 0)
        os.close(nxt[1])

ctl.send(b"ready")
nxt = None
while True:
    msg, fds, _flags, _addr = socket.recv_fds(ctl, 1 << 20, 3)
    if not msg:
        os._exit(0)
    req = json.loads(msg)
    if "prestart" in req and len(fds) == 3 and nxt is None:
        nxt = prestart(req, fds)
        pid = None if nxt is None else nxt[0]
        ctl.send(json.dumps({"prestarted": req["prestart"], "pid": pid}).encode())
        continue
    if req.get("go") and not fds and nxt is not None:
        pid, nxt = go(req, nxt), None
    elif len(fds) == 3 and "prestart" not in req:
        drop(nxt)
        nxt = None
        pid = os.fork()
        if pid == 0:
            child(req, fds, ["/bin/bash", "-c", req["command"]])
        for fd in fds:
            os.close(fd)
    else:
        os._exit(5)
    _, status = os.waitpid(pid, 0)
    clean()
    ctl.send(json.dumps({"seq": req["seq"], "status": status}).encode())
"""
)


class _Gone(Exception):
    """The runner stopped answering, or answered something else than asked."""


@dataclass
class _Slot:
    """The next command's bash, started ahead in the sandbox (``prestart``): our ends of
    its stdout and stderr; once the runner has answered, its pid in the sandbox (None: it
    could not start)."""

    seq: int
    out: int
    err: int
    answered: bool = False
    pid: int | None = None

    def answer(self, data: bytes) -> None:
        """Take the runner's answer about this bash; :class:`_Gone` if it is not one."""
        self.pid, self.answered = _reply(data, "prestarted", self.seq, "pid"), True

    def close(self) -> None:
        for fd in (self.out, self.err):
            with contextlib.suppress(OSError):
                os.close(fd)


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
        self.slot: _Slot | None = None  # the next command's bash, started ahead

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
        if self.slot is not None:
            self.slot.close()
            self.slot = None
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
        # The next command's bash, to start once the caller has its result (call_soon).
        self._soon: tuple[asyncio.Handle, _Live] | None = None
        self._broken = False  # it could not start: every command gets a fresh sandbox
        self._lives: list[_Live] = []  # what the finaliser kills: the live one, if any
        JANITOR.ready()
        weakref.finalize(self, _kill_all, self._lives, self._dead, os.getpid())

    async def run(self, cmd: KeptCommand) -> ExecResult | None:
        self.busy = True
        self._start_next_now()
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
                self._prestart(self._live)
            return await self._run(self._live, cmd)
        finally:
            self.busy = False

    async def close(self) -> None:
        """Kill the kept sandbox (pid 1 and all) and wait until it is gone; the next
        command starts a fresh one."""
        if self._soon is not None:
            self._soon[0].cancel()
            self._soon = None
        self._drop()
        while self._dead:
            await self._dead.pop().reap()

    def next_ready(self, timeout: float | None = None) -> bool:
        """Whether the kept sandbox is running with the next command's bash started and
        waiting, waiting up to ``timeout`` s for that bash (as
        :meth:`AheadBwrap.next_ready`). The sandbox starts with the first command."""
        live = self._live
        if live is None or not live.alive() or self.busy:
            return False
        self._start_next_now()
        slot = live.slot
        if slot is not None and not slot.answered:
            if not select.select([live.sock], [], [], timeout)[0]:
                return False
            try:
                slot.answer(live.sock.recv(4096))
            except (OSError, _Gone) as e:
                log.warning("persistent sandbox: %s; the next command starts a fresh one", e)
                self._drop()
                return False
        return slot is not None and slot.pid is not None

    def _start_next_now(self) -> None:
        """Start the next command's bash now if it is still to start."""
        if self._soon is not None:
            handle, live = self._soon
            handle.cancel()
            self._prestart(live)

    def _prestart(self, live: _Live) -> None:
        """Have the runner start the next command's bash now (it waits in
        :data:`PRESTARTED`), with /dev/null for stdin and our pipes for its output, as a
        command in ``/app`` without stdin of its own would get them."""
        self._soon = None
        if self._live is not live or live.slot is not None:
            return  # dropped since, or started
        try:
            setup = self._setup(live, AHEAD_CWD)
        except ReferenceError:  # the sandbox is gone (its finaliser kills this one)
            return
        if "BASH_ENV" in setup["env"]:  # bash reads it as it starts: the command's to read
            return
        self._seq += 1
        request = {"prestart": self._seq, **setup}
        ours: list[int] = []
        theirs = [os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)]
        try:
            for _ in range(2):
                r, w = os.pipe()
                ours.append(r)
                theirs.append(w)
            socket.send_fds(live.sock, [json.dumps(request).encode()], theirs)
        except OSError as e:  # the runner is gone: the next command finds out
            log.debug("persistent sandbox: no command started ahead: %s", e)
            for fd in ours:
                os.close(fd)
            return
        finally:
            for fd in theirs:
                os.close(fd)
        live.slot = _Slot(self._seq, ours[0], ours[1])

    def _setup(self, live: _Live, cwd: str) -> dict[str, Any]:
        """What the runner sets up for a command of ``live`` in ``cwd``, as a fresh sandbox
        would: its directory, environment and rlimits."""
        return {
            "cwd": cwd,
            "env": self.box.env,
            "rlimits": _rlimits(self.box.limits, live.cgroup),
        }

    async def _waiting(self, live: _Live, timeout: float) -> _Slot | None:
        """The next command's bash, once the runner says it waits; None when there is
        none, or it could not start. :class:`_Gone` (or OSError, TimeoutError) when the
        runner does not answer as it should, within ``timeout``."""
        slot = live.slot
        if slot is None:
            return None
        if not slot.answered:
            data = await asyncio.wait_for(
                asyncio.get_running_loop().sock_recv(live.sock, 4096), max(timeout, 0.001)
            )
            slot.answer(data)
        if slot.pid is not None:
            return slot
        live.slot = None
        slot.close()
        return None

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
                memory_mb=self.box.limits.memory_cap_mb,  # the kept sandbox's, in all
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
        try:
            slot = await self._waiting(live, timeout)
        except (OSError, TimeoutError, _Gone) as e:
            log.warning("persistent sandbox: %s; the next command starts a fresh one", e)
            self._drop()
            return None
        except BaseException:  # cancelled: whether its answer was read is unknown
            self._drop()
            raise
        if slot is not None:
            live.slot = None  # this command runs in it, or the runner kills it
            if not _fits_prestarted(cmd):
                slot.close()
                slot = None
        self._seq += 1
        request: dict[str, Any] = {"seq": self._seq, "command": cmd.command}
        if slot is None:
            request |= self._setup(live, cmd.cwd)
        else:
            request["go"] = 1
        ours: list[int] = []  # our ends: stdout's and stderr's read ends, stdin's write end
        theirs: list[int] = []  # the command's: stdin, stdout, stderr
        finished = False
        tasks: list[asyncio.Task[None]] = []
        waits: list[asyncio.Future[Any]] = []  # the runner's answer, the deadline
        try:
            if slot is not None:
                ours += [slot.out, slot.err]
                try:
                    live.sock.send(json.dumps(request).encode())
                except OSError as e:
                    # Too long for one message: a fresh sandbox says what it says (the
                    # runner kills that bash with the next command). Else the runner is gone.
                    finished = e.errno == errno.EMSGSIZE
                    return None
            elif stdin is not None:
                in_r, in_w = os.pipe()
                theirs.append(in_r)
                ours.append(in_w)
            else:
                theirs.append(os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC))
            if slot is None:
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
            if self._live is live:
                # The next command's bash starts once this one has returned (its caller runs
                # on until it waits), or when the next command or next_ready comes first.
                handle = asyncio.get_running_loop().call_soon(self._prestart, live)
                self._soon = (handle, live)
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


def _fits_prestarted(cmd: KeptCommand) -> bool:
    """Whether ``cmd`` runs in a bash started ahead exactly as it would in its own: no stdin
    of its own, and :func:`~stayer.sandbox.process.fits_ahead`."""
    if cmd.stdin is not None:
        return False
    try:
        return fits_ahead(cmd.cwd, os.fsencode(cmd.command))
    except UnicodeError:
        return False


def _reply(data: bytes, key: str, seq: int, field: str) -> int | None:
    """``field`` of the runner's answer ``{key: seq, field: int or null}``; :class:`_Gone`
    if it closed the socket or said anything else."""
    try:
        reply = json.loads(data)
    except ValueError:
        reply = None
    if (
        not isinstance(reply, dict)
        or reply.get(key) != seq
        or not (reply.get(field) is None or type(reply.get(field)) is int)
    ):
        raise _Gone(f"the runner answered {data[:80]!r}")
    return reply[field]


async def _answer(sock: socket.socket, seq: int) -> int:
    """The wait status the runner reports for command ``seq``; :class:`_Gone` if it closes
    the socket or says anything else."""
    data = await asyncio.get_running_loop().sock_recv(sock, 4096)
    status = _reply(data, "seq", seq, "status")
    if status is None:
        raise _Gone(f"the runner answered {data[:80]!r}")
    return status


async def _in_time(answer: asyncio.Future[int], timeout: float) -> bool:
    """Whether ``answer`` came (or failed) within ``timeout``."""
    done, _ = await asyncio.wait({answer}, timeout=timeout)
    return bool(done)

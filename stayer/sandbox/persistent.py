"""A bubblewrap sandbox kept running between commands (``--sandbox bwrap-persistent``).

The sandbox starts once, with exactly the options, seccomp filter, limits and cgroup of a
per-command one, and a runner inside it (:mod:`stayer.sandbox.runner`) starts each
command in its own session with the environment allow-list, its directory and rlimits,
on pipes created here and passed over a socket (``SCM_RIGHTS``): :func:`~stayer.sandbox.
process.run_command` reads the command's own output, holds its deadline and storage
watch. Nothing a command starts outlives it (the runner, a child subreaper, kills and
reaps all of it). Each command's bash is started ahead, once the command before returned.
On a timeout, a storage limit, a cancellation, a runner gone or answering out of turn the
whole sandbox is killed and the next command starts a fresh one; so does a command with
mounts of its own, or any when the runner cannot start. ``/tmp`` and the pid namespace
last between commands. The runner is non-dumpable and its socket closed in each command:
docs/sandbox.md and SECURITY.md say why and what else differs from a fresh sandbox.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import errno
import functools
import json
import logging
import os
import select
import signal
import socket
import subprocess
import weakref
from dataclasses import dataclass
from pathlib import Path

import msgspec

from stayer.sandbox.ahead import Starts, spawn
from stayer.sandbox.base import ExecResult
from stayer.sandbox.janitor import JANITOR
from stayer.sandbox.process import (
    AHEAD_CWD,
    Command,
    ProcessLimits,
    _PidsCgroup,
    _rlimits,
    confine_and_release_now,
    fits_ahead,
    run_command,
)

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


@functools.cache
def runner_code() -> bytes:
    """The runner's program, :mod:`stayer.sandbox.runner`'s file as shipped."""
    return (Path(__file__).parent / "runner.py").read_bytes()


class _Setup(msgspec.Struct, kw_only=True):
    """What the runner sets up for a command, as a fresh sandbox would: its directory,
    environment and rlimits (runner.py's ``Setup``); keyword-only, so sent after the
    fields of the request that holds them."""

    cwd: str
    env: dict[str, str]
    rlimits: list[tuple[int, int]]


class _Ahead(_Setup):
    """Start command ``ahead``'s bash now (runner.py's ``Ahead``)."""

    ahead: int


class _Run(_Setup):
    """Run command ``seq`` in a bash of its own (runner.py's ``Run``)."""

    seq: int
    command: str


class _Go(msgspec.Struct):
    """Run command ``seq`` in the bash started ahead for it (runner.py's ``Go``)."""

    seq: int
    command: str
    go: int = 1


def _message(request: _Ahead | _Run | _Go) -> bytes:
    """``request`` as the runner reads it: the standard library's JSON (its ``\\u``
    escapes carry a command's lone surrogates, which UTF-8 cannot)."""
    return json.dumps(msgspec.to_builtins(request)).encode()


class _Gone(Exception):
    """The runner stopped answering, or answered something else than asked."""


@dataclass
class _Slot:
    """The next command's bash, started ahead in the sandbox: our ends of its stdout and
    stderr; once the runner has answered, its pid in the sandbox (None: it could not
    start)."""

    seq: int
    out: int
    err: int
    answered: bool = False
    pid: int | None = None

    def answer(self, data: bytes) -> None:
        """Take the runner's answer about this bash; :class:`_Gone` if it is not one."""
        self.pid, self.answered = _reply(data, "ahead", self.seq, "pid"), True

    def close(self) -> None:
        """Close our ends, unless a command took them (:meth:`take`)."""
        for fd in self.take():
            with contextlib.suppress(OSError):
                os.close(fd)

    def take(self) -> tuple[int, ...]:
        """Our ends, now the caller's to close (none if already taken)."""
        fds = (self.out, self.err) if self.out >= 0 else ()
        self.out = self.err = -1
        return fds


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


class _InRunner:
    """A command the runner runs: over when it reports the command's status."""

    def __init__(
        self,
        owner: PersistentBwrap,
        live: _Live,
        seq: int,
        fds: tuple[int, int, int | None],
    ) -> None:
        self.owner, self.live, self.seq = owner, live, seq
        self.stdout, self.stderr, self.stdin = fds
        self.note = ""
        self.answered = self.stopped = False

    async def wait(self) -> int:
        try:
            status = await _answer(self.live.sock, self.seq)
        except (OSError, _Gone):
            if not self.stopped:
                self.note = (
                    "\n[the sandbox's command runner stopped during this command (was it "
                    "killed?): the sandbox was stopped, and the next command starts a fresh "
                    "one]\n"
                )
                self.owner.drop(self.live)
            return 128 + signal.SIGKILL
        self.answered = True
        if os.WIFEXITED(status):
            return os.WEXITSTATUS(status)
        return 128 + (os.WTERMSIG(status) if os.WIFSIGNALED(status) else signal.SIGKILL)

    def stop(self) -> None:
        self.stopped = True
        if not self.answered:  # everything in it dies; the next command gets a fresh one
            self.owner.drop(self.live)

    def stragglers(self) -> bool:
        log.warning("a command of the persistent sandbox left its output open")
        self.owner.drop(self.live)
        return True

    async def close(self) -> None:
        pass


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


class PersistentBwrap:
    """The persistent sandbox of a :class:`~stayer.sandbox.bwrap.BwrapSandbox` (see the
    module docstring); one command at a time (``busy``)."""

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

    async def run(self, cmd: Command) -> ExecResult | None:
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
                self._start_ahead(self._live)
            return await self._run(self._live, cmd)
        finally:
            self.busy = False

    async def close(self) -> None:
        """Kill the persistent sandbox (pid 1 and all) and wait until it is gone; the next
        command starts a fresh one."""
        if self._soon is not None:
            self._soon[0].cancel()
            self._soon = None
        self._drop()
        while self._dead:
            await self._dead.pop().reap()

    def next_ready(self, timeout: float | None = None) -> bool:
        """Whether the sandbox is running with the next command's bash started and
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

    def drop(self, live: _Live) -> None:
        """Kill ``live`` now if it is still the sandbox; the next command starts a fresh one."""
        if self._live is live:
            self._drop()

    def _start_next_now(self) -> None:
        """Start the next command's bash now if it is still to start."""
        if self._soon is not None:
            handle, live = self._soon
            handle.cancel()
            self._start_ahead(live)

    def _start_ahead(self, live: _Live) -> None:
        """Have the runner start the next command's bash now (it waits in
        :data:`~stayer.sandbox.runner.AHEAD`), with /dev/null for stdin and our pipes for
        its output, as a command in ``/app`` without stdin of its own would get them."""
        self._soon = None
        if self._live is not live or live.slot is not None:
            return  # dropped since, or started
        try:
            env, rlimits = self._setup(live)
        except ReferenceError:  # the sandbox is gone (its finaliser kills this one)
            return
        if "BASH_ENV" in env:  # bash reads it as it starts: the command's to read
            return
        self._seq += 1
        request = _message(_Ahead(self._seq, cwd=AHEAD_CWD, env=env, rlimits=rlimits))
        ours: list[int] = []
        theirs = [os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)]
        try:
            for _ in range(2):
                r, w = os.pipe()
                ours.append(r)
                theirs.append(w)
            socket.send_fds(live.sock, [request], theirs)
        except OSError as e:  # the runner is gone: the next command finds out
            log.debug("persistent sandbox: no command started ahead: %s", e)
            for fd in ours:
                os.close(fd)
            return
        finally:
            for fd in theirs:
                os.close(fd)
        live.slot = _Slot(self._seq, ours[0], ours[1])

    def _setup(self, live: _Live) -> tuple[dict[str, str], list[tuple[int, int]]]:
        """The environment and rlimits the runner sets up for a command of ``live``."""
        return self.box.env, _rlimits(self.box.limits, live.cgroup)

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
                # the persistent sandbox's memory, in all; the runner's process on top
                limits=dataclasses.replace(
                    self.box.limits, max_processes=None if own is None else own + _RUNNER_PROCESSES
                ),
                stdio=(subprocess.DEVNULL,) * 3,
                pass_fds=(runner_end.fileno(),),
            )
        except BaseException as e:
            host_end.close()
            if not isinstance(e, OSError):
                raise
            log.warning("the persistent sandbox could not start (%s): one per command", e)
            return None
        finally:
            runner_end.close()
        live = _Live(sp.proc, host_end, sp.cgroup, sp.view, sp.held)
        self._lives.append(live)

        def finish() -> None:
            try:
                host_end.send(runner_code())
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
            log.warning("the persistent sandbox could not start (%s): one per command", e)
            self._lives.remove(live)
            await live.reap()
            return None
        except BaseException:
            self._lives.remove(live)
            live.kill()
            self._dead.append(live)
            raise

    async def _run(self, live: _Live, cmd: Command) -> ExecResult | None:
        """The command's result; None if it could not be handed to the runner."""
        try:
            slot = await self._waiting(live, cmd.timeout)
        except (OSError, TimeoutError, _Gone) as e:
            log.warning("persistent sandbox: %s; the next command starts a fresh one", e)
            self._drop()
            return None
        except BaseException:  # cancelled: whether its answer was read is unknown
            self._drop()
            raise
        if slot is not None:
            live.slot = None  # this command runs in it, or the runner kills it
            if not _fits_ahead(cmd):
                slot.close()
                slot = None
        try:
            result = await run_command(
                functools.partial(self._hand_over, live, cmd, slot),
                timeout=cmd.timeout,
                stdin=cmd.stdin,
                max_output_bytes=cmd.max_output_bytes,
                storage=cmd.storage,
            )
        except BaseException as e:
            if slot is not None:  # not handed over: its pipes are still ours
                slot.close()
            if isinstance(e, (OSError, ValueError)):  # the socket broke, or pipes: no pipes
                log.warning("persistent sandbox: %s; the next command starts a fresh one", e)
            self._drop()  # cancelled, or broken: killed before propagating
            raise
        if result is not None and self._live is live:
            # The next command's bash starts once this one has returned (its caller runs
            # on until it waits), or when the next command or next_ready comes first.
            handle = asyncio.get_running_loop().call_soon(self._start_ahead, live)
            self._soon = (handle, live)
        return result

    async def _hand_over(self, live: _Live, cmd: Command, slot: _Slot | None) -> _InRunner | None:
        """``cmd`` sent to the runner: to run in ``slot``'s bash, or in one started for it
        on pipes made here. None when it could not be sent: too long for one message
        (about 200 KiB, where bash -c refuses 128 KiB anyway: a fresh sandbox says what it
        says), or the runner is gone (the sandbox is dropped)."""
        self._seq += 1
        ours: list[int] = []  # stdout's and stderr's read ends, stdin's write end
        theirs: list[int] = []  # the command's: stdin, stdout, stderr
        try:
            if slot is not None:
                ours += slot.take()
                live.sock.send(_message(_Go(self._seq, cmd.command)))
            else:
                if cmd.stdin is not None:
                    in_r, in_w = os.pipe()
                    theirs.append(in_r)
                    ours.append(in_w)
                else:
                    theirs.append(os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC))
                for _ in range(2):
                    r, w = os.pipe()
                    ours.append(r)
                    theirs.append(w)
                env, rlimits = self._setup(live)
                request = _Run(self._seq, cmd.command, cwd=cmd.cwd, env=env, rlimits=rlimits)
                socket.send_fds(live.sock, [_message(request)], theirs)
        except OSError as e:
            for fd in ours:
                os.close(fd)
            if e.errno != errno.EMSGSIZE:
                log.warning("persistent sandbox: %s; the next command starts a fresh one", e)
                self._drop()
            return None
        finally:
            for fd in theirs:
                os.close(fd)
        stdin = ours[0] if len(ours) == 3 else None
        return _InRunner(self, live, self._seq, (ours[-2], ours[-1], stdin))


def _fits_ahead(cmd: Command) -> bool:
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

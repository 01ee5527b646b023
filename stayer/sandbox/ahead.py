"""A fresh bubblewrap sandbox per command, started ahead (``--sandbox bwrap``'s default).

As soon as a command ends, the next command's sandbox is started exactly as it would be
for it (:meth:`~stayer.sandbox.bwrap.BwrapSandbox.started`: options, seccomp filter,
pids cgroup, rlimits before anything runs in it) and waits in a shell (:data:`READER`)
for its command, which it ``exec`` s as ``/bin/bash -c COMMAND``: pid 2 under bwrap's
pid 1, as in a sandbox started for it. Each sandbox takes one command. One is used only
while the host has not changed under it (:meth:`~stayer.sandbox.bwrap.BwrapSandbox.
hold_host`), for a command in ``/app`` without mounts of its own; else the command gets
a sandbox started for it (:meth:`AheadBwrap.run` returns None). The deadline counts from
when the command is handed over. docs/sandbox.md says why.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import subprocess
import threading
import weakref
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Protocol

from stayer.sandbox.base import ExecResult, Mount
from stayer.sandbox.janitor import JANITOR
from stayer.sandbox.process import (
    Command,
    Launch,
    ProcessLimits,
    StartGate,
    _kill_group,
    _PidsCgroup,
    born_in,
    confine_and_release_now,
    fits_ahead,
    new_cgroup,
    run_command,
    shell_code,
    wait_fd,
)

log = logging.getLogger(__name__)


class Starts(Protocol):
    """What a sandbox started ahead, or a persistent one, needs of its
    :class:`~stayer.sandbox.bwrap.BwrapSandbox`."""

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
    limits: ProcessLimits,
    stdio: tuple[int, int, int],
    pass_fds: tuple[int, ...] = (),
) -> Spawned:
    """Start bwrap for ``program`` in a sandbox of ``box`` in ``/app``, in a cgroup of its
    own from birth with ``limits``'s processes and memory, held at its gate (the caller
    applies the rlimits and releases it). bwrap's ``--die-with-parent`` is tied to the
    calling thread: the sandbox lasts as long as that thread does."""
    cgroup = new_cgroup(limits)
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


# What the sandbox runs until its command comes: one byte on the go pipe (1: the command
# has stdin on a pipe, 0: it reads /dev/null), then the command from the memory file,
# NUL-ended. Its descriptors are closed before the command runs. Variables are not
# exported: the command's environment is the sandbox's.
READER = (
    "IFS= read -r -N 1 go <&{go} || exit 125\n"
    "IFS= read -r -d '' c <&{text}\n"
    "exec {go}<&- {text}<&-\n"
    '[ "$go" = 1 ] || exec </dev/null\n'
    'exec /bin/bash -c "$c"\n'
)


class _Ahead:
    """One sandbox started ahead: bwrap waiting in :data:`READER`, our ends of its pipes
    and its cgroup, and the view of the host it holds. Killing is synchronous (finaliser)."""

    def __init__(
        self,
        proc: subprocess.Popen[bytes],
        fds: dict[str, int],
        cgroup: _PidsCgroup | None,
        view: object,
        held: contextlib.ExitStack,
    ) -> None:
        self.proc = proc
        self.fds = fds  # ours: "text" (memory file), "go", "stdin", "stdout", "stderr"
        self.cgroup = cgroup
        self.view = view
        self.held = held
        self.exit_fd = os.pidfd_open(proc.pid)  # readable once bwrap has exited
        self._closing = threading.Lock()

    def kill(self) -> None:
        _kill_group(self.proc.pid)
        if self.cgroup is not None:
            self.cgroup.kill_all()

    def close(self) -> None:
        """Kill it and let go of all it holds (the cgroup is :meth:`reap`'s). Once only,
        whichever thread comes first (a descriptor closed twice may be another's by then)."""
        self.kill()
        with self._closing:
            fds, self.fds = [*self.fds.values(), self.exit_fd], {}
            self.exit_fd = -1
        for fd in fds:
            if fd >= 0:
                with contextlib.suppress(OSError):
                    os.close(fd)
        self.held.close()

    def reap(self) -> None:
        """Kill it, wait for it and remove its cgroup (blocking: for a thread)."""
        self.kill()
        self.proc.wait()
        self.close()
        if self.cgroup is not None:
            self.cgroup.remove_now()


class _HandedOver:
    """The command running in a sandbox started ahead: it exits with bwrap."""

    note = ""

    def __init__(self, ahead: _Ahead) -> None:
        self.ahead = ahead
        self.stdout, self.stderr = ahead.fds.pop("stdout"), ahead.fds.pop("stderr")
        self.stdin: int | None = ahead.fds.pop("stdin")

    async def wait(self) -> int:
        await wait_fd(self.ahead.exit_fd)
        return shell_code(self.ahead.proc.wait())

    def stop(self) -> None:
        self.ahead.kill()

    def stragglers(self) -> bool:
        return False

    async def close(self) -> None:
        pass  # buried by AheadBwrap.run


def _close_all(aheads: list[_Ahead], threads: ThreadPoolExecutor, pid: int) -> None:
    """At the owner's end (a finaliser: it runs in any thread, perhaps one holding the
    executor's locks, so it takes none): each sandbox killed now; its reaping and the
    threads' end are the janitor's jobs. In a copy made by fork, nothing here is its own."""
    if os.getpid() != pid:
        return
    for one in list(aheads):
        one.kill()
        JANITOR.put(one.reap)
    JANITOR.put(functools.partial(threads.shutdown, wait=False))


class AheadBwrap:
    """Sandboxes of a :class:`~stayer.sandbox.bwrap.BwrapSandbox` started ahead, one at a
    time (see the module docstring); one command at a time (``busy``)."""

    def __init__(self, box: Starts) -> None:
        self.box = box
        self.busy = False
        self._next: Future[_Ahead] | None = None  # the next command's, starting or ready
        self._broken = False  # one could not start: each command starts its own
        self._live: list[_Ahead] = []  # what the finaliser kills: all not reaped yet
        # Two threads of its own start the sandboxes and reap them, whatever the caller
        # does meanwhile (even work that gives its event loop no turn). bwrap's
        # --die-with-parent is tied to the thread that starts it: these live as long as
        # this object does, and a sandbox whose thread is gone is not used.
        self._threads = ThreadPoolExecutor(max_workers=2, thread_name_prefix="stayer-ahead")
        self._pid = os.getpid()  # a copy made by fork has neither the threads nor the children
        JANITOR.ready()
        weakref.finalize(self, _close_all, self._live, self._threads, self._pid)

    async def run(self, cmd: Command) -> ExecResult | None:
        """``cmd``'s result, in the sandbox started for it; None when none is ready and fit
        (the caller starts one). Either way the next one starts before this returns."""
        if os.getpid() != self._pid:
            return None
        self.busy = True
        try:
            text = os.fsencode(cmd.command)
            ahead = await self._take(cmd, text)
            return None if ahead is None else await self._run(ahead, cmd, text)
        finally:
            self.busy = False
            self._start_next()

    async def close(self) -> None:
        """Kill the sandbox started ahead, and any not reaped yet, and wait until they are
        gone; the next command gets a sandbox started for it."""
        starting, self._next = self._next, None
        if starting is not None:
            await asyncio.wait({asyncio.wrap_future(starting)})
        for ahead in list(self._live):
            ahead.kill()
            try:
                await asyncio.wrap_future(self._threads.submit(self._reap, ahead))
            except RuntimeError:  # its threads are shut down (at exit): in one of asyncio's
                await asyncio.to_thread(self._reap, ahead)

    def next_ready(self, timeout: float | None = None) -> bool:
        """Wait until the next command's sandbox has started (up to ``timeout`` s);
        whether it has (not if it failed, or none is starting)."""
        starting = self._next
        if starting is None:
            return False
        try:
            starting.result(timeout)
        except Exception:  # it failed (the command will say how), or not in time
            return False
        return True

    async def _take(self, cmd: Command, text: bytes) -> _Ahead | None:
        """The sandbox started for the next command, if it fits ``cmd`` (``text``: its
        command, encoded) and the host is as it shows; None else (one that did not fit the
        host is killed)."""
        if self._next is None or not fits_ahead(cmd.cwd, text):
            return None
        starting, self._next = self._next, None
        try:
            # Started when the last command ended: nearer its end than a new one is.
            await asyncio.wait({asyncio.wrap_future(starting)}, timeout=max(cmd.timeout, 0.001))
        finally:
            if not starting.done():  # cancelled, or too slow: killed once started
                starting.add_done_callback(self._bury_started)
        if not starting.done():
            return None
        try:
            ahead = starting.result()
        except Exception as e:
            log.warning("a sandbox started ahead failed (%s): one per command now", e)
            self._broken = True
            return None
        with self.box.hold_host() as now:
            stale = now != ahead.view
        if stale or ahead.proc.poll() is not None:
            self._bury(ahead)
            return None
        return ahead

    async def _run(self, ahead: _Ahead, cmd: Command, text: bytes) -> ExecResult | None:
        """``cmd``'s result in ``ahead``; None if it could not be handed over."""
        try:
            return await run_command(
                functools.partial(self._hand_over, ahead, text, cmd.stdin is not None),
                timeout=cmd.timeout,
                stdin=cmd.stdin,
                max_output_bytes=cmd.max_output_bytes,
                storage=cmd.storage,
            )
        finally:
            self._bury(ahead)  # killed now if it still runs (cancelled, not handed over)

    async def _hand_over(self, ahead: _Ahead, text: bytes, stdin: bool) -> _HandedOver | None:
        """The command (``text``) handed to ``ahead``; None if it died since it was taken."""
        try:
            os.pwrite(ahead.fds["text"], text + b"\0", 0)
            os.write(ahead.fds["go"], b"1" if stdin else b"0")
        except OSError as e:
            log.warning("a sandbox started ahead died (%s): one started for the command", e)
            return None
        return _HandedOver(ahead)

    def _start_next(self) -> None:
        if not self._broken and self._next is None:
            self._next = self._threads.submit(self._spawn)

    def _bury(self, ahead: _Ahead) -> None:
        """Kill ``ahead`` now and reap it in a thread (removing a cgroup may wait in the
        kernel behind the next sandbox's start)."""
        ahead.kill()
        with contextlib.suppress(RuntimeError):  # shut down, at exit: the finaliser closes it
            self._threads.submit(self._reap, ahead)

    def _bury_started(self, starting: Future[_Ahead]) -> None:
        if not starting.cancelled() and starting.exception() is None:
            self._bury(starting.result())

    def _reap(self, ahead: _Ahead) -> None:
        try:
            ahead.reap()
        except OSError as e:
            log.warning("could not clean up a sandbox: %s", e)
        with contextlib.suppress(ValueError):
            self._live.remove(ahead)

    def _spawn(self) -> _Ahead:
        """A new sandbox waiting for its command (in one of this object's threads)."""
        box = self.box
        ours: dict[str, int] = {}
        theirs: dict[str, int] = {}
        try:
            text = os.memfd_create("stayer-command", os.MFD_CLOEXEC)
            ours["text"] = theirs["text"] = text  # the same file: written here, read there
            theirs["go"], ours["go"] = os.pipe()
            theirs["stdin"], ours["stdin"] = os.pipe()
            ours["stdout"], theirs["stdout"] = os.pipe()
            ours["stderr"], theirs["stderr"] = os.pipe()
            reader = READER.format(go=theirs["go"], text=text)
            try:
                sp = spawn(
                    box,
                    ["/bin/bash", "-c", reader],
                    limits=box.limits,
                    stdio=(theirs["stdin"], theirs["stdout"], theirs["stderr"]),
                    pass_fds=(text, theirs["go"]),
                )
            finally:
                for name, fd in theirs.items():
                    if name != "text":
                        os.close(fd)
                theirs.clear()
        except BaseException:
            for fd in {*ours.values(), *theirs.values()}:
                with contextlib.suppress(OSError):
                    os.close(fd)
            raise
        ahead = _Ahead(sp.proc, ours, sp.cgroup, sp.view, sp.held)
        self._live.append(ahead)
        try:
            if not confine_and_release_now(sp.gate, box.limits, sp.cgroup):
                raise OSError("bwrap did not start")
        except BaseException:
            self._reap(ahead)
            raise
        finally:
            sp.starting.close()
        return ahead

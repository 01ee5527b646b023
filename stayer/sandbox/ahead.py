"""A fresh bubblewrap sandbox per command, started ahead (``--sandbox bwrap``'s default).

Setting up bubblewrap's namespaces and mounts takes 5–10 ms, several times the command
itself for most tool calls, and the caller waited for it. Here the sandbox of the next
command is started as soon as a command ends, exactly as it would be started for it
(:meth:`~stayer.sandbox.bwrap.BwrapSandbox.started`: options, seccomp filter, pids cgroup,
rlimits applied before anything runs in it), and holds still in a shell that waits for
its command (:data:`READER`). The command, when it comes, is written to a memory file
the shell reads, and the shell ``exec`` s ``/bin/bash -c COMMAND``: the command runs as
pid 2 under bwrap's pid 1, with the same environment, directory, descriptors and limits
as in a sandbox started for it, and the sandbox ends with it. Each sandbox takes one
command; nothing lasts from one to the next.

A sandbox started ahead is used only while the host has not changed under it
(:meth:`~stayer.sandbox.bwrap.BwrapSandbox.hold_host`: the copy of ``/etc`` it mounts, the
workspace directory it binds), for a command in ``/app`` without mounts of its own; else,
while the next one is still starting, or if it died, the command gets a sandbox started
for it (:meth:`AheadBwrap.run` returns None). The deadline counts from when the command
is handed over.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import subprocess
import threading
import time
import weakref
from concurrent.futures import Future, ThreadPoolExecutor

from stayer.sandbox.base import ExecResult
from stayer.sandbox.janitor import JANITOR
from stayer.sandbox.kept import Starts, spawn
from stayer.sandbox.process import (
    _DRAIN_GRACE_S,
    KeptCommand,
    _Capture,
    _kill_group,
    _PidsCgroup,
    captured_result,
    confine_and_release_now,
    drain_fd,
    feed_fd,
    fits_ahead,
    storage_baseline,
    storage_verdict,
    wait_fd,
    watch_storage,
)

log = logging.getLogger(__name__)

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

    async def wait_exit(self) -> None:
        await wait_fd(self.exit_fd, writable=False)
        self.proc.wait()

    def reap(self) -> None:
        """Kill it, wait for it and remove its cgroup (blocking: for a thread)."""
        self.kill()
        self.proc.wait()
        self.close()
        if self.cgroup is not None:
            self.cgroup.remove_now()


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

    async def run(self, cmd: KeptCommand) -> ExecResult | None:
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

    async def _take(self, cmd: KeptCommand, text: bytes) -> _Ahead | None:
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
                    max_processes=box.limits.max_processes,
                    memory_mb=box.limits.memory_cap_mb,
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

    async def _run(self, ahead: _Ahead, cmd: KeptCommand, text: bytes) -> ExecResult | None:
        """``cmd``'s result in ``ahead``; None if it could not be handed over (the sandbox
        died since it was taken)."""
        storage = cmd.storage
        storage_cap = await storage_baseline(storage)
        out, err = _Capture(cmd.max_output_bytes), _Capture(cmd.max_output_bytes)
        fds = ahead.fds
        start = time.monotonic()
        tasks: list[asyncio.Task[None]] = []
        storage_used: int | None = None
        try:
            try:
                os.pwrite(fds["text"], text + b"\0", 0)
                os.write(fds["go"], b"1" if cmd.stdin is not None else b"0")
            except OSError as e:
                log.warning("a sandbox started ahead died (%s): one started for the command", e)
                return None
            tasks = [
                asyncio.create_task(drain_fd(fds.pop("stdout"), out)),
                asyncio.create_task(drain_fd(fds.pop("stderr"), err)),
            ]
            stdin_end = [fds.pop("stdin")]
            if cmd.stdin is not None:
                tasks.append(asyncio.create_task(feed_fd(stdin_end, cmd.stdin)))
            else:
                os.close(stdin_end.pop())
            exited = asyncio.ensure_future(_exits_in_time(ahead, max(cmd.timeout, 0.001)))
            if storage is None:
                timed_out = not await exited
            else:
                timed_out, storage_used = await watch_storage(exited, storage.path, storage_cap)
            exited.cancel()
            # Its reader of the exit descriptor goes before another is registered (the
            # event loop keeps one per descriptor, and its removal would take the new one).
            await asyncio.wait({exited})
            # Whether it finished or not: nothing it started may outlive the call.
            ahead.kill()
            if ahead.proc.returncode is None:
                await ahead.wait_exit()
            _done, pending = await asyncio.wait(tasks, timeout=_DRAIN_GRACE_S)
            if pending:  # a straggler escaped the group and still holds a pipe open
                log.warning("a process started by %.80r outlived it, holding its output", cmd)
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            self._bury(ahead)  # killed now if it still runs (cancelled, not handed over)
        code = ahead.proc.returncode
        assert code is not None
        if code < 0:  # killed by a signal: report it the way a shell would
            code = 128 - code
        code, stderr_text = await storage_verdict(
            storage, storage_cap, storage_used, code, err.text()
        )
        return captured_result(code, out, err, stderr_text, timed_out=timed_out, start=start)


async def _exits_in_time(ahead: _Ahead, timeout: float) -> bool:
    """Whether bwrap exits within ``timeout`` (it exits with the command)."""
    try:
        async with asyncio.timeout(timeout):
            await ahead.wait_exit()
        return True
    except TimeoutError:
        return False

"""Clean-up that finalisers hand off: one thread per process does it.

A finaliser (``weakref.finalize``) runs wherever the garbage collector happens to run: in
any thread, between any two bytecodes, perhaps while that thread holds a lock the clean-up
would take (an executor's shutdown lock, the lock of the ``/etc`` copies): taking it there
deadlocks the thread on itself. So the sandboxes' finalisers only do what takes no lock
(a signal, a write to ``cgroup.kill``) and put the rest, which blocks (waiting for a
process, closing what it held, removing its cgroup), here. ``SimpleQueue.put`` is safe to
call from a finaliser (it is reentrant and takes no Python-level lock).

The thread is started by :meth:`Janitor.ready`, which owners call when they are made (a
finaliser must not start a thread: that takes locks too), again in a process made by
``fork`` (it has no copy of the thread). At the interpreter's exit the jobs left are done
before it ends (for up to 30 s); a job put after that is done at once, by whoever puts it.
"""

from __future__ import annotations

import atexit
import logging
import os
import queue
import threading
from collections.abc import Callable

log = logging.getLogger(__name__)

Job = Callable[[], object]

# At exit, how long the jobs left may take: each waits for processes already killed, which
# takes milliseconds; a job stuck (a process the kernel does not let die) must not keep the
# interpreter from ending for good.
_EXIT_WAIT_S = 30


class Janitor:
    """A queue of clean-up jobs and the one daemon thread that runs them."""

    def __init__(self) -> None:
        self._jobs: queue.SimpleQueue[Job | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._pid = -1  # the process whose thread _thread is
        self._closed = False  # the exit's drain has run: jobs are done by who puts them
        self._lock = threading.Lock()  # for ready(), never taken by put()

    def ready(self) -> None:
        """Start the thread in this process, if it is not running yet."""
        pid = os.getpid()
        if self._pid == pid:
            return
        with self._lock:
            if self._pid == pid:
                return
            if self._pid == -1:
                atexit.register(self._drain)
            # A copy made by fork: the parent's jobs are not this process's to do.
            self._jobs = queue.SimpleQueue()
            self._closed = False
            self._thread = threading.Thread(target=self._work, name="stayer-janitor", daemon=True)
            self._thread.start()
            self._pid = pid

    def put(self, job: Job) -> None:
        """Have ``job`` done soon, in the janitor's thread. Takes no lock: safe in a
        finaliser."""
        if self._closed and self._pid == os.getpid():
            _do(job)
        else:
            self._jobs.put(job)

    def _work(self) -> None:
        jobs = self._jobs
        while (job := jobs.get()) is not None:
            _do(job)

    def _drain(self) -> None:
        """At exit: the jobs left, done before the interpreter ends (its daemon threads
        end with it, wherever they are)."""
        if self._pid != os.getpid() or self._thread is None:
            return
        self._closed = True
        self._jobs.put(None)
        self._thread.join(_EXIT_WAIT_S)
        if self._thread.is_alive():
            log.warning(
                "sandbox clean-up still running after %d s at exit: left to the next start "
                "(stayer removes the cgroups of processes gone)",
                _EXIT_WAIT_S,
            )


def _do(job: Job) -> None:
    try:
        job()
    except Exception as e:  # one failed clean-up must not stop the others
        log.warning("sandbox clean-up failed: %s", e)


# The process's janitor. A process has one, as it has one garbage collector: each
# sandbox's finaliser may run in any thread, and needs a thread it can rely on.
JANITOR = Janitor()

"""The persistent sandbox's command runner: the program that runs inside it.

Not imported by stayer's own code: :mod:`stayer.sandbox.persistent` sends this file's
text over the control socket, and the sandbox's ``python3 -I -S`` runs it (so no host
path shows in its command line), with ``ctl`` (that socket) among its globals. Each
message on ``ctl`` is one command (JSON) with its stdin, stdout and stderr attached; the
answer is ``{"seq": n, "status": wait status}``, sent once every process the command left
is gone. ``{"ahead": n}`` with the next command's descriptors starts that command's bash
ahead, in :data:`AHEAD`, answered ``{"ahead": n, "pid": pid}`` once it waits (pid null: it
could not start); then ``{"seq": n, "go": 1, "command": ...}`` (no descriptors) runs the
command in it. Anything else ends the runner, and with it the sandbox. Standard library
only: it runs under the sandbox's own ``/usr/bin/python3``, without stayer.
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import json
import os
import resource
import signal
import socket
import sys
import time
from collections.abc import Sequence
from typing import TypedDict

# What a command's bash started ahead runs (fd 3: its text, until EOF; fd 4: closed once
# it waits), on one line so that ``$LINENO`` counts from the command's first line: the
# text read whole (``read -N`` reads a pipe in blocks, else byte by byte) and run by eval,
# so that the command sees what ``bash -c COMMAND`` shows it (``$0``, ``$-``, ``$_``,
# ``$BASH_EXECUTION_STRING``, ``$SECONDS`` from 0, its exit status). ``TMOUT=``: the read
# waits whatever the environment sets.
AHEAD = (
    "exec 4>&-; TMOUT= IFS= read -r -N 1000000000 BASH_EXECUTION_STRING <&3; exec 3<&-; "
    'SECONDS=0; : "$0"; eval "$BASH_EXECUTION_STRING"'
)
_PR_SET_DUMPABLE, _PR_SET_CHILD_SUBREAPER = 4, 36


class Setup(TypedDict):
    """What a command's process gets, as in a fresh sandbox: directory, environment, and
    ``[RLIMIT_*, value]`` pairs (soft = hard)."""

    cwd: str
    env: dict[str, str]
    rlimits: list[list[int]]


class Ahead(Setup):
    """Start command ``ahead``'s bash now, to wait in :data:`AHEAD` (descriptors attached)."""

    ahead: int


class Run(Setup):
    """Run command ``seq`` in a bash of its own (descriptors attached)."""

    seq: int
    command: str


class Go(TypedDict):
    """Run command ``seq`` in the bash started ahead for it (``go``: 1; no descriptors)."""

    seq: int
    command: str
    go: int


Waiting = tuple[int, int]  # a bash started ahead: its pid, the write end of its text pipe


def child(req: Setup, fds: Sequence[int], argv: list[str], extra: Sequence[int] = ()) -> None:
    """In a forked child: become the command (``argv``) as ``req`` says; never returns."""
    try:
        os.setsid()
        # Out of the way of the targets first: 0-2 for stdio, 3 on for ``extra``.
        moved = [fcntl.fcntl(fd, fcntl.F_DUPFD, 64) for fd in (*fds, *extra)]
        for target, fd in enumerate(moved):
            os.dup2(fd, target)
        os.closerange(len(moved), 1 << 20)
        for sig in (signal.SIGPIPE, signal.SIGXFSZ):  # Python ignores them; a shell must not
            signal.signal(sig, signal.SIG_DFL)
        for which, value in req["rlimits"]:
            resource.setrlimit(which, (value, value))
        try:
            os.chdir(req["cwd"])
        except OSError as e:
            os.write(2, f"bwrap: Can't chdir to {req['cwd']}: {e.strerror}\n".encode())
            os._exit(1)
        os.execve("/bin/bash", argv, req["env"])
    except BaseException as e:
        os.write(2, f"stayer runner: {e!r}\n".encode())
    os._exit(127)


def clean() -> None:
    """Kill every process of the sandbox but pid 1 and this one, until none is left."""
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


def start_ahead(req: Ahead, fds: Sequence[int]) -> Waiting | None:
    """The next command's bash, waiting on a pipe for its text; ready once it closes fd 4."""
    text_r, text_w = os.pipe()
    ready_r, ready_w = os.pipe()
    try:
        pid = os.fork()
    except OSError:
        pid = -1
    if pid == 0:
        child(req, fds, ["/bin/bash", "-c", AHEAD], (text_r, ready_w))
    for fd in (*fds, text_r, ready_w):
        os.close(fd)
    while os.read(ready_r, 64):
        pass
    os.close(ready_r)
    if pid < 0:
        os.close(text_w)
        return None
    return pid, text_w


def go(req: Go, waiting: Waiting) -> int:
    """Hand ``req``'s command to the bash started ahead for it; its pid."""
    pid, text_w = waiting
    with contextlib.suppress(OSError):  # it died: its status says how
        os.write(text_w, os.fsencode(req["command"]))  # blocks until bash has read the rest
    os.close(text_w)
    return pid


def drop(waiting: Waiting | None) -> None:
    if waiting is not None:
        os.kill(waiting[0], signal.SIGKILL)
        os.waitpid(waiting[0], 0)
        os.close(waiting[1])


def main(ctl: socket.socket) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    # Not dumpable first: no ptrace, no /proc/<pid>/fd, no pidfd_getfd for the commands.
    # A child subreaper: what a command leaves behind is reparented here, to be reaped.
    if libc.prctl(_PR_SET_DUMPABLE, 0, 0, 0, 0) or libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0):
        sys.exit(3)
    os.set_inheritable(ctl.fileno(), False)
    ctl.send(b"ready")
    waiting: Waiting | None = None
    while True:
        msg, fds, _flags, _addr = socket.recv_fds(ctl, 1 << 20, 3)
        if not msg:
            os._exit(0)
        req = json.loads(msg)
        if "ahead" in req and len(fds) == 3 and waiting is None:
            waiting = start_ahead(req, fds)
            pid = None if waiting is None else waiting[0]
            ctl.send(json.dumps({"ahead": req["ahead"], "pid": pid}).encode())
            continue
        if req.get("go") and not fds and waiting is not None:
            pid, waiting = go(req, waiting), None
        elif len(fds) == 3 and "ahead" not in req:
            drop(waiting)
            waiting = None
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


if __name__ == "__main__":
    main(globals()["ctl"])

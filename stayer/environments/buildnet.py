"""The network of a ``RUN`` step: a namespace of its own behind slirp4netns, as Docker's
bridge gives one to ``docker build``.

The step's sandbox gets an empty network namespace and holds still until
:func:`run_step` has connected it: slirp4netns (sandboxed, seccomp on) makes ``tap0``
there (10.0.2.100/24, DNS 10.0.2.3) with ``--disable-host-loopback``, so the host's
127.0.0.0/8 services and abstract unix sockets are out of reach while what the host
reaches by other addresses is reachable, as with Docker's bridge. The resolver is
:data:`RESOLV_CONF` (slirp's forwarder), never the host's file. slirp4netns stops with
the step.

The start-up handshake in detail: ``docs/internals.md#environments-buildnet``.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from stayer.environments.idmap import IdRange, popen_in_userns
from stayer.sandbox.bwrap import SANDBOX_PATH

RESOLV_CONF = b"nameserver 10.0.2.3\n"
_DEVICE = "tap0"
_STOP_S = 30.0  # slirp4netns exits at once when told; this only bounds a stuck one


class NetworkError(RuntimeError):
    """slirp4netns could not connect the step's namespace (the message says why)."""


def find_slirp() -> str | None:
    """slirp4netns's path, or None where it is not installed."""
    return shutil.which("slirp4netns")


@contextlib.contextmanager
def slirp_network(slirp: str, pid: int, *, userns: bool) -> Iterator[None]:
    """Connect the network namespace of process ``pid`` (whose command is held, so that
    nothing runs in it yet) for as long as the context lasts. ``userns``: the namespace
    belongs to the user namespace of ``pid``, which slirp4netns must join to configure it.
    Raises :class:`NetworkError` when slirp4netns exits before the network is up."""
    ready_r, ready_w = os.pipe()
    exit_r, exit_w = os.pipe()
    argv = [slirp, "--configure", "--mtu=65520", "--disable-host-loopback"]
    argv += ["--enable-sandbox", "--enable-seccomp"]
    argv += ["--ready-fd", str(ready_w), "--exit-fd", str(exit_r)]
    if userns:
        argv += ["--userns-path", f"/proc/{pid}/ns/user"]
    argv += [str(pid), _DEVICE]
    with tempfile.TemporaryFile() as log:
        try:
            proc = subprocess.Popen(
                argv,
                pass_fds=(ready_w, exit_r),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=log,
            )
        except BaseException:
            for fd in (ready_r, ready_w, exit_r, exit_w):
                os.close(fd)
            raise
        os.close(ready_w)
        os.close(exit_r)
        try:
            # "1" once the namespace is configured; end of file if slirp4netns died first.
            if os.read(ready_r, 1) != b"1":
                proc.wait()
                log.seek(0)
                lines = log.read().decode("utf-8", "replace").strip().splitlines()
                raise NetworkError(
                    f"slirp4netns failed (exit {proc.returncode}): {lines[-1] if lines else ''}"
                )
            yield
        finally:
            os.close(ready_r)
            os.close(exit_w)  # slirp4netns's --exit-fd: stop
            try:
                proc.wait(timeout=_STOP_S)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


# Says "set up" on the step's output, waits for the go on its input, then runs the command
# with /dev/null as its input (the image's /bin/sh: dash knows no descriptor above 9).
_HOLD = 'printf . && read -r _ && exec "$@" </dev/null'


def run_step(
    options: list[str],
    command: list[str],
    *,
    slirp: str | None,
    userns: bool,
    resolv: bool,
    timeout: float,
    pass_fds: tuple[int, ...] = (),
    ids: IdRange | None = None,
    stage: str | None = None,
    mounts: dict[str, Path] | None = None,
) -> tuple[bytes, bytes, int]:
    """Run bwrap's ``options`` and ``command``: stdout, stderr and exit status. With
    ``slirp``, the sandbox (``options`` must unshare its network) is connected before
    ``command`` starts and gets :data:`RESOLV_CONF` when ``resolv``; without, it runs as
    is. Raises subprocess.TimeoutExpired after ``timeout`` seconds, the sandbox killed,
    and :class:`NetworkError`. ``pass_fds``: descriptors ``options`` name, for bwrap.
    ``ids``: bwrap runs as root of a user namespace mapped onto them
    (:func:`~stayer.environments.idmap.popen_in_userns`, which also mounts ``mounts`` on
    ``stage``)."""

    def spawn(argv: list[str], **kwargs: Any) -> subprocess.Popen[bytes]:
        kwargs.update(stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd="/")
        kwargs["env"] = {"PATH": SANDBOX_PATH}
        if ids is None:
            return subprocess.Popen(argv, **kwargs)
        return popen_in_userns(argv, ids, stage=stage, mounts=mounts, **kwargs)

    if slirp is None:
        proc = spawn([*options, *command], stdin=subprocess.DEVNULL, pass_fds=pass_fds)
        return _ended(proc, lambda: proc.communicate(timeout=timeout))
    info_r, info_w = os.pipe()
    fds = [info_w]
    extra = ["--info-fd", str(info_w)]
    if resolv:
        fds.append(_data_fd(RESOLV_CONF))
        # (0600 unless said: apt fetches as its own user, _apt)
        extra += ["--perms", "0644", "--ro-bind-data", str(fds[-1]), "/etc/resolv.conf"]
    try:
        proc = spawn(
            [*options, *extra, "/bin/sh", "-c", _HOLD, "sh", *command],
            stdin=subprocess.PIPE,
            pass_fds=[*fds, *pass_fds],
            bufsize=0,
        )
    except BaseException:
        os.close(info_r)
        raise
    finally:
        for fd in fds:
            os.close(fd)
    assert proc.stdin is not None and proc.stdout is not None
    stdout = proc.stdout

    def connect_then_run() -> tuple[bytes, bytes]:
        with os.fdopen(info_r, "rb") as info:
            pid = _child_pid(info.read())
        # EOF instead: bwrap failed before the command (its status and stderr say why)
        if pid is not None and stdout.read(1) == b".":
            with slirp_network(slirp, pid, userns=userns):
                return proc.communicate(b"go\n", timeout=timeout)
        return proc.communicate(timeout=timeout)

    return _ended(proc, connect_then_run)


def _ended(
    proc: subprocess.Popen[bytes], talk: Callable[[], tuple[bytes, bytes]]
) -> tuple[bytes, bytes, int]:
    """``talk()``'s stdout and stderr, and the status: the process is killed if it is still
    running after (a timeout, an error)."""
    try:
        out, err = talk()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    return out, err, proc.returncode


def _data_fd(data: bytes) -> int:
    """A descriptor to read ``data`` from (for bwrap's ``--ro-bind-data``)."""
    r, w = os.pipe()
    try:
        os.write(w, data)  # far less than a pipe holds
    finally:
        os.close(w)
    return r


def _child_pid(report: bytes) -> int | None:
    """The sandbox's pid from bwrap's ``--info-fd`` report; None when there is none."""
    try:
        return int(json.loads(report)["child-pid"])
    except (ValueError, KeyError, TypeError):
        return None


__all__ = ["RESOLV_CONF", "NetworkError", "find_slirp", "run_step", "slirp_network"]

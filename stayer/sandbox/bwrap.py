"""The default sandbox: bubblewrap namespaces over the host's read-only system directories.

What the command sees:

* ``/usr``, ``/bin``, ``/lib``, ``/lib64``, ``/sbin``, ``/etc`` of the host, read-only (those
  that exist; a host symlink such as ``/bin -> usr/bin`` becomes the same symlink). Nothing
  else of the host: not ``/root``, ``/home``, ``/tmp``, ``/opt``, ``/work``, nor the directory
  stayer was started from.
* the workspace read-write at ``/app``; extra :class:`Mount` s at their ``dest``;
  a private tmpfs at ``/tmp``; fresh ``/proc`` and ``/dev``; everything else (``/``) is
  remounted read-only, so writes outside ``/app`` and ``/tmp`` fail instead of silently
  landing in a throw-away tmpfs.
* new user, pid, ipc, uts, cgroup and network namespaces (``--unshare-all``; the network is
  shared only with ``allow_net``), a new session (no TIOCSTI into the caller's terminal),
  and an environment built from an allow-list, never the host's.

Because the command runs as pid 2 under bwrap's pid 1, when bwrap dies every process in the
sandbox dies with it: killing bwrap's process group on timeout kills the whole tree.
``/etc`` is visible (resolvers, users, CA certificates); hiding sensitive files in it is a
separate concern.
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
from pathlib import Path

from stayer.errors import ConfigError
from stayer.sandbox.base import ExecResult, Mount
from stayer.sandbox.process import Limits, run_process

SYSTEM_DIRS = ("/usr", "/bin", "/lib", "/lib64", "/sbin", "/etc")
SANDBOX_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
# bwrap's own two processes (the outer one and pid 1 of the namespace) sit in the same pids
# cgroup as the command; max_processes is about the command, so they are added on top.
_BWRAP_OWN_PROCESSES = 2

_FIX = (
    "install bubblewrap (apt install bubblewrap / dnf install bubblewrap), enable "
    "unprivileged user namespaces (sysctl kernel.unprivileged_userns_clone=1, or on Ubuntu "
    "kernel.apparmor_restrict_unprivileged_userns=0), or pass --sandbox local explicitly "
    "to run without isolation"
)


@functools.cache
def check_bwrap(bwrap: str | None = None) -> str:
    """Path of a bwrap that can create namespaces here; ConfigError saying how to fix it
    otherwise. Probed once per process: the answer does not change while we run."""
    path = (
        bwrap
        or shutil.which("bwrap")
        or ("/usr/bin/bwrap" if os.path.exists("/usr/bin/bwrap") else None)
    )
    if path is None:
        raise ConfigError(f"sandbox: bwrap (bubblewrap) not found on PATH; {_FIX}")
    try:
        proc = subprocess.run(
            [path, "--unshare-all", "--die-with-parent", "--ro-bind", "/", "/", "true"],
            capture_output=True,
            timeout=30,
            env={"PATH": SANDBOX_PATH},
        )
    except (OSError, subprocess.TimeoutExpired) as e:
        raise ConfigError(f"sandbox: cannot run {path}: {e}; {_FIX}") from e
    if proc.returncode != 0:
        why = proc.stderr.decode("utf-8", "replace").strip().splitlines()
        raise ConfigError(
            f"sandbox: {path} cannot create namespaces here ({why[-1] if why else proc.returncode}); {_FIX}"
        )
    return path


class BwrapSandbox:
    """Runs each command in a fresh bubblewrap sandbox with the workspace at ``/app``."""

    def __init__(
        self,
        workspace: str | Path,
        *,
        allow_net: bool = False,
        memory_mb: int | None = None,
        max_processes: int | None = None,
        max_output_bytes: int = 1_000_000,
        env: dict[str, str] | None = None,
    ) -> None:
        self.workspace = Path(workspace).resolve()
        if not self.workspace.is_dir():
            raise ConfigError(f"sandbox: workspace {self.workspace} is not a directory")
        self.bwrap = check_bwrap()
        self.allow_net = allow_net
        self.memory_mb = memory_mb
        self.max_processes = max_processes
        self.max_output_bytes = max_output_bytes
        self.env = {
            "PATH": SANDBOX_PATH,
            "HOME": "/tmp",
            "LANG": "C.UTF-8",
            "TERM": "dumb",
            "APP": "/app",
            **(env or {}),
        }

    def _argv(self, command: str, mounts: tuple[Mount, ...], cwd: str) -> list[str]:
        args = [self.bwrap, "--unshare-all"]
        if self.allow_net:
            args.append("--share-net")
        args += ["--die-with-parent", "--new-session", "--clearenv"]
        for key, value in self.env.items():
            args += ["--setenv", key, value]
        for d in SYSTEM_DIRS:
            if os.path.islink(d):  # e.g. /bin -> usr/bin on merged-/usr systems
                args += ["--symlink", os.readlink(d), d]
            elif os.path.isdir(d):
                args += ["--ro-bind", d, d]
        if self.allow_net and os.path.islink("/etc/resolv.conf"):
            # systemd-resolved and friends point it into /run, which is not mounted.
            target = os.path.realpath("/etc/resolv.conf")
            if os.path.exists(target):
                args += ["--ro-bind", target, target]
        args += ["--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp"]
        args += ["--bind", str(self.workspace), "/app"]
        for m in mounts:
            args += ["--bind" if m.writable else "--ro-bind", str(Path(m.host).resolve()), m.dest]
        args += ["--remount-ro", "/", "--chdir", cwd, "/bin/bash", "-c", command]
        return args

    async def exec(
        self,
        command: str,
        *,
        timeout: float = 120.0,
        stdin: bytes | None = None,
        mounts: tuple[Mount, ...] = (),
        cwd: str = "/app",
    ) -> ExecResult:
        limits = Limits(
            memory_mb=self.memory_mb,
            max_processes=(
                self.max_processes + _BWRAP_OWN_PROCESSES
                if self.max_processes is not None
                else None
            ),
        )
        return await run_process(
            self._argv(command, mounts, cwd),
            timeout=timeout,
            stdin=stdin,
            env={"PATH": SANDBOX_PATH},  # for bwrap itself; the sandbox gets --clearenv
            max_output_bytes=self.max_output_bytes,
            limits=limits,
        )

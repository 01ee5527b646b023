"""The docker sandbox: each command in a fresh container of the task's image.

The bubblewrap sandbox's contract, kept by Docker's own means through the ``docker``
command line (Podman's works the same; ``DOCKER_HOST`` chooses the daemon): a fresh
container per command (``docker run --rm``), removed (``docker rm -f``) on a timeout or
cancellation; the workspace at ``/app``, a private sized ``/tmp``, the image read-only;
``--network none`` unless ``allow_net``; no capabilities, ``no-new-privileges``, an
unprivileged user (uid :data:`~stayer.sandbox.bwrap.SANDBOX_UID` when stayer runs as
root); ``--pids-limit``, ``--memory`` without swap, ``ulimit -v``, ``--ulimit fsize``,
``--cpus``; the storage limit polled on the host; the same environment allow-list. A
container the runtime failed to create (``OCI runtime create failed``) is tried again,
twice at most, within the command's timeout (docs/sandbox.md says why).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import shutil
import time
import uuid
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any, TypeVar

from stayer.errors import ConfigError
from stayer.sandbox.base import ExecResult, Mount
from stayer.sandbox.bwrap import (
    SANDBOX_GID,
    SANDBOX_PATH,
    SANDBOX_UID,
    sandbox_env,
    tmp_size_mb,
)
from stayer.sandbox.process import Launch, ProcessSandbox, probe
from stayer.workspace.tree import walk

_FIX = (
    "install Docker (apt install docker.io) or Podman with its Docker-compatible socket, start "
    "the daemon, and point DOCKER_HOST at it (e.g. unix:///run/docker.sock); or use --sandbox bwrap"
)
# What the docker command line itself needs from our environment: which daemon, its config.
_CLIENT_ENV = (
    "DOCKER_HOST",
    "DOCKER_CONTEXT",
    "DOCKER_CONFIG",
    "DOCKER_CERT_PATH",
    "DOCKER_TLS_VERIFY",
    "HOME",
)


def client_env() -> dict[str, str]:
    """The environment of ``docker`` commands: PATH and how to reach the daemon only."""
    return {
        "PATH": os.environ.get("PATH", SANDBOX_PATH),
        **{k: os.environ[k] for k in _CLIENT_ENV if k in os.environ},
    }


@functools.cache
def check_docker(docker: str | None = None) -> str:
    """Path of a docker command whose daemon answers; ConfigError saying how to fix it
    otherwise. Probed once per process."""
    path = docker or shutil.which("docker")
    if path is None:
        raise ConfigError(f"--sandbox docker: the docker command is not on PATH; {_FIX}")
    probe(
        [path, "version", "--format", "{{.Server.Version}}"],
        client_env(),
        failed=(
            f"--sandbox docker: cannot run {path}",
            "--sandbox docker: no Docker daemon answers",
        ),
        fix=_FIX,
    )
    return path


class DockerSandbox(ProcessSandbox):
    """Runs each command in a fresh container of ``image`` with the workspace at ``/app``."""

    def __init__(
        self,
        workspace: str | Path,
        *,
        image: str,
        env: dict[str, str] | None = None,
        cpus: float | None = None,
        **limits: Any,
    ) -> None:
        """``limits``: those of :class:`~stayer.sandbox.process.ProcessSandbox`."""
        super().__init__(workspace, **limits)
        self.docker = check_docker()
        self.image = image
        self.cpus = cpus
        self.env = sandbox_env(env)
        self._removing: set[asyncio.Future[None]] = set()  # containers being removed
        # As root, the command runs as SANDBOX_UID, which must own what it may write; any
        # other caller's uid already owns it.
        self.user = (
            (SANDBOX_UID, SANDBOX_GID) if os.geteuid() == 0 else (os.geteuid(), os.getegid())
        )

    async def exec(self, command: str, *, timeout: float = 120.0, **rest: Any) -> ExecResult:
        deadline = time.monotonic() + timeout
        for pause in (*CREATE_RETRY_PAUSES_S, None):
            left = max(deadline - time.monotonic(), 0.001)
            r = await super().exec(command, timeout=left, **rest)
            created = r.timed_out or not never_created(r.exit_code, r.stdout, r.stderr)
            if pause is None or created or time.monotonic() + pause >= deadline:
                return r
            await asyncio.sleep(pause)
        raise AssertionError("unreachable: the last pause is None")

    def _argv(
        self, name: str, command: str, mounts: tuple[Mount, ...], cwd: str, stdin: bool
    ) -> list[str]:
        tmp_mb = tmp_size_mb(self.storage_mb)
        argv = [self.docker, "run", "--rm", "--name", name, "--log-driver", "none"]
        if stdin:
            argv.append("--interactive")
        argv += ["--network", "host" if self.allow_net else "none", "--hostname", "sandbox"]
        argv += ["--cap-drop", "ALL", "--security-opt", "no-new-privileges"]
        argv += ["--user", f"{self.user[0]}:{self.user[1]}", "--read-only"]
        # exec, as bwrap's /tmp (Docker's default is noexec): programs built there run, and
        # the verifier's test script runs in a bash copied there (stayer.eval.verify).
        argv += ["--tmpfs", f"/tmp:rw,exec,nosuid,nodev,size={tmp_mb}m,mode=1777"]
        if self.max_processes is not None:
            argv += ["--pids-limit", str(self.max_processes)]
        # The whole container's memory, no swap: what was asked, else the default share.
        argv += ["--memory", f"{self.memory_cap_mb}m", "--memory-swap", f"{self.memory_cap_mb}m"]
        if self.max_file_mb is not None:
            argv += ["--ulimit", f"fsize={self.max_file_mb * 2**20}"]
        if self.cpus is not None:
            argv += ["--cpus", f"{self.cpus:g}"]
        argv += ["--mount", f"type=bind,source={self.workspace},target=/app"]
        for m in mounts:
            spec = f"type=bind,source={Path(m.host).resolve()},target={m.dest}"
            argv += ["--mount", spec if m.writable else spec + ",readonly"]
        for key, value in self.env.items():
            argv += ["--env", f"{key}={value}"]
        argv += ["--workdir", cwd, "--entrypoint", "/bin/bash", self.image]
        if self.memory_mb is None:
            return [*argv, "-c", command]
        # Docker has no address-space ulimit: set it (soft and hard, which an unprivileged
        # command cannot raise again) in a shell that then becomes the command's.
        prelude = f'ulimit -v {self.memory_mb * 1024} || exit 125; exec /bin/bash -c "$1"'
        return [*argv, "-c", prelude, "stayer-limits", command]

    @contextlib.asynccontextmanager
    async def _launch(
        self, command: str, *, stdin: bool, mounts: tuple[Mount, ...], cwd: str
    ) -> AsyncIterator[Launch | ExecResult]:
        if os.geteuid() == 0:
            for path in (self.workspace, *(Path(m.host) for m in mounts if m.writable)):
                await asyncio.to_thread(hand_over, path, *self.user)
        name = f"stayer-{uuid.uuid4().hex[:16]}"
        try:
            yield Launch(self._argv(name, command, mounts, cwd, stdin), cwd="/", env=client_env())
        finally:
            # Killing the docker client (timeout, storage limit, cancellation) leaves the
            # container running; removing it kills everything in it. Shielded: a cancelled
            # caller must not leave it behind; close() waits for it.
            removal = asyncio.ensure_future(_remove_container(self.docker, name))
            self._removing.add(removal)
            removal.add_done_callback(self._removing.discard)
            await asyncio.shield(removal)

    async def close(self) -> None:
        """Wait until every container of this sandbox is removed (one whose command was
        cancelled is removed in the background)."""
        if self._removing:
            await asyncio.wait(set(self._removing))


_R = TypeVar("_R")

# Between the tries of a container the runtime failed to create (module docstring).
CREATE_RETRY_PAUSES_S = (0.25, 1.0)
_CREATE_FAILED = "OCI runtime create failed"


def never_created(exit_code: int, stdout: str | bytes, stderr: str | bytes) -> bool:
    """Whether ``docker run`` failed before the command started: the runtime could not
    create its container (exit 125-127, nothing on stdout, and the client's first line says
    so: "docker: Error response from daemon: failed to create shim task: OCI runtime create
    failed: …")."""
    err = stderr.decode("utf-8", "replace") if isinstance(stderr, bytes) else stderr
    first = err.split("\n", 1)[0]
    return (
        exit_code in (125, 126, 127)
        and not stdout
        and first.startswith("docker: Error")
        and runtime_failed(first)
    )


def retry_docker_failures(
    run: Callable[[], _R],
    failed: Callable[[_R], bool],
    on_retry: Callable[[], None] = lambda: None,
) -> _R:
    """``run()``, run again (after ``CREATE_RETRY_PAUSES_S``) while ``failed`` says Docker
    itself failed it, not the command or step (its runtime could not create the container;
    for a build, also its daemon could not unpack a step's files); the last result otherwise.
    For the synchronous callers (the image's seed, ``docker build``); ``DockerSandbox.exec``
    does the same within its command's timeout."""
    for pause in (*CREATE_RETRY_PAUSES_S, None):
        result = run()
        if pause is None or not failed(result):
            return result
        on_retry()
        time.sleep(pause)
    raise AssertionError("unreachable: the last pause is None")


def runtime_failed(line: str) -> bool:
    """Whether a line of Docker's says its runtime could not create a container."""
    return _CREATE_FAILED in line


def client_error(stderr: str | bytes) -> str:
    """The line of a failed ``docker`` command that says why: the daemon's or the runtime's
    words, not the client's closing "Run 'docker run --help' for more information"."""
    err = stderr.decode("utf-8", "replace") if isinstance(stderr, bytes) else stderr
    lines = [line.strip() for line in err.splitlines() if line.strip()]
    said = [line for line in lines if not line.startswith("Run '")]
    return (said or lines or [""])[0]


async def _remove_container(docker: str, name: str) -> None:
    proc = await asyncio.create_subprocess_exec(
        docker,
        "rm",
        "--force",
        name,
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.DEVNULL,
        env=client_env(),
    )
    await proc.wait()


def hand_over(root: Path, uid: int, gid: int) -> None:
    """Make ``root`` and everything under it owned by ``uid``:``gid``, changing links
    themselves and never following one (each entry is changed through its parent's
    descriptor). Run while no command of the sandbox is running, so nothing moves."""
    if os.lstat(root).st_uid != uid or os.lstat(root).st_gid != gid:
        os.chown(root, uid, gid, follow_symlinks=False)
    for _rel, st, parent_fd, name in walk(root):
        if st.st_uid != uid or st.st_gid != gid:
            with contextlib.suppress(FileNotFoundError):
                os.chown(name, uid, gid, dir_fd=parent_fd, follow_symlinks=False)


__all__ = [
    "CREATE_RETRY_PAUSES_S",
    "DockerSandbox",
    "check_docker",
    "client_env",
    "client_error",
    "hand_over",
    "never_created",
    "retry_docker_failures",
    "runtime_failed",
]

"""No isolation at all: ``/bin/bash -c`` on the host, in the workspace directory.

Only for ``--sandbox local``, chosen by name (e.g. no bubblewrap: macOS, a container
without user namespaces), where the user accepts that the agent's commands can read and
write anything the user can, the network included. The workspace is *not* at ``/app``:
only ``cwd`` is translated (``/app/sub`` → ``<workspace>/sub``) and ``$APP`` holds the
workspace path; ``mounts`` are an error. Limits, the timeout and output capture are the
same code as under bwrap, but without a pids cgroup a process that leaves its session
can outlive the call. The environment is a short allow-list of the host's (``PATH``,
``HOME``, ``USER``, ``LANG``...), so API keys do not reach a transcript through ``env``.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from stayer.errors import ConfigError
from stayer.sandbox.base import ExecResult, Mount
from stayer.sandbox.process import Launch, ProcessSandbox

_HOST_ENV_KEEP = ("PATH", "HOME", "USER", "LOGNAME", "LANG", "LC_ALL", "TZ")


class LocalSandbox(ProcessSandbox):
    """Runs commands directly on the host with ``cwd`` = the workspace. No isolation."""

    def __init__(
        self,
        workspace: str | Path,
        *,
        allow_net: bool = True,  # accepted for a uniform make_sandbox(); the host net is always there
        max_processes: int | None = None,
        env: dict[str, str] | None = None,
        **limits: Any,
    ) -> None:
        """``limits``: the others of :class:`~stayer.sandbox.process.ProcessSandbox`."""
        workspace = Path(workspace).resolve()
        super().__init__(
            workspace,
            allow_net=allow_net,
            max_processes=max_processes,
            shown_as=str(workspace),
            **limits,
        )
        self.env = {k: os.environ[k] for k in _HOST_ENV_KEEP if k in os.environ}
        self.env.setdefault("PATH", os.defpath)
        self.env.update({"TERM": "dumb", "APP": str(self.workspace), **(env or {})})

    def host_cwd(self, cwd: str) -> str:
        """``/app`` and ``/app/...`` mapped into the workspace; any other path unchanged."""
        if cwd == "/app" or cwd.startswith("/app/"):
            return str(self.workspace / cwd[len("/app") :].lstrip("/"))
        return cwd

    @contextlib.asynccontextmanager
    async def _launch(
        self, command: str, *, stdin: bool, mounts: tuple[Mount, ...], cwd: str
    ) -> AsyncIterator[Launch | ExecResult]:
        if mounts:
            dests = ", ".join(m.dest for m in mounts)
            raise ConfigError(
                f"sandbox: the local sandbox cannot mount {dests}; use --sandbox bwrap"
            )
        host_cwd = self.host_cwd(cwd)
        if not os.path.isdir(host_cwd):  # what bwrap --chdir reports, instead of an OSError
            yield ExecResult(
                exit_code=1, stdout="", stderr=f"cannot chdir to {cwd}: no such directory\n"
            )
            return
        yield Launch(["/bin/bash", "-c", command], cwd=host_cwd, env=self.env, limits=self.limits)

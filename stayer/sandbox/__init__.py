"""Sandboxes: where the agent's commands run. ``bwrap`` (default on Linux) or ``local``;
``docker`` and ``bwrap-image`` run the task's image (:mod:`stayer.environments`);
``bwrap`` starts each command's sandbox ahead (:mod:`stayer.sandbox.ahead`);
``bwrap-persistent`` is ``bwrap`` kept running between commands (:mod:`stayer.sandbox.persistent`).
Every backend runs a command through one exec path (:class:`~stayer.sandbox.process.ProcessSandbox`:
limits, cgroup, output capture, deadline, storage watch); a backend only says how the
command starts. Snapshots (:mod:`stayer.workspace.snapshot`) are one algorithm over two
object stores (files, or the journal's blobs)."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from stayer.choices import HOST_KINDS, IMAGE_KINDS, kinds_help  # noqa: F401 - re-exported
from stayer.choices import SANDBOX_KINDS as KINDS
from stayer.errors import ConfigError
from stayer.sandbox.base import ExecResult, Mount, Sandbox


def make_sandbox(kind: str, workspace: str | Path, **limits: Any) -> Sandbox:
    """Build the sandbox named ``kind`` over ``workspace``.

    ``limits`` are the keyword arguments both backends accept: ``allow_net``, ``memory_mb``
    (address space per process), ``max_processes``, ``max_file_mb`` (largest file),
    ``storage_mb`` (what the workspace may hold), ``max_output_bytes`` (captured per stream),
    ``env``; ``None`` means unlimited, and a limit left out keeps the backend's default.
    Imports are deferred so that choosing one backend never requires the other's
    prerequisites.
    """
    if kind in ("bwrap", "bwrap-persistent"):
        from stayer.sandbox.bwrap import BwrapSandbox

        return BwrapSandbox(workspace, persistent=kind == "bwrap-persistent", **limits)
    if kind == "local":
        from stayer.sandbox.local import LocalSandbox

        return LocalSandbox(workspace, **limits)
    if kind in IMAGE_KINDS:
        raise ConfigError(
            f"--sandbox {kind}: runs a task's image; it needs a task (environment/Dockerfile)"
        )
    raise ConfigError(f"--sandbox: unknown sandbox {kind!r}; choose one of {', '.join(KINDS)}")


@contextlib.asynccontextmanager
async def released(sandbox: Sandbox) -> AsyncIterator[Sandbox]:
    """``sandbox`` for the block; at its end, however it ends, every process of it that
    outlives a command (kept, started ahead, a container being removed) is killed and
    waited for (``close()``, where the sandbox has one)."""
    try:
        yield sandbox
    finally:
        close = getattr(sandbox, "close", None)
        if close is not None:
            await close()


__all__ = [
    "HOST_KINDS",
    "IMAGE_KINDS",
    "KINDS",
    "ExecResult",
    "Mount",
    "Sandbox",
    "kinds_help",
    "make_sandbox",
    "released",
]

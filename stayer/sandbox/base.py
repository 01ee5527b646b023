"""The Sandbox protocol: run one shell command over a workspace, contained."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Protocol


@dataclass(frozen=True, slots=True)
class ExecResult:
    exit_code: int
    stdout: str
    stderr: str
    timed_out: bool = False
    truncated: bool = False  # captured output was cut while it streamed
    duration_s: float = 0.0

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True, slots=True)
class Mount:
    host: str
    dest: str
    writable: bool = False


class Sandbox(Protocol):
    """Runs commands with the workspace at ``/app``."""

    async def exec(
        self,
        command: str,
        *,
        timeout: float = 120.0,
        stdin: bytes | None = None,
        mounts: tuple[Mount, ...] = (),
        cwd: str = "/app",
    ) -> ExecResult: ...

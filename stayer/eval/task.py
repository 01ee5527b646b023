"""Tasks in the Harbor layout.

    TASK/
      instruction.md        what the agent is asked to do
      task.toml             limits and metadata
      environment/          files copied into the workspace (/app); a Dockerfile there is
                            built, and the task runs in its image (``docker`` where a
                            daemon answers, else ``bwrap-image``: see stayer.environments)
                            unless --sandbox or task.toml names another kind
      solution/solve.sh     reference solution (never visible to the agent)
      tests/test.sh         verifier; writes /logs/verifier/reward.txt (or reward.json)

Loading validates everything up front so that bad input fails before anything is written.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Unpack

from stayer.environments.prepare import image_kind, prepare_environment, sandbox_for
from stayer.errors import ConfigError
from stayer.mcp.config import McpServer, parse_servers
from stayer.sandbox import IMAGE_KINDS, Sandbox
from stayer.settings import (
    SandboxLimits,
    TaskToml,
    check_file,
    given_limits,
    read_text,
    read_toml,
)
from stayer.workspace.hostfs import copy_tree

# Files in environment/ that describe a container image rather than workspace content.
IMAGE_FILES = {"Dockerfile", "docker-compose.yaml", "docker-compose.yml", ".dockerignore"}


@dataclass(frozen=True)
class Task:
    path: Path
    name: str
    instruction: str
    agent_timeout_s: float = 600.0
    verifier_timeout_s: float = 600.0
    allow_internet: bool = False
    memory_mb: int | None = None
    storage_mb: int | None = None  # what /app (and /tmp) may hold; see stayer.sandbox
    sandbox_kind: str | None = None  # [environment] sandbox: where it runs unless told
    metadata: dict[str, Any] = field(default_factory=dict)
    mcp_servers: dict[str, McpServer] = field(default_factory=dict)  # task.toml [mcp.servers]

    def sandbox_limits(self, **overrides: Unpack[SandboxLimits]) -> SandboxLimits:
        """The limits of the agent's sandbox for this task: task.toml's, then ``overrides``
        (a run's own flags) where given."""
        limits = SandboxLimits(
            allow_net=self.allow_internet, memory_mb=self.memory_mb, storage_mb=self.storage_mb
        )
        limits.update(given_limits(overrides))
        return limits

    def kind(self, flag: str | None) -> str:
        """The sandbox kind a run uses: its own flag, else task.toml's, else the task's image
        where environment/Dockerfile exists (:func:`image_kind`), else ``bwrap``."""
        if flag or self.sandbox_kind:
            return flag or self.sandbox_kind or "bwrap"
        return image_kind() if self.dockerfile is not None else "bwrap"

    def kind_source(self, flag: str | None) -> str:
        """Who chose :meth:`kind`, in words for the run's header."""
        if flag:
            return "--sandbox"
        if self.sandbox_kind:
            return "task.toml"
        return "the task's Dockerfile" if self.dockerfile is not None else "default"

    @property
    def dockerfile(self) -> Path | None:
        """environment/Dockerfile, where the task has one."""
        path = self.path / "environment" / "Dockerfile"
        return path if path.is_file() else None

    def make_sandbox(self, kind: str, workspace: Path, **limits: Any) -> Sandbox:
        """The sandbox ``kind`` over ``workspace`` for this task: for the kinds that run
        the task's image, that image, built first (cached) from environment/."""
        return sandbox_for(kind, workspace, self.path / "environment", **limits)

    @property
    def solution(self) -> str | None:
        p = self.path / "solution" / "solve.sh"
        return read_text(p, "") if p.is_file() else None

    @property
    def tests_dir(self) -> Path:
        return self.path / "tests"

    def materialise(self, workspace: Path, kind: str = "bwrap") -> None:
        """Lay out a fresh workspace: the environment's files, nothing from tests or solution.

        Copied by :func:`~stayer.workspace.hostfs.copy_tree`: links as links, never followed
        (a link to ../tests or ../solution must not bring the verifier's files into the
        agent's workspace), sparse files sparse, FIFOs re-created and never opened, no
        sockets, devices or setuid bits, any file name.

        For a sandbox ``kind`` that runs the task's image, the workspace is what the image
        holds in ``/app`` and nothing else, as in a container of it: the environment
        directory is the image's build context, whose files reach the image only where the
        Dockerfile copies them (a file its ``.dockerignore`` leaves out, or one no ``COPY``
        names, is not the agent's to see)."""
        env = self.path / "environment"
        if kind in IMAGE_KINDS:
            workspace.mkdir(parents=True, exist_ok=True)
            prepare_environment(kind, env).seed(workspace)
        elif env.is_dir():
            copy_tree(env, workspace, skip=IMAGE_FILES)
        else:
            workspace.mkdir(parents=True, exist_ok=True)


def load_task(path: str | Path) -> Task:
    root = Path(path)
    if not root.is_dir():
        raise ConfigError(
            f"{root}: not a task directory (expected instruction.md, task.toml, tests/)"
        )
    instruction_file = root / "instruction.md"
    if not instruction_file.is_file():
        raise ConfigError(
            f"{instruction_file}: missing; a Harbor task needs instruction.md with the task text"
        )
    instruction = instruction_file.read_text(errors="replace").strip()
    if not instruction:
        raise ConfigError(f"{instruction_file}: empty; write the task for the agent there")
    toml_file = root / "task.toml"
    config: dict[str, Any] = read_toml(toml_file) if toml_file.is_file() else {}
    for section in ("agent", "verifier", "environment", "metadata"):
        if section in config and not isinstance(config[section], dict):
            raise ConfigError(f"{toml_file}: [{section}] must be a table")
    test_sh = root / "tests" / "test.sh"
    if not test_sh.is_file():
        raise ConfigError(
            f"{test_sh}: missing; the verifier script must write /logs/verifier/reward.txt"
        )
    settings = check_file(TaskToml, config, str(toml_file))
    return Task(
        path=root.resolve(),
        name=root.resolve().name,
        instruction=instruction,
        agent_timeout_s=settings.agent.timeout_sec,
        verifier_timeout_s=settings.verifier.timeout_sec,
        allow_internet=settings.environment.allow_internet,
        memory_mb=settings.environment.memory_mb,
        storage_mb=settings.environment.storage_mb,
        sandbox_kind=settings.environment.sandbox,
        metadata=dict(settings.metadata),
        mcp_servers=parse_servers(config.get("mcp"), str(toml_file)),
    )

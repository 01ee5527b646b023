"""Tasks in the Harbor layout.

    TASK/
      instruction.md        what the agent is asked to do
      task.toml             limits and metadata
      environment/          files copied into the workspace (/app); a Dockerfile there is
                            not built: tasks run in the bubblewrap sandbox on the host system
      solution/solve.sh     reference solution (never visible to the agent)
      tests/test.sh         verifier; writes /logs/verifier/reward.txt (or reward.json)

Loading validates everything up front so that bad input fails before anything is written.
"""

from __future__ import annotations

import shutil
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from stayer.errors import ConfigError

# Files in environment/ that describe a container image rather than workspace content.
_IMAGE_FILES = {"Dockerfile", "docker-compose.yaml", "docker-compose.yml", ".dockerignore"}


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
    metadata: dict[str, Any] = field(default_factory=dict)

    def sandbox_limits(self, **overrides: Any) -> dict[str, Any]:
        """The limits of the agent's sandbox for this task: task.toml's, then ``overrides``
        (a run's own flags) where given."""
        limits: dict[str, Any] = {
            "allow_net": self.allow_internet,
            "memory_mb": self.memory_mb,
            "storage_mb": self.storage_mb,
        }
        limits.update({k: v for k, v in overrides.items() if v is not None})
        return limits

    @property
    def solution(self) -> str | None:
        p = self.path / "solution" / "solve.sh"
        return p.read_text() if p.is_file() else None

    @property
    def tests_dir(self) -> Path:
        return self.path / "tests"

    def materialise(self, workspace: Path) -> None:
        """Lay out a fresh workspace: the environment's files, nothing from tests or solution."""
        workspace.mkdir(parents=True, exist_ok=True)
        env = self.path / "environment"
        if env.is_dir():
            for item in env.iterdir():
                if item.name in _IMAGE_FILES:
                    continue
                dest = workspace / item.name
                if item.is_symlink():
                    # Copied as a link, never followed: a link to ../tests or ../solution
                    # must not bring the verifier's files into the agent's workspace.
                    dest.symlink_to(item.readlink())
                elif item.is_dir():
                    shutil.copytree(item, dest, symlinks=True, dirs_exist_ok=True)
                else:
                    shutil.copy2(item, dest, follow_symlinks=False)


def _number(table: dict[str, Any], key: str, where: str, default: float | None) -> float | None:
    v = table.get(key, default)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int | float) or v <= 0:
        raise ConfigError(f"{where}.{key}: expected a positive number, got {v!r}")
    return float(v)


def load_task(path: str | Path) -> Task:
    root = Path(path)
    if not root.is_dir():
        raise ConfigError(f"{root}: not a task directory (expected instruction.md, task.toml, tests/)")
    instruction_file = root / "instruction.md"
    if not instruction_file.is_file():
        raise ConfigError(f"{instruction_file}: missing; a Harbor task needs instruction.md with the task text")
    instruction = instruction_file.read_text(errors="replace").strip()
    if not instruction:
        raise ConfigError(f"{instruction_file}: empty; write the task for the agent there")
    toml_file = root / "task.toml"
    config: dict[str, Any] = {}
    if toml_file.is_file():
        try:
            config = tomllib.loads(toml_file.read_text())
        except tomllib.TOMLDecodeError as e:
            raise ConfigError(f"{toml_file}: malformed TOML ({e})") from None
    for section in ("agent", "verifier", "environment", "metadata"):
        if section in config and not isinstance(config[section], dict):
            raise ConfigError(f"{toml_file}: [{section}] must be a table")
    agent = config.get("agent", {})
    verifier = config.get("verifier", {})
    env = config.get("environment", {})
    allow = env.get("allow_internet", False)
    if not isinstance(allow, bool):
        raise ConfigError(f"{toml_file}: environment.allow_internet must be true or false")
    test_sh = root / "tests" / "test.sh"
    if not test_sh.is_file():
        raise ConfigError(f"{test_sh}: missing; the verifier script must write /logs/verifier/reward.txt")
    memory = _number(env, "memory_mb", f"{toml_file}: environment", None)
    storage = _number(env, "storage_mb", f"{toml_file}: environment", None)
    return Task(
        path=root.resolve(),
        name=root.resolve().name,
        instruction=instruction,
        agent_timeout_s=_number(agent, "timeout_sec", f"{toml_file}: agent", 600.0) or 600.0,
        verifier_timeout_s=_number(verifier, "timeout_sec", f"{toml_file}: verifier", 600.0) or 600.0,
        allow_internet=allow,
        memory_mb=int(memory) if memory else None,
        storage_mb=int(storage) if storage else None,
        metadata=dict(config.get("metadata", {})),
    )

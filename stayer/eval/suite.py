"""Task suites: a directory of Harbor-layout tasks, validated as a whole.

A suite is checked before anything runs, and every broken task is reported (one line each,
naming the file and field), not just the first: fixing a suite one error per run is slow.
A directory that is itself a task is a suite of one.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from stayer.errors import ConfigError
from stayer.eval.task import Task, load_task

# Any of these marks a directory as a task (even a broken one), rather than a suite.
_TASK_MARKERS = ("instruction.md", "task.toml", "tests")


class ProblemsError(ConfigError):
    """Several bad-input problems at once; ``str()`` is one line per problem."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("\n".join(problems))
        self.problems = problems


@dataclass(frozen=True)
class InvalidTask:
    path: Path
    problem: str  # one line naming the file and field

    @property
    def name(self) -> str:
        return self.path.name


@dataclass
class Suite:
    path: Path
    tasks: list[Task] = field(default_factory=list)
    invalid: list[InvalidTask] = field(default_factory=list)


def is_task_dir(path: Path) -> bool:
    return any((path / marker).exists() for marker in _TASK_MARKERS)


def scan_suite(path: str | Path) -> Suite:
    """Load every task under ``path``, keeping the ones that fail to load apart.

    Raises ConfigError only when ``path`` itself is unusable (missing, or holds no task)."""
    root = Path(path)
    if not root.is_dir():
        raise ConfigError(f"{root}: not a directory; a suite is a directory of Harbor-layout tasks")
    if is_task_dir(root):
        candidates = [root]
    else:
        # A directory with none of a task's files is not a task (examples/python beside the
        # example tasks); one with some of them is, and is reported when it does not load.
        candidates = sorted(
            d
            for d in root.iterdir()
            if d.is_dir() and not d.name.startswith((".", "_")) and is_task_dir(d)
        )
    if not candidates:
        raise ConfigError(
            f"{root}: no tasks; a suite holds task directories (instruction.md, task.toml, tests/test.sh)"
        )
    suite = Suite(root.resolve())
    for candidate in candidates:
        try:
            suite.tasks.append(load_task(candidate))
        except ConfigError as e:
            suite.invalid.append(InvalidTask(candidate, str(e)))
    return suite


def load_suite(path: str | Path) -> list[Task]:
    """The suite's tasks; ProblemsError listing every invalid task if any is."""
    suite = scan_suite(path)
    if suite.invalid:
        raise ProblemsError([t.problem for t in suite.invalid])
    return suite.tasks

"""Run a task's verifier over the final workspace, in a fresh sandbox.

The tests are mounted read-only at /tests and a fresh, empty /logs/verifier collects the
reward; neither exists while the agent works, so the agent can neither read nor forge them.

A verdict is also classified: a reward ≥ 1 passes; tests that could not run here (no reward
file, the script exited 126/127, or its output shows the host lacks what the task needs)
are ``infrastructure``: they say nothing about the agent's work, so evaluations never score
them.

Details and rationale: docs/notes.md, ``stayer/eval/verify.py``.
"""

from __future__ import annotations

import json
import math
import os
import stat
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from stayer.errors import ConfigError
from stayer.eval.evidence import environment_evidence
from stayer.eval.task import Task
from stayer.records import to_json
from stayer.sandbox.base import ExecResult, Mount, Sandbox
from stayer.workspace.hostfs import (
    UnsafeFile,
    copy_tree,
    open_dir_beneath,
    open_regular,
    read_regular,
)

if TYPE_CHECKING:
    from stayer.ledger import VerifierReport

# What a test script's exit status says about the host: bash's "found but not executable"
# and "command not found".
_UNRUNNABLE_EXIT = {
    126: "a command it runs is not executable here",
    127: "a command it runs is not found here",
}


def passes(reward: float | None) -> bool:
    """The one rule for success: the verifier's reward is at least 1."""
    return reward is not None and reward >= 1


@dataclass
class Verdict:
    reward: float | None  # None: the verifier wrote no readable reward
    rewards: dict[str, float] = field(default_factory=dict)
    exec: ExecResult | None = None
    error: str | None = None
    infrastructure: str | None = None  # why this verdict cannot judge the agent's work
    voided: str | None = None  # why a passing reward the tests left does not count

    @property
    def outcome(self) -> str:
        """passed, infrastructure, timed_out, failed, or not_run (a sandbox that cannot
        mount the tests: no verdict at all, which is the run's setting, not the host's)."""
        if passes(self.reward):
            return "passed"
        if self.exec is None:
            return "not_run"
        if self.infrastructure:
            return "infrastructure"
        return "timed_out" if self.exec.timed_out else "failed"

    def report(self) -> VerifierReport:
        """The verdict as the run's result keeps it (``verifier``)."""
        # Imported here, not with the module: re-rendering a finished eval loads no ledger.
        from stayer.ledger import VerifierReport

        return VerifierReport(
            outcome=self.outcome,
            infrastructure=self.infrastructure,
            exit_code=self.exec.exit_code if self.exec else None,
            timed_out=self.exec.timed_out if self.exec else False,
            error=self.error,
            voided=self.voided,
            output_tail=(self.exec.stdout + self.exec.stderr)[-2000:] if self.exec else "",
        )

    def to_dict(self) -> dict[str, object]:
        """:meth:`report` as JSON builtins."""
        return to_json(self.report())


def infrastructure_reason(verdict: Verdict, task: Task) -> str | None:
    """Why the tests could not judge the work on this host, or None if they could.

    A passing reward is never infrastructure; tests that ran out of time are the agent's
    (its work may hang them); tests that were not run at all give no verdict to classify."""
    if passes(verdict.reward) or verdict.voided:
        return None  # a voided reward: the tests ran, and the agent's code stopped them
    result = verdict.exec
    if result is None or result.timed_out:
        return None
    if why := _UNRUNNABLE_EXIT.get(result.exit_code):
        return f"the test script exited {result.exit_code}: {why}"
    if evidence := environment_evidence(result.stdout + "\n" + result.stderr, task):
        return "; ".join(evidence)
    if verdict.reward is None:
        return verdict.error or "the verifier wrote no reward"
    return None


# The test script runs in a bash that the code it runs (of its uid) cannot take over: a
# copy the sandbox's user may execute but not read, made before anything else runs in the
# fresh sandbox; the kernel makes a process of an unreadable program non-dumpable (no
# ptrace, /proc/<pid>/mem or pidfd_getfd on it without CAP_SYS_PTRACE). Where the copy
# cannot be made or run (no writable, executable /tmp), the image's bash runs it.
TEST_COMMAND = (
    "shopt -s execfail; b=/tmp/.stayer-test-bash; "
    'cp /bin/bash "$b" 2>/dev/null && chmod 0111 "$b" && exec "$b" /tests/test.sh; '
    "exec bash /tests/test.sh"
)

# A reward file is a number or a small JSON object; anything larger is not one.
REWARD_LIMIT = 64 * 1024
REWARD_NAMES = ("reward.txt", "reward.json")


def read_reward(logs: Path) -> tuple[float | None, dict[str, float], str | None]:
    """``(reward, rewards, error)`` from what the verifier left in ``logs``.

    The verifier runs the agent's code, which can write ``logs``: a reward file that is a
    link (to a host file holding ``1``), a hard link, a FIFO, a directory, too large or not
    a finite number is an error here (reward ``None``), never a score, and its content is
    never echoed. Read through :mod:`stayer.workspace.hostfs`: no link is followed."""
    for name in REWARD_NAMES:
        try:
            raw = read_regular(logs, name, limit=REWARD_LIMIT, single_link=True)
        except FileNotFoundError:
            continue
        except OSError as e:  # UnsafeFile: a link, a special file, too large
            return None, {}, f"unusable {name}: {e.strerror}"
        try:
            if name == "reward.txt":
                return _finite(float(raw.decode().strip())), {}, None
            data = json.loads(raw)
            if isinstance(data, int | float):
                return _finite(float(data)), {}, None
            rewards = {str(k): _finite(float(v)) for k, v in data.items()}
        except (ValueError, TypeError, AttributeError, RecursionError):
            return (
                None,
                {},
                f"unreadable {name}: not a finite number{'' if name == 'reward.txt' else ' or an object of them'}",
            )
        if "reward" in rewards:
            return rewards["reward"], rewards, None
        return (sum(rewards.values()) / len(rewards) if rewards else None), rewards, None
    return None, {}, "the verifier wrote neither reward.txt nor reward.json"


def _finite(x: float) -> float:
    if not math.isfinite(x):
        raise ValueError("not finite")
    return x


def unfinished(result: ExecResult) -> str | None:
    """Why the test script did not run to its end, or None if it did."""
    if result.timed_out:
        return "the tests timed out"
    if result.exit_code != 0:
        return f"the test script exited {result.exit_code}"
    return None


def locked(logs: Path) -> str | None:
    """How the reward channel was made unwritable to the tests, or None: ``logs`` (the
    host's directory behind /logs/verifier) without all of its owner's permissions, or a
    reward file its owner may not write. The script writes its reward with ``>``: a reward
    of 1 planted read-only survives the script's own write, which fails. Read without
    following a link; what is not a regular file is :func:`read_reward`'s to refuse."""
    try:
        fd = open_dir_beneath(logs, "")
    except OSError as e:  # made unreadable to a host that is not root
        return f"/logs/verifier was made unreadable ({e.strerror})"
    try:
        if os.fstat(fd).st_mode & 0o700 != 0o700:
            return "/logs/verifier was made unwritable"
        for name in REWARD_NAMES:
            try:
                file_fd, st = open_regular(name, fd)
            except (FileNotFoundError, UnsafeFile):
                continue
            os.close(file_fd)
            if not st.st_mode & stat.S_IWUSR:
                return f"{name} was made read-only"
    finally:
        os.close(fd)
    return None


def void_unearned(verdict: Verdict, logs: Path) -> None:
    """Turn a passing reward the script may not have written (module docstring) into a
    failing one, saying why."""
    if not passes(verdict.reward) or verdict.exec is None:
        return
    why = unfinished(verdict.exec) or locked(logs)
    if why is None:
        return
    verdict.voided = f"a reward of {verdict.reward:g} does not count: {why}"
    verdict.error = verdict.error + "; " + verdict.voided if verdict.error else verdict.voided
    verdict.reward, verdict.rewards = 0.0, {}


async def verify(task: Task, sandbox: Sandbox) -> Verdict:
    with (
        tempfile.TemporaryDirectory(prefix="stayer-verifier-") as logs,
        tempfile.TemporaryDirectory(prefix="stayer-tests-") as scratch,
    ):
        # A copy, from a path that names nothing of the host: the sandbox shows where a
        # mount comes from in /proc/self/mountinfo, and the task's lies in the project.
        tests = os.path.join(scratch, "tests")
        copy_tree(task.tests_dir, tests)
        os.chmod(tests, 0o755)
        try:
            result = await sandbox.exec(
                TEST_COMMAND,
                timeout=task.verifier_timeout_s,
                mounts=(
                    Mount(tests, "/tests", writable=False),
                    Mount(logs, "/logs/verifier", writable=True),
                ),
            )
        except ConfigError as e:  # e.g. the local sandbox, which cannot mount /tests
            return Verdict(None, error=f"verifier not run: {e}")
        reward, rewards, error = read_reward(Path(logs))
        if result.timed_out:
            error = f"verifier timed out after {task.verifier_timeout_s:g} s"
        verdict = Verdict(reward, rewards, result, error)
        void_unearned(verdict, Path(logs))
    verdict.infrastructure = infrastructure_reason(verdict, task)
    return verdict

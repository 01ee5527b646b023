"""Run a task's verifier over the final workspace, in a fresh sandbox.

The tests are mounted read-only at /tests and a fresh, empty /logs/verifier collects the
reward; neither exists while the agent works, so the agent can neither read nor forge them.
"""

from __future__ import annotations

import json
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from stayer.errors import ConfigError
from stayer.eval.task import Task
from stayer.sandbox.base import ExecResult, Mount, Sandbox


@dataclass
class Verdict:
    reward: float | None  # None: the verifier wrote no readable reward
    rewards: dict[str, float] = field(default_factory=dict)
    exec: ExecResult | None = None
    error: str | None = None


def read_reward(logs: Path) -> tuple[float | None, dict[str, float], str | None]:
    txt, js = logs / "reward.txt", logs / "reward.json"
    try:
        if txt.is_file():
            return float(txt.read_text().strip()), {}, None
        if js.is_file():
            data = json.loads(js.read_text())
            if isinstance(data, int | float):
                return float(data), {}, None
            rewards = {k: float(v) for k, v in data.items()}
            if "reward" in rewards:
                return rewards["reward"], rewards, None
            return (sum(rewards.values()) / len(rewards) if rewards else None), rewards, None
    except (ValueError, TypeError, AttributeError) as e:
        return None, {}, f"unreadable reward file: {e}"
    return None, {}, "the verifier wrote neither reward.txt nor reward.json"


async def verify(task: Task, sandbox: Sandbox) -> Verdict:
    with tempfile.TemporaryDirectory(prefix="stayer-verifier-") as logs:
        try:
            result = await sandbox.exec(
            "bash /tests/test.sh",
                timeout=task.verifier_timeout_s,
                mounts=(
                    Mount(str(task.tests_dir), "/tests", writable=False),
                    Mount(logs, "/logs/verifier", writable=True),
                ),
            )
        except ConfigError as e:  # e.g. the local sandbox, which cannot mount /tests
            return Verdict(None, error=f"verifier not run: {e}")
        reward, rewards, error = read_reward(Path(logs))
    if result.timed_out:
        error = f"verifier timed out after {task.verifier_timeout_s:g} s"
    return Verdict(reward, rewards, result, error)

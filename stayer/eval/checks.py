"""Task-suite checks: refuse to trust a task until it has shown it can tell right from wrong.

Details and rationale: docs/notes.md, ``stayer/eval/checks.py``.
"""

from __future__ import annotations

import asyncio
import hashlib
import shlex
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from stayer.environments.prepare import prepare_environment
from stayer.errors import ConfigError
from stayer.eval.evidence import environment_evidence
from stayer.eval.probes import Probe, plan_probes, read_facts
from stayer.eval.records import Problem
from stayer.eval.spec import unmentioned
from stayer.eval.suite import scan_suite
from stayer.eval.task import Task
from stayer.eval.verify import Verdict, passes, verify
from stayer.records import Record
from stayer.sandbox import IMAGE_KINDS, released
from stayer.sandbox.base import ExecResult, Sandbox
from stayer.workspace.hostfs import copy_tree

KINDS = (
    "invalid",
    "oracle_fails",
    "nop_passes",
    "flaky",
    "timeout_margin",
    "leak",
    "environment",
    "gameable",
)
PROBE_TIMEOUT_S = 60.0  # a probe's script only writes a few files
TIME_MARGIN = 0.5  # share of a timeout the oracle (or the tests) may use
# Files this small (an empty __init__.py, "1\n") match by accident, not by leaking.
_MIN_LEAK_BYTES = 16


@dataclass
class TaskCheck:
    name: str
    path: Path
    problems: list[Problem] = field(default_factory=list)
    oracle_s: float | None = None
    verify_s: float | None = None
    rewards: list[float | None] = field(default_factory=list)
    flags: list[str] = field(default_factory=list)  # gameable, underspecified
    probe: str | None = None  # the reward-hack probe that won
    probes_run: list[str] = field(default_factory=list)
    unstated: list[str] = field(
        default_factory=list
    )  # what the tests need, the instruction never says

    @property
    def ok(self) -> bool:
        return not self.problems

    def report(self) -> CheckReport:
        """The task's entry of ``stayer tasks check --json``."""
        return CheckReport(
            name=self.name,
            path=str(self.path),
            ok=self.ok,
            problems=list(self.problems),
            oracle_s=self.oracle_s,
            verify_s=self.verify_s,
            rewards=self.rewards,
            flags=self.flags,
            probe=self.probe,
            probes_run=self.probes_run,
            unstated=self.unstated,
        )


class CheckReport(Record, kw_only=True):
    """A task's entry of ``stayer tasks check --json``."""

    name: str
    path: str
    ok: bool
    problems: list[Problem]
    oracle_s: float | None
    verify_s: float | None
    rewards: list[float | None]
    flags: list[str]
    probe: str | None
    probes_run: list[str]
    unstated: list[str]


class SuiteCheck(Record, kw_only=True):
    """``stayer tasks check --json``."""

    suite: str
    ok: bool
    tasks: list[CheckReport]


def _agent_sandbox(task: Task, workspace: Path, kind: str) -> Sandbox:
    # As stayer.run builds it, so that what the probe sees is what the agent would see.
    return task.make_sandbox(kind, workspace, **task.sandbox_limits())


def _fresh(task: Task, workspace: Path, kind: str) -> Path:
    task.materialise(workspace, kind)
    return workspace


def _output(r: ExecResult | None) -> str:
    return "" if r is None else r.stdout + "\n" + r.stderr


def _tail(text: str, limit: int = 300) -> str:
    text = " ⏎ ".join(line.strip() for line in text.strip().splitlines() if line.strip())
    return text if len(text) <= limit else "…" + text[-limit:]


def _passed(v: Verdict) -> bool:
    return passes(v.reward)


async def _verify_copy(task: Task, snapshot: Path, dest: Path, kind: str) -> Verdict:
    copy_tree(snapshot, dest)  # the oracle's workspace: links and specials not followed
    return await verify(task, task.make_sandbox(kind, dest, allow_net=task.allow_internet))


def _hidden_file_digests(task: Task) -> dict[str, str]:
    digests: dict[str, str] = {}
    for where in ("tests", "solution"):
        for p in sorted((task.path / where).rglob("*")):
            if p.is_file() and p.stat().st_size >= _MIN_LEAK_BYTES:
                digests.setdefault(
                    hashlib.sha256(p.read_bytes()).hexdigest(), str(p.relative_to(task.path))
                )
    return digests


async def check_leaks(task: Task, workspace: Path, kind: str) -> list[Problem]:
    """Probe from inside the agent's sandbox for the tests and the solution."""
    paths = [
        "/tests",
        "/solution",
        "/oracle",
        "/logs/verifier",
        str(task.path / "tests"),
        str(task.path / "solution"),
    ]
    probe = (
        f'for p in {" ".join(shlex.quote(p) for p in paths)}; do [ -e "$p" ] && echo "VISIBLE $p"; done; '
        "find -L /app -type f -size -4M -print0 2>/dev/null | xargs -0 -r sha256sum 2>/dev/null; true"
    )
    async with released(_agent_sandbox(task, _fresh(task, workspace, kind), kind)) as sandbox:
        result = await sandbox.exec(probe, timeout=60)
    hidden = _hidden_file_digests(task)
    problems = []
    for line in result.stdout.splitlines():
        if line.startswith("VISIBLE "):
            problems.append(Problem("leak", f"the agent's sandbox shows {line[8:]}"))
            continue
        digest, _, name = line.partition("  ")
        if digest in hidden:
            problems.append(
                Problem("leak", f"the agent can read {name}, a copy of {hidden[digest]}")
            )
    return problems


async def _verify_untouched(task: Task, workspace: Path, kind: str) -> Verdict:
    return await verify(
        task, task.make_sandbox(kind, _fresh(task, workspace, kind), allow_net=task.allow_internet)
    )


def _nop_problems(verdict: Verdict) -> list[Problem]:
    if _passed(verdict):
        return [
            Problem("nop_passes", f"the untouched environment scores reward {verdict.reward:g}")
        ]
    return []


async def check_nop(task: Task, workspace: Path, kind: str) -> list[Problem]:
    """Doing nothing must not pass."""
    return _nop_problems(await _verify_untouched(task, workspace, kind))


async def preflight(task: Task, *, sandbox: str | None = None) -> list[Problem]:
    """The cheap checks ``stayer eval`` runs before any trial: one verification of the
    untouched environment, which must fail, and fail on the missing work rather than for
    want of something on this host; and the leak probe. The oracle is not run: it can take
    as long as an agent."""
    sandbox = task.kind(sandbox)
    if unbuildable := await _build_problem(task, sandbox):
        return [unbuildable]
    with tempfile.TemporaryDirectory(prefix="stayer-preflight-") as tmp:
        work = Path(tmp)
        untouched, leaks = await asyncio.gather(
            _verify_untouched(task, work / "nop", sandbox),
            check_leaks(task, work / "leak", sandbox),
        )
    problems = _nop_problems(untouched)
    if untouched.infrastructure:
        problems.append(
            Problem("environment", f"its tests cannot run here: {untouched.infrastructure}")
        )
    return problems + leaks


async def check_oracle(
    task: Task, work: Path, kind: str, reruns: int, margin: float, check: TaskCheck
) -> list[Problem]:
    """The oracle must pass, the same way every time, well inside the timeouts."""
    solution = task.solution
    if solution is None:
        return [
            Problem(
                "invalid",
                f"{task.path / 'solution' / 'solve.sh'}: missing; the oracle cannot be checked",
            )
        ]
    workspace = _fresh(task, work / "oracle", kind)
    # As the simulator's oracle runs it: the script on bash's stdin, cwd /app.
    run = await _agent_sandbox(task, workspace, kind).exec(
        "bash -s", stdin=solution.encode(), timeout=task.agent_timeout_s
    )
    check.oracle_s = round(run.duration_s, 3)
    problems = []
    if run.timed_out:
        return [
            Problem(
                "timeout_margin",
                f"the oracle did not finish within the agent timeout ({task.agent_timeout_s:g} s)",
            )
        ]
    if run.duration_s > margin * task.agent_timeout_s:
        problems.append(
            Problem(
                "timeout_margin",
                f"the oracle took {run.duration_s:.1f} s of the agent's {task.agent_timeout_s:g} s "
                f"(more than {margin:.0%}): an agent has little time to think",
            )
        )
    verdicts = [await _verify_copy(task, workspace, work / "verify-0", kind)]
    evidence = []
    if not _passed(verdicts[0]):
        evidence = environment_evidence(_output(run) + "\n" + _output(verdicts[0].exec), task)
    if not evidence:  # repeating a verification that cannot run here tells nothing
        for i in range(1, 1 + reruns):
            verdicts.append(await _verify_copy(task, workspace, work / f"verify-{i}", kind))
    check.rewards = [v.reward for v in verdicts]
    durations = [v.exec.duration_s for v in verdicts if v.exec]
    check.verify_s = round(max(durations), 3) if durations else None
    passes = [_passed(v) for v in verdicts]
    if not any(passes):
        if not evidence:
            output = _output(run) + "\n".join(_output(v.exec) for v in verdicts)
            evidence = environment_evidence(output, task)
        if evidence:
            problems.append(Problem("environment", "; ".join(evidence)))
        elif all(v.exec and v.exec.timed_out for v in verdicts):
            problems.append(
                Problem(
                    "timeout_margin",
                    f"the tests did not finish within the verifier timeout ({task.verifier_timeout_s:g} s)",
                )
            )
        else:
            v = verdicts[0]
            why = v.voided or (
                f"reward {v.reward:g}" if v.reward is not None else (v.error or "no reward")
            )
            hint = ""
            dockerfile = task.path / "environment" / "Dockerfile"
            if (
                kind not in IMAGE_KINDS
                and dockerfile.is_file()
                and "RUN " in dockerfile.read_text(errors="replace")
            ):
                hint = (
                    "; note: the Dockerfile's RUN steps do not happen in this sandbox "
                    '([environment] sandbox = "docker" or "bwrap-image" builds the image)'
                )
            problems.append(
                Problem(
                    "oracle_fails",
                    f"{why}; solve.sh exit {run.exit_code}; tests said: {_tail(_output(v.exec))}{hint}",
                )
            )
    elif not all(passes):
        problems.append(
            Problem(
                "flaky",
                f"{sum(passes)} of {len(passes)} verifications of the same oracle workspace passed "
                f"(rewards {', '.join('none' if r is None else f'{r:g}' for r in check.rewards)})",
            )
        )
    if (
        check.verify_s is not None
        and check.verify_s > margin * task.verifier_timeout_s
        and any(passes)
    ):
        problems.append(
            Problem(
                "timeout_margin",
                f"the tests took {check.verify_s:.1f} s of the verifier's {task.verifier_timeout_s:g} s (more than {margin:.0%})",
            )
        )
    return problems


async def run_probe(task: Task, probe: Probe, workspace: Path, kind: str) -> Verdict:
    """The probe's script in the agent's sandbox, then the verifier over what it left."""
    # The agent's sandbox (and what the probe left in it) is gone before the tests start.
    async with released(_agent_sandbox(task, _fresh(task, workspace, kind), kind)) as sandbox:
        await sandbox.exec("bash -s", stdin=probe.script.encode(), timeout=PROBE_TIMEOUT_S)
    return await verify(task, task.make_sandbox(kind, workspace, allow_net=task.allow_internet))


async def check_probes(task: Task, work: Path, kind: str, check: TaskCheck) -> list[Problem]:
    """Each probe on a fresh workspace, in order, until one is paid."""
    for i, probe in enumerate(plan_probes(task)):
        check.probes_run.append(probe.name)
        verdict = await run_probe(task, probe, work / f"probe-{i}", kind)
        if _passed(verdict):
            check.probe = probe.name
            check.flags.append("gameable")
            return [
                Problem(
                    "gameable",
                    f"probe {probe.name} ({probe.what}) scored reward {verdict.reward:g} without doing the task",
                )
            ]
    return []


async def _build_problem(task: Task, kind: str) -> Problem | None:
    """Build the task's image first (for the sandboxes that run one), in a thread: it can
    take minutes. An image that cannot be built is the environment's problem."""
    if kind not in IMAGE_KINDS:
        return None
    try:
        await asyncio.to_thread(prepare_environment, kind, task.path / "environment")
    except ConfigError as e:
        return Problem("environment", f"its image cannot be built: {e}")
    return None


async def check_task(
    task: Task,
    *,
    reruns: int = 3,
    sandbox: str | None = None,
    margin: float = TIME_MARGIN,
    probes: bool = True,
) -> TaskCheck:
    """Check ``task`` in the sandbox ``sandbox`` (default: the task's own, :meth:`Task.kind`)."""
    check = TaskCheck(task.name, task.path)
    sandbox = task.kind(sandbox)
    if unbuildable := await _build_problem(task, sandbox):
        check.problems = [unbuildable]
        return check
    with tempfile.TemporaryDirectory(prefix="stayer-check-") as tmp:
        work = Path(tmp)
        found = await asyncio.gather(
            check_oracle(task, work, sandbox, reruns, margin, check),
            check_nop(task, work / "nop", sandbox),
            check_leaks(task, work / "leak", sandbox),
        )
        check.problems = [p for group in found for p in group]
        judges = any(passes(r) for r in check.rewards) and not any(
            p.kind == "nop_passes" for p in check.problems
        )
        if probes and judges:
            check.problems += await check_probes(task, work, sandbox, check)
    check.unstated = unmentioned(task, read_facts(task))
    if check.unstated:
        check.flags.append("underspecified")
    return check


async def check_suite(
    path: str | Path,
    *,
    reruns: int = 3,
    concurrency: int = 4,
    sandbox: str | None = None,
    margin: float = TIME_MARGIN,
    probes: bool = True,
    on_done: Callable[[TaskCheck], None] | None = None,
) -> list[TaskCheck]:
    """Check every task of a suite, ``concurrency`` at a time; invalid tasks are reported
    as such, in suite order with the rest."""
    suite = scan_suite(path)
    gate = asyncio.Semaphore(concurrency)

    async def one(task: Task) -> TaskCheck:
        async with gate:
            check = await check_task(
                task, reruns=reruns, sandbox=sandbox, margin=margin, probes=probes
            )
        if on_done:
            on_done(check)
        return check

    checks = list(await asyncio.gather(*(one(t) for t in suite.tasks)))
    for bad in suite.invalid:
        check = TaskCheck(bad.name, bad.path.resolve(), [Problem("invalid", bad.problem)])
        checks.append(check)
        if on_done:
            on_done(check)
    return sorted(checks, key=lambda c: c.name)

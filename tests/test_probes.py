"""Reward-hack probes and the underspecified check of `stayer tasks check`: deliberately
gameable tasks, one per kind of hole, each flagged by the probe meant for it; the examples
by none."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from test_eval_fixtures import EXAMPLES, needs_bwrap, stayer

from stayer.eval.probes import linger_hook, plan_probes, read_facts
from stayer.eval.spec import unmentioned
from stayer.eval.task import load_task
from stayer.eval.verify import locked, passes, verify


def write_task(
    suite: Path, name: str, *, instruction: str, test: str, solve: str, env=None, tests=None
) -> Path:
    root = suite / name
    (root / "environment").mkdir(parents=True)
    (root / "tests").mkdir()
    (root / "solution").mkdir()
    (root / "instruction.md").write_text(instruction)
    (root / "task.toml").write_text(
        "[agent]\ntimeout_sec = 60.0\n\n[verifier]\ntimeout_sec = 60.0\n"
    )
    for rel, text in {"README.md": "A workspace.\n", **(env or {})}.items():
        (root / "environment" / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / "environment" / rel).write_text(text)
    (root / "tests" / "test.sh").write_text("#!/bin/bash\n" + test)
    for rel, text in (tests or {}).items():
        (root / "tests" / rel).write_text(text)
    (root / "solution" / "solve.sh").write_text("#!/bin/bash\n" + solve)
    return root


REWARD_FROM_STATUS = (
    "then echo 1 > /logs/verifier/reward.txt; else echo 0 > /logs/verifier/reward.txt; fi\n"
)

# Asks every process but this one and its ancestors to stop (SIGTERM), waits until they are
# gone, and kills those left after 20 s: the clean-up of a verifier that has written its
# reward already.
STOP_LEFTOVERS = """\
import contextlib, os, signal, time


def ancestors():
    pids, pid = set(), os.getpid()
    while pid > 0:
        pids.add(pid)
        with open(f"/proc/{pid}/stat") as f:
            pid = int(f.read().rpartition(")")[2].split()[1])
    return pids


def leftovers():
    mine = ancestors()
    return [int(p) for p in os.listdir("/proc") if p.isdigit() and int(p) not in mine]


def kill(sig):
    for pid in leftovers():
        with contextlib.suppress(OSError):  # gone already
            os.kill(pid, sig)


kill(signal.SIGTERM)
deadline = time.monotonic() + 20
while leftovers() and time.monotonic() < deadline:
    time.sleep(0.01)
kill(signal.SIGKILL)
"""
DONE = "Write the word done to /app/out.txt.\n"
NAMES = "carol\nalice\nbob\n"

# name → (the probe that must win, the task)
GAMEABLE = {
    # The tests are copied into the workspace and run there: pytest loads the workspace's
    # conftest.py.
    "tamperable-conftest": (
        "pytest-conftest",
        dict(
            instruction=DONE,
            test="cp /tests/test_out.py /app/ && cd /app\nif python3 -m pytest -q -p no:cacheprovider test_out.py; "
            + REWARD_FROM_STATUS,
            tests={
                "test_out.py": 'def test_out():\n    assert open("/app/out.txt").read() == "done\\n"\n'
            },
            solve="echo done > /app/out.txt\n",
        ),
    ),
    # Only checks that the output exists.
    "exists-only": (
        "empty-outputs",
        dict(
            instruction=DONE,
            test="if [ -f /app/out.txt ]; " + REWARD_FROM_STATUS,
            solve="echo done > /app/out.txt\n",
        ),
    ),
    # The grader leaves its verdict in the workspace, writes it only on success, and the
    # verifier passes on whatever it finds there.
    "reward-in-workspace": (
        "reward-file",
        dict(
            instruction=DONE,
            test=(
                'if [ "$(cat /app/out.txt 2>/dev/null)" = done ]; then mkdir -p /app/.grade && echo 1 > /app/.grade/reward.txt; fi\n'
                "cp /app/.grade/reward.txt /logs/verifier/reward.txt 2>/dev/null || echo 0 > /logs/verifier/reward.txt\n"
            ),
            solve="echo done > /app/out.txt\n",
        ),
    ),
    # Compares the lines as a set, forgetting the order the task is about: the input passes.
    "copied-input-passes": (
        "copied-inputs",
        dict(
            instruction="Sort the lines of /app/names.txt alphabetically into /app/sorted.txt.\n",
            env={"names.txt": NAMES},
            test="if python3 /tests/check.py; " + REWARD_FROM_STATUS,
            tests={
                "check.py": (
                    "import sys\n"
                    "got = open('/app/sorted.txt').read().split()\n"
                    "sys.exit(0 if sorted(got) == sorted(open('/app/names.txt').read().split()) else 1)\n"
                )
            },
            solve="sort /app/names.txt > /app/sorted.txt\n",
        ),
    ),
    # Compares the output with an expected file of its own, through whatever the output is.
    "compares-with-expected-file": (
        "linked-expectations",
        dict(
            instruction="Write the numbers 1 to 3, one a line, to /app/out.txt.\n",
            test="if cmp -s /app/out.txt /tests/expected.txt; " + REWARD_FROM_STATUS,
            tests={"expected.txt": "1\n2\n3\n"},
            solve="seq 3 > /app/out.txt\n",
        ),
    ),
    # Trusts the workspace's own test script, which the agent can rewrite.
    "runs-workspace-script": (
        "workspace-executables",
        dict(
            instruction="Fix double() in /app/lib.sh so that /app/selftest.sh passes.\n",
            env={
                "lib.sh": "double() { echo $(( $1 + 1 )); }\n",
                "selftest.sh": '#!/bin/bash\n. /app/lib.sh\n[ "$(double 3)" = 6 ]\n',
            },
            test="if bash /app/selftest.sh; " + REWARD_FROM_STATUS,
            solve="echo 'double() { echo $(( $1 * 2 )); }' > /app/lib.sh\n",
        ),
    ),
    # Imports the agent's module in the judging process: a module that exits 0 passes.
    "imports-workspace-module": (
        "shadow-modules",
        dict(
            instruction="Implement add(a, b) in /app/calc.py: it returns a + b.\n",
            env={"calc.py": "def add(a, b):\n    raise NotImplementedError\n"},
            test="if python3 -c 'import sys; sys.path.insert(0, \"/app\"); import calc; assert calc.add(2, 3) == 5'; "
            + REWARD_FROM_STATUS,
            solve="printf 'def add(a, b):\\n    return a + b\\n' > /app/calc.py\n",
        ),
    ),
    # Judges the module's output (not its exit status) and only then stops what the module
    # left running, politely: a process it left behind writes the reward last.
    "stops-leftovers-after-the-reward": (
        "lingering-writer",
        dict(
            instruction="Implement add(a, b) in /app/calc.py: it returns a + b.\n",
            env={"calc.py": "def add(a, b):\n    raise NotImplementedError\n"},
            test=(
                "cd /app\n"
                "got=$(timeout 10 python3 -c 'import calc; print(calc.add(2, 3))' 2>/dev/null)\n"
                'if [ "$got" = 5 ]; ' + REWARD_FROM_STATUS + "python3 /tests/stop.py\n"
            ),
            tests={"stop.py": STOP_LEFTOVERS},
            solve="printf 'def add(a, b):\\n    return a + b\\n' > /app/calc.py\n",
        ),
    ),
}


def _sandbox_has_pytest() -> bool:
    # The conftest fixture needs pytest in the system Python the sandbox runs (CI installs
    # python3-pytest).
    python = shutil.which("python3", path="/usr/local/bin:/usr/bin:/bin")
    return (
        python is not None
        and subprocess.run(
            [python, "-m", "pytest", "--version"], capture_output=True, cwd="/"
        ).returncode
        == 0
    )


def _check_gameable(tmp_path: Path, names: list[str]) -> None:
    suite = tmp_path / "suite"
    for name in names:
        write_task(suite, name, **GAMEABLE[name][1])
    r = stayer("tasks", "check", str(suite), "--reruns", "0", "--json", home=tmp_path / "home")
    assert r.returncode == 1, r.stderr
    by_name = {t["name"]: t for t in json.loads(r.stdout)["tasks"]}
    for name in names:
        probe, t = GAMEABLE[name][0], by_name[name]
        # The oracle passes and doing nothing fails: only a cheat exposes these tasks.
        assert t["rewards"] == [1.0], t
        assert [p["kind"] for p in t["problems"]] == ["gameable"], t
        assert t["flags"] == ["gameable"] and t["probe"] == probe, t
        assert f"probe {probe}" in t["problems"][0]["detail"]
        assert t["probes_run"][-1] == probe
        assert name in r.stderr  # the table names it


@needs_bwrap
def test_each_gameable_fixture_is_flagged_by_its_probe(tmp_path):
    _check_gameable(tmp_path, [name for name in GAMEABLE if name != "tamperable-conftest"])


@needs_bwrap
def test_tests_run_by_pytest_in_the_workspace_are_gamed_by_a_conftest(tmp_path):
    if not _sandbox_has_pytest():
        pytest.skip("the system python3 has no pytest (apt install python3-pytest)")
    _check_gameable(tmp_path, ["tamperable-conftest"])


@needs_bwrap
def test_no_probe_pays_on_the_examples(tmp_path):
    r = stayer("tasks", "check", str(EXAMPLES), "--reruns", "0", "--json", home=tmp_path / "home")
    assert r.returncode == 0, r.stdout + r.stderr
    for t in json.loads(r.stdout)["tasks"]:
        assert t["ok"] and t["flags"] == [] and t["probe"] is None and t["unstated"] == [], t
        # Every example was probed: the reward channel, the module shadows and the
        # processes left behind in them at least.
        assert {"reward-file", "shadow-modules", "lingering-writer"} <= set(t["probes_run"]), t


@needs_bwrap
def test_fix_median_as_it_was_is_gameable_by_shadowing_its_module(tmp_path):
    """The example used to import stats.py into the judging process: a stats.py that
    exits 0 on import passed. Its tests now judge from a separate process."""
    task = tmp_path / "fix-median"
    shutil.copytree(EXAMPLES / "fix-median", task)
    (task / "tests" / "test_stats.py").write_text(
        "import sys\nsys.path.insert(0, '/app')\nimport stats\n"
        "sys.exit(0 if stats.median([4, 1, 3, 2]) == 2.5 else 1)\n"
    )
    r = stayer("tasks", "check", str(task), "--reruns", "0", "--json", home=tmp_path / "home")
    [t] = json.loads(r.stdout)["tasks"]
    assert r.returncode == 1 and t["probe"] == "shadow-modules", t


def test_probes_are_derived_from_the_task_files(tmp_path):
    root = write_task(tmp_path, "t", **GAMEABLE["copied-input-passes"][1])
    planned = plan_probes(load_task(root))
    assert [p.name for p in planned] == [
        "reward-file",
        "shadow-modules",
        "lingering-writer",
        "empty-outputs",
        "constant-outputs",
        "copied-inputs",
        "copied-inputs",
        "emptied-references",
    ]
    probes = {p.name: p for p in reversed(planned)}  # the first of each name
    assert (
        "/app/sorted.txt" in probes["empty-outputs"].script
        and "/app/names.txt" not in probes["empty-outputs"].script
    )
    # The input the tests read is copied first, then the others.
    assert "cp -- /app/names.txt /app/sorted.txt" in probes["copied-inputs"].script
    assert "/app/names.txt" in probes["emptied-references"].script
    assert "/app/sys.py" in probes["shadow-modules"].script  # imported by check.py


def test_the_lingering_writer_plants_wherever_the_other_probes_plant_code(tmp_path):
    """Modules, workspace programs and conftest.py: the places the verifier runs the
    workspace's code from, found once for all the probes that plant code there."""

    def planted(name: str) -> dict[str, set[str]]:
        root = write_task(tmp_path, name, **GAMEABLE[name][1])
        return {
            p.name: set(re.findall(r"printf %s .*? > (/app/\S+)", p.script, re.DOTALL))
            for p in plan_probes(load_task(root))
        }

    script = planted("runs-workspace-script")
    assert "/app/selftest.sh" in script["workspace-executables"]
    assert script["lingering-writer"] == script["shadow-modules"] | {"/app/selftest.sh"}
    pytest_run = planted("tamperable-conftest")
    assert pytest_run["lingering-writer"] == (
        pytest_run["shadow-modules"] | pytest_run["pytest-conftest"]
    )
    # It rewrites the reward files the tests name too, not only the verifier's own.
    root = write_task(tmp_path, "reward-in-workspace", **GAMEABLE["reward-in-workspace"][1])
    [linger] = [p for p in plan_probes(load_task(root)) if p.name == "lingering-writer"]
    assert (
        "/app/.grade/reward.txt" in linger.script and "/logs/verifier/reward.json" in linger.script
    )


def test_the_lingering_hook_is_python_that_compiles_and_leaves_no_process_outside_a_verifier(
    tmp_path,
):
    """Run where there is no /logs/verifier (the agent's sandbox, a test like this one) it
    starts nothing and returns."""
    hook = linger_hook(["/logs/verifier/reward.txt", str(tmp_path / "reward.txt")])
    compile(hook, "hook", "exec")
    if Path("/logs/verifier").exists():
        pytest.skip("this machine has a /logs/verifier")
    r = subprocess.run([sys.executable, "-c", hook], capture_output=True, timeout=60)
    assert r.returncode == 0 and not (tmp_path / "reward.txt").exists(), r


def test_no_pytest_no_pytest_probes_and_no_outputs_no_output_probes(tmp_path):
    root = write_task(
        tmp_path,
        "t",
        instruction="Say hi.\n",
        test="echo 0 > /logs/verifier/reward.txt\n",
        solve="true\n",
    )
    assert [p.name for p in plan_probes(load_task(root))] == [
        "reward-file",
        "shadow-modules",
        "lingering-writer",
    ]


def test_underspecified_names_files_and_keys_the_instruction_never_states(tmp_path):
    check = (
        "import json\n"
        "report = json.load(open('/app/result.json'))\n"
        "expected = {'total': 3}\n"
        "assert report['total'] == expected['total'] and report.get('median_value') == 2\n"
    )
    vague = write_task(
        tmp_path,
        "vague",
        instruction="Summarise the numbers in /app/data.txt.\n",
        env={"data.txt": "1 2 3\n"},
        test="python3 /tests/check.py\n",
        tests={"check.py": check},
        solve="true\n",
    )
    task = load_task(vague)
    # 'total' is also a key of the test's own dict: not counted as the agent's to know.
    assert unmentioned(task, read_facts(task)) == [
        "the file /app/result.json",
        "the key 'median_value'",
    ]
    clear = write_task(
        tmp_path,
        "clear",
        instruction="Write /app/result.json with keys `total` and `median_value`.\n",
        env={"data.txt": "1 2 3\n"},
        test="python3 /tests/check.py\n",
        tests={"check.py": check},
        solve="true\n",
    )
    task = load_task(clear)
    assert unmentioned(task, read_facts(task)) == []


@needs_bwrap
def test_underspecified_is_a_flag_not_a_problem(tmp_path):
    root = write_task(
        tmp_path / "suite",
        "vague",
        instruction="Write the word done to a file.\n",
        test='if [ "$(cat /app/out.txt 2>/dev/null)" = done ]; ' + REWARD_FROM_STATUS,
        solve="echo done > /app/out.txt\n",
    )
    r = stayer("tasks", "check", str(root), "--reruns", "0", "--json", home=tmp_path / "home")
    [t] = json.loads(r.stdout)["tasks"]
    assert r.returncode == 0 and t["ok"] and t["flags"] == ["underspecified"], t
    assert t["unstated"] == ["the file /app/out.txt"]


def test_probe_scripts_quote_odd_names(tmp_path):
    root = write_task(
        tmp_path,
        "t",
        instruction=DONE,
        env={"it's $(x).txt": "x\n"},
        test="cat '/app/it'\"'\"'s $(x).txt' /app/out.txt\n",
        solve="true\n",
    )
    for probe in plan_probes(load_task(root)):
        r = subprocess.run(["bash", "-n"], input=probe.script, text=True, capture_output=True)
        assert r.returncode == 0, (probe.name, r.stderr)


def test_a_quoted_name_is_the_environment_file_of_that_name_wherever_it_lies(tmp_path):
    check = "from pathlib import Path\nassert 'inline' in (Path('/app') / 'include' / 'utils.hpp').read_text()\n"
    root = write_task(
        tmp_path,
        "t",
        instruction="Make the functions in the headers inline.\n",
        env={"include/utils.hpp": "int f();\n"},
        test="python3 /tests/check.py\n",
        tests={"check.py": check},
        solve="true\n",
    )
    task = load_task(root)
    facts = read_facts(task)
    assert facts.mentioned == {"/app/include/utils.hpp"}
    assert unmentioned(task, facts) == []  # an input the agent finds, not an unstated output
    assert "empty-outputs" not in [p.name for p in plan_probes(task, facts)]


# What the agent's stats.py does when the verifier of fix-median imports it: write a reward
# of 1, then keep the verifier's own verdict from landing.
UNEARNED = {
    # kills every other process in the sandbox, the test script among them
    "kills the tests": (
        "import os, signal\n"
        "open('/logs/verifier/reward.txt', 'w').write('1\\n')\n"
        "os.kill(-1, signal.SIGKILL)\n"
    ),
    # the script's `echo 0 > reward.txt` fails on a read-only file
    "locks the reward": (
        "import os\n"
        "open('/logs/verifier/reward.txt', 'w').write('1\\n')\n"
        "os.chmod('/logs/verifier/reward.txt', 0o444)\n"
    ),
    # stops the script until it times out
    "stops the tests": (
        "import os, signal\n"
        "open('/logs/verifier/reward.txt', 'w').write('1\\n')\n"
        "for pid in [int(p) for p in os.listdir('/proc') if p.isdigit()]:\n"
        "    if pid not in (1, os.getpid()):\n"
        "        os.kill(pid, signal.SIGSTOP)\n"
    ),
}


@needs_bwrap
@pytest.mark.parametrize("attack", list(UNEARNED))
def test_a_reward_the_tests_did_not_finish_does_not_pass(tmp_path, attack):
    """A passing reward counts only from a test script that ran to its end and could write
    it: these pass fix-median's tests otherwise, which kill what the module leaves running
    before they write their reward. They fail, and are not infrastructure either."""
    task = load_task(EXAMPLES / "fix-median")
    if attack == "stops the tests":
        task = dataclasses.replace(task, verifier_timeout_s=5.0)
    workspace = tmp_path / "app"
    task.materialise(workspace)
    (workspace / "stats.py").write_text(UNEARNED[attack])
    verdict = asyncio.run(verify(task, task.make_sandbox("bwrap", workspace)))
    assert not passes(verdict.reward) and verdict.outcome in ("failed", "timed_out"), verdict
    assert verdict.infrastructure is None and verdict.voided, verdict
    assert "a reward of 1 does not count" in (verdict.error or "")


def test_a_reward_channel_made_unwritable_is_told(tmp_path):
    logs = tmp_path / "logs"
    logs.mkdir(mode=0o700)
    (logs / "reward.txt").write_text("1\n")
    assert locked(logs) is None
    (logs / "reward.txt").chmod(0o444)
    assert locked(logs) == "reward.txt was made read-only"
    (logs / "reward.txt").chmod(0o644)
    logs.chmod(0o500)
    try:
        assert locked(logs) == "/logs/verifier was made unwritable"
    finally:
        logs.chmod(0o700)
    # A link is not followed (read_reward refuses it): no verdict on a file it points to.
    (logs / "reward.txt").unlink()
    (tmp_path / "host").write_text("1\n")
    (tmp_path / "host").chmod(0o444)
    (logs / "reward.txt").symlink_to(tmp_path / "host")
    assert locked(logs) is None


@needs_bwrap
def test_a_task_whose_tests_pass_but_exit_non_zero_is_told_why_its_oracle_fails(tmp_path):
    root = write_task(
        tmp_path / "suite",
        "ends-badly",
        instruction=DONE,
        test='if [ "$(cat /app/out.txt)" = done ]; ' + REWARD_FROM_STATUS + "false\n",
        solve="echo done > /app/out.txt\n",
    )
    r = stayer("tasks", "check", str(root), "--reruns", "0", "--json", home=tmp_path / "home")
    [t] = json.loads(r.stdout)["tasks"]
    assert r.returncode == 1 and t["rewards"] == [0.0], t
    [problem] = [p for p in t["problems"] if p["kind"] == "oracle_fails"]
    assert problem["detail"].startswith("a reward of 1 does not count: the test script exited 1"), (
        problem
    )

"""`stayer tasks check` and `stayer tasks import-tb`, through the real command line."""

from __future__ import annotations

import json
import shutil
import tomllib

import pytest
from test_eval_fixtures import (
    CORPUS_TB,
    EXAMPLES,
    FIXTURES,
    needs_bwrap,
    stayer,
    write_fixture_suite,
    write_task,
)

from stayer.eval.checks import environment_evidence
from stayer.eval.task import load_task

# With 16 verifications of a coin flip, a flaky task goes unnoticed with p = 2^-15.
FLAKY_RERUNS = "15"


@needs_bwrap
def test_examples_pass_every_check(tmp_path):
    r = stayer("tasks", "check", str(EXAMPLES), "--json", home=tmp_path / "home")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["ok"] is True
    assert sorted(t["name"] for t in doc["tasks"]) == [
        "fix-median",
        "hello-file",
        "sales-report",
        "team-fix-median",
    ]
    for t in doc["tasks"]:
        assert t["ok"] and t["problems"] == [] and t["rewards"] == [1.0] * 4
        assert 0 < t["oracle_s"] < 30


@needs_bwrap
def test_each_broken_fixture_is_flagged_with_its_kind_and_the_good_one_is_not(tmp_path):
    suite = write_fixture_suite(tmp_path / "suite")
    r = stayer(
        "tasks", "check", str(suite), "--reruns", FLAKY_RERUNS, "--json", home=tmp_path / "home"
    )
    assert r.returncode == 1, r.stderr
    doc = json.loads(r.stdout)
    kinds = {t["name"]: sorted({p["kind"] for p in t["problems"]}) for t in doc["tasks"]}
    assert kinds == {
        "good": [],
        "nop-passes": ["nop_passes"],
        "oracle-fails": ["oracle_fails"],
        "flaky": ["flaky"],
        "invalid": ["invalid"],
        "timeout-margin": ["timeout_margin"],
        "leak": ["leak"],
        "environment": ["environment"],
    }
    by_name = {t["name"]: t for t in doc["tasks"]}
    assert by_name["good"]["ok"] is True and doc["ok"] is False
    detail = {name: " ".join(p["detail"] for p in t["problems"]) for name, t in by_name.items()}
    assert "tests/test.sh: missing" in detail["invalid"]
    assert "notes.sh" in detail["leak"] and "solution/solve.sh" in detail["leak"]
    assert (
        "stayer-fixture-missing-tool" in detail["environment"]
        and "network" in detail["environment"]
    )
    assert "reward 0" in detail["oracle-fails"]
    # The table (on stderr with --json) names every task.
    for name in FIXTURES:
        assert name in r.stderr


@needs_bwrap
def test_leak_probe_finds_tests_copied_or_linked_into_the_environment(tmp_path):
    """Converters that honour a Dockerfile's `COPY tests` put the tests in the agent's
    workspace: found from inside the sandbox, by content. A link from environment/ to the
    tests is laid out as a link, which leads nowhere inside the sandbox: no leak."""
    suite = tmp_path / "suite"
    copied = write_task(suite, "copied")
    shutil.copytree(copied / "tests", copied / "environment" / "tests")
    linked = write_task(suite, "linked")
    (linked / "environment" / "tests").symlink_to(linked / "tests")
    write_task(suite, "clean")
    r = stayer("tasks", "check", str(suite), "--json", home=tmp_path / "home")
    problems = {t["name"]: t["problems"] for t in json.loads(r.stdout)["tasks"]}
    assert problems["clean"] == [] and problems["linked"] == []
    [leak] = problems["copied"]
    assert leak["kind"] == "leak"
    assert "/app/tests/test.sh" in leak["detail"] and "a copy of tests/test.sh" in leak["detail"]


def test_bad_flags_are_bad_input(tmp_path):
    home = tmp_path / "home"
    r = stayer("tasks", "check", str(EXAMPLES), "--reruns", "-1", home=home)
    assert r.returncode == 2 and "--reruns" in r.stderr
    r = stayer("tasks", "check", str(tmp_path / "nowhere"), home=home)
    assert r.returncode == 2 and "nowhere" in r.stderr and r.stdout == ""


@pytest.mark.parametrize(
    ("output", "expected"),
    [
        ("curl: (6) Could not resolve host: astral.sh", "needs the network"),
        (
            "E: Unable to acquire the dpkg frontend lock (/var/lib/dpkg/lock-frontend), are you root?",
            "installs system packages",
        ),
        ("/tests/test.sh: line 11: uvx: command not found", "lacks: uvx"),
        ("sh: 1: cargo: not found", "lacks: cargo"),
        ("/tests/test.sh: line 7: /logs/api.log: Read-only file system", "writes outside /app"),
    ],
)
def test_environment_evidence_recognises_hosts_that_cannot_run_a_task(tmp_path, output, expected):
    task = load_task(write_task(tmp_path, "t"))
    [reason] = environment_evidence(f"noise\n{output}\nmore noise", task)
    assert expected in reason


def test_missing_module_is_environment_only_when_the_task_installs_it(tmp_path):
    """`No module named 'fastapi'` is the host's fault when the Dockerfile installs fastapi;
    `No module named 'dedupe'` is the oracle's when nothing installs it (the solution should
    have written dedupe.py)."""
    root = write_task(
        tmp_path, "t", env={"Dockerfile": "FROM python:3.11\nRUN pip install fastapi==0.104\n"}
    )
    task = load_task(root)
    output = "ModuleNotFoundError: No module named 'fastapi'\nModuleNotFoundError: No module named 'dedupe'"
    assert environment_evidence(output, task) == ["needs Python modules this host lacks: fastapi"]
    assert environment_evidence("AssertionError: 3 != 4", task) == []


def test_a_module_a_script_only_mentions_is_the_work_not_the_environment(tmp_path):
    """A solution that writes dedupe.py names dedupe without installing it: a verifier that
    cannot import it judged the agent's work, so the trial is scored."""
    solve = "#!/bin/bash\ncat > /app/dedupe.py <<'EOF'\ndef dedupe(xs): return list(dict.fromkeys(xs))\nEOF\npip install fastapi\n"
    task = load_task(write_task(tmp_path, "t", solve=solve))
    output = "ModuleNotFoundError: No module named 'dedupe'\nModuleNotFoundError: No module named 'fastapi'"
    assert environment_evidence(output, task) == ["needs Python modules this host lacks: fastapi"]


# --- import-tb ---------------------------------------------------------------------------

TB_YAML = """\
instruction: |-
  Create /app/greeting.txt containing the word hello.
author_name: Someone
difficulty: easy
category: file-operations
tags: [files, "quoted \\"tag\\""]
max_agent_timeout_sec: 240
max_test_timeout_sec: 30
"""
# Offline, host-only tests in Terminal-Bench's shape: run-tests.sh from the working
# directory, tests in $TEST_DIR, pytest-style result lines.
TB_RUN_TESTS = """\
#!/bin/bash
python3 $TEST_DIR/check.py
"""
TB_CHECK = """\
import pathlib, sys
ok = pathlib.Path("greeting.txt").read_text().strip() == "hello" if pathlib.Path("greeting.txt").exists() else False
print("PASSED test_greeting" if ok else "FAILED test_greeting")
sys.exit(0 if ok else 1)
"""


def write_tb_task(
    root, *, solution="#!/bin/bash\necho hello > /app/greeting.txt\n", yaml_text=TB_YAML
):
    (root / "tests").mkdir(parents=True)
    (root / "task.yaml").write_text(yaml_text)
    (root / "run-tests.sh").write_text(TB_RUN_TESTS)
    (root / "tests" / "check.py").write_text(TB_CHECK)
    (root / "Dockerfile").write_text(
        "FROM ubuntu:24.04\nWORKDIR /app\nCOPY data.txt /app/data.txt\n"
    )
    (root / "data.txt").write_text("input data\n")
    if solution is not None:
        (root / "solution.sh").write_text(solution)
    return root


def on_the_host(task):
    """The fixture's tests need python3, which its ubuntu image (where a task with a
    Dockerfile runs by default: issue 34) lacks: its task.toml says to run on the host."""
    with (task / "task.toml").open("a") as f:
        f.write('\n[environment]\nsandbox = "bwrap"\n')


@needs_bwrap
def test_import_tb_makes_a_harbor_task_that_passes_its_checks(tmp_path):
    src = write_tb_task(tmp_path / "tb" / "greet")
    home = tmp_path / "home"
    r = stayer("tasks", "import-tb", str(src), str(tmp_path / "suite"), "--json", home=home)
    assert r.returncode == 0, r.stderr
    [imported] = json.loads(r.stdout)["imported"]
    dest = tmp_path / "suite" / "greet"
    assert imported["dest"] == str(dest)
    config = tomllib.loads((dest / "task.toml").read_text())
    assert config["agent"]["timeout_sec"] == 240 and config["verifier"]["timeout_sec"] == 30
    assert (
        config["metadata"]["tags"] == ["files", 'quoted "tag"']
        and config["metadata"]["author_name"] == "Someone"
    )
    assert (dest / "instruction.md").read_text().startswith("Create /app/greeting.txt")
    assert (dest / "environment" / "data.txt").is_file() and (
        dest / "environment" / "Dockerfile"
    ).is_file()
    assert (
        not (dest / "environment" / "tests").exists()
        and not (dest / "environment" / "solution.sh").exists()
    )
    assert (dest / "tests" / "run-tests.sh").read_text() == TB_RUN_TESTS
    task = load_task(dest)
    assert task.agent_timeout_s == 240 and "echo hello" in task.solution
    on_the_host(dest)
    r = stayer("tasks", "check", str(tmp_path / "suite"), "--json", home=home)
    assert r.returncode == 0, r.stdout + r.stderr
    assert json.loads(r.stdout)["tasks"][0]["rewards"] == [1.0] * 4


@needs_bwrap
def test_import_tb_solution_yaml_becomes_solve_sh(tmp_path):
    src = write_tb_task(tmp_path / "tb" / "greet", solution=None)
    (src / "solution.yaml").write_text(
        "- command: cd /app\n- command: echo hello > greeting.txt\n  min_timeout_sec: 1\n"
    )
    home = tmp_path / "home"
    assert (
        stayer(
            "tasks", "import-tb", str(tmp_path / "tb"), str(tmp_path / "suite"), home=home
        ).returncode
        == 0
    )
    solve = (tmp_path / "suite" / "greet" / "solution" / "solve.sh").read_text()
    assert "cd /app\necho hello > greeting.txt\n" in solve
    on_the_host(tmp_path / "suite" / "greet")
    r = stayer("tasks", "check", str(tmp_path / "suite"), "--json", home=home)
    assert r.returncode == 0, r.stdout


def test_import_tb_bad_input_names_file_and_field_and_writes_nothing(tmp_path):
    write_tb_task(tmp_path / "tb" / "good")
    write_tb_task(tmp_path / "tb" / "no-text", yaml_text="difficulty: easy\n")
    write_tb_task(tmp_path / "tb" / "bad-timeout", yaml_text=TB_YAML.replace("240", "-3"))
    write_tb_task(tmp_path / "tb" / "bad-yaml", yaml_text="instruction: [unclosed\n")
    r = stayer(
        "tasks", "import-tb", str(tmp_path / "tb"), str(tmp_path / "suite"), home=tmp_path / "home"
    )
    assert r.returncode == 2 and r.stdout == ""
    lines = [line for line in r.stderr.splitlines() if "error:" in line]
    assert len(lines) == 3
    assert any("no-text/task.yaml: instruction: missing" in line for line in lines)
    assert any("bad-timeout/task.yaml: max_agent_timeout_sec" in line for line in lines)
    assert any("bad-yaml/task.yaml: malformed YAML" in line for line in lines)
    assert not (tmp_path / "suite").exists()  # all or nothing: not even the good one


def test_import_tb_keeps_the_dockerfile_and_with_sandbox_the_task_runs_in_its_image(tmp_path):
    src = write_tb_task(tmp_path / "tb" / "greet")
    (src / "Dockerfile").write_text(
        "FROM debian:bookworm\nRUN apt-get update && apt-get install -y dc\nWORKDIR /app\n"
    )
    home = tmp_path / "home"
    r = stayer("tasks", "import-tb", str(src), str(tmp_path / "host"), "--json", home=home)
    assert r.returncode == 0, r.stderr
    [note] = json.loads(r.stdout)["imported"][0]["notes"]
    assert "runs in its image, built on its first run" in note  # by default (issue 34)
    assert load_task(tmp_path / "host" / "greet").sandbox_kind is None
    r = stayer(
        "tasks",
        "import-tb",
        str(src),
        str(tmp_path / "image"),
        "--sandbox",
        "bwrap-image",
        "--json",
        home=home,
    )
    assert r.returncode == 0, r.stderr
    dest = tmp_path / "image" / "greet"
    assert (dest / "environment" / "Dockerfile").read_text() == (src / "Dockerfile").read_text()
    assert load_task(dest).sandbox_kind == "bwrap-image"  # its first run builds the image
    assert "built on its first run" in json.loads(r.stdout)["imported"][0]["notes"][0]


def test_import_tb_with_sandbox_refuses_what_cannot_be_built_and_writes_nothing(tmp_path):
    home = tmp_path / "home"
    src = write_tb_task(tmp_path / "tb" / "greet")
    (src / "Dockerfile").write_text("FROM debian:bookworm\nCOPY --from=builder /x /app/x\n")
    r = stayer(
        "tasks",
        "import-tb",
        str(src),
        str(tmp_path / "suite"),
        "--sandbox",
        "bwrap-image",
        home=home,
    )
    assert r.returncode == 2 and "greet/Dockerfile:2: COPY --from" in r.stderr, r.stderr
    assert not (tmp_path / "suite").exists()
    (src / "Dockerfile").unlink()
    r = stayer(
        "tasks", "import-tb", str(src), str(tmp_path / "suite"), "--sandbox", "docker", home=home
    )
    assert r.returncode == 2 and "Dockerfile: missing" in r.stderr
    r = stayer(
        "tasks", "import-tb", str(src), str(tmp_path / "suite"), "--sandbox", "bwrap", home=home
    )
    assert r.returncode == 2 and "--sandbox bwrap: not a sandbox that builds" in r.stderr
    assert not (tmp_path / "suite").exists()


def test_import_tb_refuses_to_overwrite(tmp_path):
    src = write_tb_task(tmp_path / "tb" / "greet")
    (tmp_path / "suite" / "greet").mkdir(parents=True)
    r = stayer("tasks", "import-tb", str(src), str(tmp_path / "suite"), home=tmp_path / "home")
    assert r.returncode == 2 and "already exists" in r.stderr
    assert list((tmp_path / "suite" / "greet").iterdir()) == []


# --- the corpus: real Terminal-Bench and Harbor tasks -------------------------------------

corpus = pytest.mark.skipif(not CORPUS_TB.is_dir(), reason=f"corpus not found at {CORPUS_TB}")


@corpus
@needs_bwrap
def test_corpus_terminal_bench_tasks_import_and_get_an_environment_verdict(tmp_path):
    """Their run-tests.sh install curl and uv from the internet: here that is an
    environment problem, neither a pass nor a broken oracle."""
    home = tmp_path / "home"
    r = stayer(
        "tasks",
        "import-tb",
        str(CORPUS_TB / "tb-format"),
        str(tmp_path / "suite"),
        "--json",
        home=home,
    )
    assert r.returncode == 0, r.stderr
    names = sorted(t["name"] for t in json.loads(r.stdout)["imported"])
    assert names == sorted(d.name for d in (CORPUS_TB / "tb-format").iterdir() if d.is_dir())
    r = stayer("tasks", "check", str(tmp_path / "suite"), "--json", home=home)
    assert r.returncode == 1
    for t in json.loads(r.stdout)["tasks"]:
        assert [p["kind"] for p in t["problems"]] == ["environment"], t
        assert "apt" in t["problems"][0]["detail"] or "packages" in t["problems"][0]["detail"]


@corpus
@needs_bwrap
@pytest.mark.parametrize(
    "name",
    [
        "simple-task",
        "multi-reward",
        pytest.param(
            "fix_async_worker_queue", marks=pytest.mark.slow
        ),  # its tests wait 30 s for a server
    ],
)
def test_corpus_harbor_tasks_load_and_get_an_environment_verdict(tmp_path, name):
    r = stayer("tasks", "check", str(CORPUS_TB / "harbor" / name), "--json", home=tmp_path / "home")
    assert r.returncode == 1
    [t] = json.loads(r.stdout)["tasks"]
    assert [p["kind"] for p in t["problems"]] == ["environment"], t
    # In its image (by default since issue 34) its test.sh's apt-get is what fails first,
    # or, where a RUN step cannot fetch its packages here, the image's build.
    detail = t["problems"][0]["detail"]
    reasons = ("needs the network", "installs system packages", "its image cannot be built")
    assert any(r in detail for r in reasons), detail

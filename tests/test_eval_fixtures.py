"""Small task fixtures for the eval and task-check tests, written into tmp dirs.

Each is a Harbor-layout task about one file, ``/app/out.txt``; they differ in exactly the
way that makes them good or broken.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from stayer.eval.task import load_task
from stayer.sandbox.locate import locate_bwrap

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"
CORPUS_TB = ROOT.parent / "shared" / "corpus" / "terminal-bench"

needs_bwrap = pytest.mark.skipif(locate_bwrap() is None, reason="bubblewrap not installed")

GOOD_TEST = """\
if [ "$(cat /app/out.txt 2>/dev/null)" = "done" ]; then echo 1; else echo 0; fi > /logs/verifier/reward.txt
"""
GOOD_SOLVE = "#!/bin/bash\n# writes the expected answer\nprintf 'done\\n' > /app/out.txt\n"


def write_task(
    suite: Path,
    name: str,
    *,
    solve: str | None = GOOD_SOLVE,
    test: str | None = GOOD_TEST,
    toml: str = "[agent]\ntimeout_sec = 60.0\n\n[verifier]\ntimeout_sec = 30.0\n",
    env: dict[str, str] | None = None,
) -> Path:
    root = suite / name
    (root / "environment").mkdir(parents=True)
    (root / "instruction.md").write_text("Write the word done to /app/out.txt.\n")
    (root / "task.toml").write_text(toml)
    (root / "environment" / "README.md").write_text("A workspace.\n")
    for rel, text in (env or {}).items():
        (root / "environment" / rel).write_text(text)
    if test is not None:
        (root / "tests").mkdir()
        (root / "tests" / "test.sh").write_text("#!/bin/bash\n" + test)
    if solve is not None:
        (root / "solution").mkdir()
        (root / "solution" / "solve.sh").write_text(solve)
    return root


# One fixture per verdict of `stayer tasks check`.
FIXTURES = {
    "good": {},
    "nop-passes": {"test": "echo 1 > /logs/verifier/reward.txt\n"},
    "oracle-fails": {"solve": "#!/bin/bash\nprintf 'almost\\n' > /app/out.txt\n"},
    # Half of the verifications of a solved workspace pass; an unsolved one never does.
    "flaky": {"test": GOOD_TEST.replace('= "done" ]', '= "done" ] && [ $((RANDOM % 2)) = 0 ]')},
    "invalid": {"test": None},
    "timeout-margin": {
        "solve": "#!/bin/bash\nsleep 0.7\nprintf 'done\\n' > /app/out.txt\n",
        "toml": "[agent]\ntimeout_sec = 1.0\n",
    },
    "leak": {"env": {"notes.sh": GOOD_SOLVE}},
    "environment": {
        "test": "python3 -c \"import socket; socket.getaddrinfo('example.invalid', 80)\"\n"
        "stayer-fixture-missing-tool --install || { echo 0 > /logs/verifier/reward.txt; exit 1; }\n"
        + GOOD_TEST,
    },
}


def write_fixture_suite(suite: Path, names: list[str] | None = None) -> Path:
    for name in names or list(FIXTURES):
        write_task(suite, name, **FIXTURES[name])
    return suite


def stayer(*args: str, home: Path, timeout: float = 300) -> subprocess.CompletedProcess:
    """The real command line, with state in ``home``."""
    env = {k: v for k, v in os.environ.items() if not k.endswith("_API_KEY")}
    env["STAYER_HOME"] = str(home)
    return subprocess.run(
        [sys.executable, "-m", "stayer.cli", *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=home.parent,
        timeout=timeout,
    )


@pytest.mark.parametrize("name", [n for n in FIXTURES if n != "invalid"])
def test_fixtures_are_loadable_tasks(tmp_path, name):
    task = load_task(write_task(tmp_path, name, **FIXTURES[name]))
    assert task.name == name and task.solution


def test_invalid_fixture_does_not_load(tmp_path):
    from stayer.errors import ConfigError

    with pytest.raises(ConfigError, match=r"tests/test\.sh: missing"):
        load_task(write_task(tmp_path, "invalid", **FIXTURES["invalid"]))

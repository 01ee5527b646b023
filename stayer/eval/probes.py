"""Reward-hack probes: scripted cheat agents that try to make a task's verifier pay
without doing the task.

Details and rationale: docs/notes.md, ``stayer/eval/probes.py``.
"""

from __future__ import annotations

import ast
import re
import shlex
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from stayer.eval.task import IMAGE_FILES, Task

# The verifier's reward files, as stayer.eval.verify reads them.
REWARD_FILES = ("/logs/verifier/reward.txt", "/logs/verifier/reward.json")
MAX_COPIED_INPUTS = 3  # one probe each: the inputs the tests or the instruction name first
_MAX_TEXT = 256 * 1024  # a test file larger than this is data, not read for names
_MAX_INPUT = 1024 * 1024  # inputs larger than this are not copied

_APP_PATH = re.compile(r"/app/[\w.+-]+(?:/[\w.+-]+)*")
# A file name in quotes ('report.json', "out.txt"): relative to /app, where tests run.
_QUOTED_NAME = re.compile(r"""["']([\w+-][\w.+-]*\.[A-Za-z]\w{0,4})["']""")
_REWARD_PATH = re.compile(r"[\w./-]*reward[\w.-]*\.(?:txt|json)")
_PYTEST = re.compile(r"\bpytest\b")
# Imports anywhere in a test's text: also inside strings (python -c "import x", a child's code).
_IMPORT_TEXT = re.compile(r"^\s*(?:import|from)\s+([A-Za-z_]\w*)", re.MULTILINE)

# Run by the verifier's Python on import: the reward channel first, then a clean exit
# before any check can fail. (A process left behind to rewrite the reward later is the
# lingering-writer probe's, so that each probe tells one hole.)
EXIT_HOOK = """\
import os


def _pay():  # whole files, renamed into place: a reward is never seen half-written
    for name in ("reward.txt", "reward.json"):
        try:
            with open("/logs/verifier/.paying", "w") as f:
                f.write("1\\n")
            os.replace("/logs/verifier/.paying", "/logs/verifier/" + name)
        except OSError:
            pass


_pay()
os._exit(0)
"""

# Run by the verifier's Python (imported, or as a conftest.py): leaves a detached process
# that rewrites the reward files (``_REWARDS`` is set in front of it) with a passing reward
# until it is killed, and once more when it is asked to stop. The importer waits until the
# process is running (or gone), then carries on: the planted module defines nothing else,
# so the verifier's own check fails, and only the lingering process can make it pay.
LINGER_HOOK = """\
import os  # loaded before any workspace path is searched, as _signal and time are built in:
import time  # never the workspace's own shadows of them (the other probes plant those)

import _signal as signal


def _pay():  # whole files, renamed into place: a reward is never seen half-written
    for path, text in _REWARDS.items():
        part = "%s.%d" % (path, os.getpid())
        try:
            with open(part, "w") as f:
                f.write(text)
            os.replace(part, path)
        except OSError:
            pass


def _stop(signum, frame):
    _pay()
    os._exit(0)


def _linger():
    if not os.path.isdir("/logs/verifier"):
        return  # not run by the verifier
    ready, told = os.pipe()
    middle = os.fork()
    if middle:
        os.close(told)
        os.waitpid(middle, 0)
        os.read(ready, 1)  # until the lingering process writes (or is gone)
        os.close(ready)
        return
    try:
        os.setsid()
        if os.fork():
            os._exit(0)
        null = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(null, fd)
        most = os.sysconf("SC_OPEN_MAX")
        os.closerange(3, told)  # nothing of the verifier's (its pipes) stays open
        os.closerange(told + 1, most if most > 0 else 65536)
        os.chdir("/")
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(sig, _stop)
        _pay()
        os.write(told, b"x")
        os.close(told)
        deadline = time.monotonic() + 3600
        while time.monotonic() < deadline:
            _pay()
            time.sleep(0.001)
    finally:
        os._exit(0)


_linger()
"""

# Loaded by pytest from the test run's root directory: every report passes.
CONFTEST = """\
import pytest


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    report.outcome = "passed"
    report.longrepr = None


def pytest_collectreport(report):
    report.outcome = "passed"
    report.longrepr = None


def pytest_sessionfinish(session, exitstatus):
    session.exitstatus = 0
"""

PYTEST_INI = "[pytest]\naddopts = --collect-only -q\n"
EXIT_ZERO = "#!/bin/sh\nexit 0\n"


def linger_hook(rewards: list[str]) -> str:
    """:data:`LINGER_HOOK` for the reward files ``rewards``."""
    return f"_REWARDS = {dict((p, _passing(p)) for p in rewards)!r}\n\n" + LINGER_HOOK


def _passing(path: str) -> str:
    return '{"reward": 1}\n' if path.endswith(".json") else "1\n"


def linger_program(rewards: list[str]) -> str:
    """A workspace program that leaves the lingering process behind, then fails."""
    return f"#!/bin/sh\npython3 -c {shlex.quote(linger_hook(rewards))} 2>/dev/null\nexit 1\n"


@dataclass(frozen=True)
class Probe:
    name: str
    what: str  # one line, for the report
    script: str  # run by bash in the agent's sandbox, from /app


@dataclass(frozen=True)
class TaskFacts:
    """What the tests reveal about what they read, run and import."""

    texts: dict[str, str]  # test file (relative to tests/) → its text
    mentioned: frozenset[str]  # /app/… paths the tests name
    modules: frozenset[str]  # top-level Python modules the tests import
    reward_paths: frozenset[str]  # reward-like files the tests name
    uses_pytest: bool

    @property
    def mentioned_files(self) -> list[str]:
        """The mentioned paths less those that are directories of other mentioned paths."""
        dirs = {str(parent) for p in self.mentioned for parent in Path(p).parents}
        return sorted(p for p in self.mentioned if p not in dirs)


def read_facts(task: Task) -> TaskFacts:
    texts: dict[str, str] = {}
    for p in sorted(task.tests_dir.rglob("*")):
        if p.is_file() and not p.is_symlink() and p.stat().st_size <= _MAX_TEXT:
            texts[str(p.relative_to(task.tests_dir))] = p.read_text(errors="replace")
    # A quoted bare name is the environment's file(s) of that name anywhere below /app, else
    # a file the tests expect in /app (unless it is a test's own name).
    test_names = {Path(name).name for name in texts}
    env_by_name: dict[str, list[str]] = {}
    for f in environment_files(task):
        env_by_name.setdefault(Path(f).name, []).append(f)
    mentioned: set[str] = set()
    modules: set[str] = set()
    rewards: set[str] = set()
    for name, text in texts.items():
        mentioned.update(p.rstrip(".") for p in _APP_PATH.findall(text))
        for n in _QUOTED_NAME.findall(text):
            if n not in test_names:
                mentioned.update(env_by_name.get(n, [f"/app/{n}"]))
        rewards.update(p for p in _REWARD_PATH.findall(text) if "/" in p or p.startswith("reward"))
        modules.update(_IMPORT_TEXT.findall(text))
        if name.endswith(".py"):
            modules.update(_imported_modules(text))
    return TaskFacts(
        texts=texts,
        mentioned=frozenset(mentioned),
        modules=frozenset(modules),
        reward_paths=frozenset(rewards),
        uses_pytest=any(_PYTEST.search(t) for t in texts.values()),
    )


def _imported_modules(source: str) -> set[str]:
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return set()
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add(node.module.split(".")[0])
    return found


def environment_files(task: Task) -> dict[str, Path]:
    """Workspace path (/app/…) → the environment file it is copied from."""
    env = task.path / "environment"
    if not env.is_dir():
        return {}
    return {
        f"/app/{p.relative_to(env)}": p
        for p in sorted(env.rglob("*"))
        if p.is_file()
        and not p.is_symlink()
        and p.name not in IMAGE_FILES  # as materialise skips them
    }


def _write(path: str, content: str, *, executable: bool = False) -> str:
    q = shlex.quote(path)
    line = f'mkdir -p -- "$(dirname -- {q})" 2>/dev/null; rm -rf -- {q} 2>/dev/null; printf %s {shlex.quote(content)} > {q}'
    return line + (f" && chmod +x -- {q}" if executable else "")


def _script(lines: list[str]) -> str:
    return "\n".join(["cd /app || exit 0", *lines, "true"]) + "\n"


def plan_probes(task: Task, facts: TaskFacts | None = None) -> list[Probe]:
    """The probes worth running on ``task``, in order; each derived from its files."""
    facts = facts or read_facts(task)
    return list(_probes(task, facts))


def _probes(task: Task, facts: TaskFacts) -> Iterator[Probe]:
    env = environment_files(task)
    dirs = {str(Path(p).parent) for p in env} | {"/app"}
    outputs = [p for p in facts.mentioned_files if p not in env and p not in dirs]

    rewards = sorted(
        set(REWARD_FILES) | {p if p.startswith("/") else f"/app/{p}" for p in facts.reward_paths}
    )
    yield Probe(
        "reward-file",
        f"writes a reward of 1 to {', '.join(rewards)}",
        _script([_write(p, _passing(p)) for p in rewards]),
    )
    conftests = sorted({f"{d}/conftest.py" for d in dirs} | {"/app/tests/conftest.py"})
    if facts.uses_pytest:
        yield Probe(
            "pytest-conftest",
            "adds conftest.py plugins that turn every test report into a pass",
            _script([_write(p, CONFTEST) for p in conftests]),
        )
        yield Probe(
            "pytest-ini",
            "adds a pytest.ini whose options only collect the tests",
            _script([_write("/app/pytest.ini", PYTEST_INI)]),
        )
    own = {Path(p).stem for p in env if Path(p).suffix == ".py" and Path(p).parent == Path("/app")}
    modules = sorted(facts.modules | own | {"sitecustomize", "usercustomize"})
    shadows = []
    for m in modules:
        package_init = f"/app/{m}/__init__.py"
        shadows.append(package_init if package_init in env else f"/app/{m}.py")
    yield Probe(
        "shadow-modules",
        f"replaces the workspace's modules and those the tests import ({', '.join(m for m in modules if m in facts.modules | own)}) "
        "and sitecustomize in the workspace with one that writes a reward of 1 and exits 0",
        _script([_write(p, EXIT_HOOK) for p in shadows]),
    )
    programs = sorted(
        p
        for p in facts.mentioned
        if (p in env and _looks_executable(env[p]))
        or (p not in env and p not in dirs and "." not in Path(p).name)
    )
    if programs:
        yield Probe(
            "workspace-executables",
            f"replaces the workspace programs the tests run ({', '.join(programs)}) with ones that exit 0",
            _script([_write(p, EXIT_ZERO, executable=True) for p in programs]),
        )
    # Wherever the probes above plant code the verifier runs: code that outlives it.
    python = shadows + (conftests if facts.uses_pytest else [])
    yield Probe(
        "lingering-writer",
        f"replaces the same modules{', programs' if programs else ''}{' and conftest.py' if facts.uses_pytest else ''} "
        f"with code that leaves a detached process rewriting {', '.join(rewards)} with a passing reward until it is killed",
        _script(
            [_write(p, linger_hook(rewards)) for p in python]
            + [_write(p, linger_program(rewards), executable=True) for p in programs]
        ),
    )
    if not outputs:
        return
    yield Probe(
        "empty-outputs",
        f"writes {', '.join(outputs)} empty",
        _script([_write(p, "") for p in outputs]),
    )
    yield Probe(
        "constant-outputs",
        f"writes a constant to {', '.join(outputs)}",
        _script([_write(p, "{}\n" if p.endswith(".json") else "1\n") for p in outputs]),
    )
    for source in _inputs_by_relevance(task, facts, env)[:MAX_COPIED_INPUTS]:
        yield Probe(
            "copied-inputs",
            f"copies the input {source} to {', '.join(outputs)}",
            _script([f"cp -- {shlex.quote(source)} {shlex.quote(p)} 2>/dev/null" for p in outputs]),
        )
    for expected in _test_data(facts)[:MAX_COPIED_INPUTS]:
        # A link the agent cannot follow (its sandbox has no /tests) and the verifier does.
        yield Probe(
            "linked-expectations",
            f"links {', '.join(outputs)} to the tests' own /tests/{expected}",
            _script(
                [
                    f"rm -rf -- {shlex.quote(p)}; ln -s -- {shlex.quote('/tests/' + expected)} {shlex.quote(p)}"
                    for p in outputs
                ]
            ),
        )
    references = sorted(p for p in facts.mentioned if p in env)
    if references:
        yield Probe(
            "emptied-references",
            f"writes {', '.join(outputs)} empty and truncates the files the tests read ({', '.join(references)})",
            _script([_write(p, "") for p in outputs + references]),
        )


def _test_data(facts: TaskFacts) -> list[str]:
    """The tests' files that are data (expected outputs, fixtures), not code."""
    code = {".py", ".sh", ".bash", ""}
    return sorted(name for name in facts.texts if Path(name).suffix not in code)


def _looks_executable(p: Path) -> bool:
    if p.stat().st_mode & 0o111 or p.suffix == ".sh":
        return True
    with p.open("rb") as f:
        return f.read(2) == b"#!"


def _inputs_by_relevance(task: Task, facts: TaskFacts, env: dict[str, Path]) -> list[str]:
    """Environment files small enough to copy: those the tests name, then those the
    instruction names, then the rest (in path order)."""
    small = [p for p, f in env.items() if f.stat().st_size <= _MAX_INPUT]

    def rank(p: str) -> int:
        if p in facts.mentioned:
            return 0
        return 1 if p in task.instruction or p.removeprefix("/app/") in task.instruction else 2

    return sorted(small, key=rank)

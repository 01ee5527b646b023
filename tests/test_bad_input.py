"""Bad input, generated: every command and every file a user hands stayer.

Each case must end with no traceback, exit code 2 (audit logs: 0, their bad lines counted),
one line on stderr that names the flag or the file and key, and nothing written: the case's
directory (STAYER_HOME, --out, the inputs) is byte for byte as before. Most cases run the
CLI in-process (Typer's runner) for speed; the ones that need a real process (an alias bomb
that used to hang, a full disk, a read-only directory, a database that goes away, an
environment that is not UTF-8) run it as one, under a timeout that only catches hangs.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from stayer import settings as bounds
from stayer.cli import app

ROOT = Path(__file__).resolve().parent.parent
TASK = ROOT / "examples" / "hello-file"
CASES = settings(
    max_examples=40,
    derandomize=True,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)


# --- running one case -------------------------------------------------------------------------


def snapshot(root: Path) -> dict[str, tuple[int, str]]:
    """Every path under ``root`` with its mode and content digest."""
    out = {}
    for p in sorted(root.rglob("*")):
        st_ = p.lstat()
        digest = (
            hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() and not p.is_symlink() else ""
        )
        out[os.fsdecode(p.relative_to(root))] = (st_.st_mode, digest)
    return out


@contextmanager
def case_dir(tmp_path: Path) -> Iterator[Path]:
    d = Path(tempfile.mkdtemp(dir=tmp_path))
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


def invoke(args: list[str], where: Path, code: int = 2) -> str:
    """Run ``stayer ARGS`` in-process with STAYER_HOME under ``where``; assert the contract
    for bad input; return the one error line (for another expected ``code``, stdout)."""
    before = snapshot(where)
    result = CliRunner().invoke(
        app, args, env={"STAYER_HOME": str(where / "home"), "COLUMNS": "200"}
    )
    exc = result.exception
    assert exc is None or isinstance(exc, SystemExit), f"{args}: {exc!r}"  # no traceback
    assert "Traceback" not in result.stderr, result.stderr
    assert result.exit_code == code, (args, result.exit_code, result.stdout, result.stderr)
    assert snapshot(where) == before, f"{args}: wrote something"
    if code != 2:
        return result.stdout
    assert result.stdout == "", (args, result.stdout)  # no half-written JSON
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), (args, result.stderr)
    return lines[0]


def stayer(
    *args: str,
    home: Path,
    env: dict[str, str] | None = None,
    timeout: float = 300,
    prefix: tuple[str, ...] = (),
) -> subprocess.CompletedProcess[str]:
    full = {
        **os.environ,
        "STAYER_HOME": str(home),
        "PYTHONPATH": str(ROOT),
        "COLUMNS": "200",
        **(env or {}),
    }
    return subprocess.run(
        [*prefix, sys.executable, "-m", "stayer.cli", *args],
        capture_output=True,
        text=True,
        env=full,
        timeout=timeout,
        cwd=home.parent,
    )


def one_error_line(p: subprocess.CompletedProcess[str]) -> str:
    assert "Traceback" not in p.stderr, p.stderr
    errors = [line for line in p.stderr.splitlines() if line.startswith("error")]
    assert p.returncode == 2 and len(errors) == 1, (p.returncode, p.stderr)
    return errors[0]


# --- numbers and names on the command line -----------------------------------------------------


def bad_ints(lo: int, hi: int) -> st.SearchStrategy[str]:
    return st.one_of(
        st.integers(max_value=lo - 1).map(str),
        st.integers(min_value=hi + 1, max_value=10**30).map(str),
        st.floats(min_value=-1e6, max_value=1e6).filter(lambda x: x != int(x)).map(repr),
        st.sampled_from(["nan", "inf", "-inf", "ten", "", "1e", "1e3", "0x10", "true", "½"]),
    )


def bad_floats(hi: float, zero_ok: bool = False) -> st.SearchStrategy[str]:
    too_small = st.floats(max_value=0, allow_nan=False).filter(lambda x: x < 0 if zero_ok else True)
    return st.one_of(
        too_small.map(repr),
        st.floats(min_value=hi, exclude_min=True, allow_infinity=False).map(repr),
        st.sampled_from(["nan", "inf", "-inf", "NaN", "Infinity", "ten", "", "1e", "1,5"]),
    )


def bad_price() -> st.SearchStrategy[str]:
    """Prices per MTok: zero is a price, negative and huge are not."""
    return st.one_of(
        st.decimals(
            max_value=Decimal("-0.001"), allow_nan=False, allow_infinity=False, places=3
        ).map(str),
        st.integers(min_value=1_000_001, max_value=10**40).map(str),
        st.sampled_from(
            ["NaN", "sNaN", "Infinity", "-Infinity", "1e-20", "ten", "", "$5", "1e999999999"]
        ),
    )


def bad_money(hi: int) -> st.SearchStrategy[str]:
    return st.one_of(
        st.decimals(max_value=0, allow_nan=False, allow_infinity=False, places=3).map(str),
        st.integers(min_value=hi + 1, max_value=10**40).map(str),
        st.sampled_from(
            [
                "NaN",
                "sNaN",
                "Infinity",
                "-Infinity",
                "1e17",
                "1e-20",
                "ten",
                "",
                "$5",
                "1e999999999",
            ]
        ),
    )


S = bounds.MAX_SECONDS
RUN = ["run", str(TASK), "--model", "sim:gpt-5", "--sandbox", "local", "--json"]
EVAL = ["eval", str(TASK), "--model", "sim:gpt-5", "--sandbox", "local", "--json"]
ESTIMATE = [
    "estimate",
    "--steps",
    "3",
    "--new-tokens",
    "10",
    "--output-tokens",
    "1",
    "--price-miss",
    "1",
    "--price-hit",
    "1",
    "--price-out",
    "1",
    "--json",
]
FLAGS: list[tuple[list[str], str, st.SearchStrategy[str]]] = [
    (RUN, "--max-steps", bad_ints(1, bounds.MAX_STEPS)),
    (RUN, "--max-cost", bad_money(1_000_000)),
    (RUN, "--sim-latency", bad_floats(bounds.MAX_SIM_LATENCY_S, zero_ok=True)),
    (RUN, "--command-timeout", bad_floats(S)),
    (RUN, "--memory-mb", bad_ints(bounds.MIN_MEMORY_MB, bounds.MAX_MEMORY_MB)),
    (RUN, "--storage-mb", bad_ints(1, bounds.MAX_STORAGE_MB)),
    (RUN, "--max-processes", bad_ints(1, bounds.MAX_PROCESSES)),
    (RUN, "--max-context", bad_ints(1, bounds.MAX_TOKENS)),
    (
        RUN,
        "--run-id",
        st.sampled_from(["../x", ".hidden", "a/b", "x" * 129, "x" * 300, "é", "a b", "[/x]"]),
    ),
    (
        RUN,
        "--policy",
        st.sampled_from(
            ["mask:-1", "mask:-1:", "mask:x", "summarize:1e99", "bogus", "[/x]", ":+1:"]
        ),
    ),
    (
        RUN,
        "--sim-policy",
        st.sampled_from(["synthetic:steps=0", "synthetic:obs_tokens=10000000000", "x:y"]),
    ),
    (ESTIMATE, "--steps", bad_ints(1, bounds.MAX_STEPS)),
    (ESTIMATE, "--new-tokens", bad_ints(0, bounds.MAX_TOKENS)),
    (ESTIMATE, "--output-tokens", bad_ints(0, bounds.MAX_TOKENS)),
    (ESTIMATE, "--price-miss", bad_price()),
    (ESTIMATE, "--price-write", bad_price()),
    (EVAL, "--epochs", bad_ints(1, bounds.MAX_EPOCHS)),
    (EVAL, "--concurrency", bad_ints(1, bounds.MAX_CONCURRENCY)),
    (EVAL, "--max-steps", bad_ints(1, bounds.MAX_STEPS)),
    (EVAL, "--max-cost", bad_money(1_000_000)),
    (EVAL, "--sim-latency", bad_floats(bounds.MAX_SIM_LATENCY_S, zero_ok=True)),
    (["tasks", "check", str(TASK)], "--reruns", bad_ints(0, 100)),
    (["tasks", "check", str(TASK)], "--concurrency", bad_ints(1, bounds.MAX_CONCURRENCY)),
    (["runs"], "--limit", bad_ints(1, 1_000_000)),
    (["audit", str(TASK)], "--jobs", bad_ints(1, bounds.MAX_CONCURRENCY)),
    (["audit", str(TASK)], "--since", st.sampled_from(["yesterday", "2025-13-01", "", "[/x]"])),
    (
        ["audit", str(TASK)],
        "--what-if",
        st.sampled_from(["model=gpt-5,max_context=nan", "policy=mask:-1", "x", "model=llama"]),
    ),
    (["whatif", str(TASK), "--model", "gpt-5"], "--max-context", bad_ints(1, bounds.MAX_TOKENS)),
    (["sandbox", "exec", "--sandbox", "local"], "--timeout", bad_floats(S)),
    (
        ["sandbox", "exec", "--sandbox", "local"],
        "--memory",
        bad_ints(bounds.MIN_MEMORY_MB, bounds.MAX_MEMORY_MB),
    ),
    (
        ["sandbox", "exec", "--sandbox", "local"],
        "--max-file-mb",
        bad_ints(1, bounds.MAX_STORAGE_MB),
    ),
    (["sandbox", "exec", "--sandbox", "local"], "--storage-mb", bad_ints(1, bounds.MAX_STORAGE_MB)),
    # The runtime's processes: a worker with -5 slots never claimed a run (issue 34, S12).
    (["worker", "--tasks-dir", str(ROOT / "examples")], "--concurrency", bad_ints(1, 1000)),
    (["worker", "--tasks-dir", str(ROOT / "examples")], "--metrics-port", bad_ints(1, 65535)),
    (["worker", "--tasks-dir", str(ROOT / "examples")], "--lease-ttl", bad_floats(3600.0)),
    (["serve", "--tasks-dir", str(ROOT / "examples")], "--workers", bad_ints(0, 1000)),
    (["serve", "--tasks-dir", str(ROOT / "examples")], "--port", bad_ints(1, 65535)),
    (["serve", "--tasks-dir", str(ROOT / "examples")], "--default-max-cost", bad_money(100_000)),
]


@st.composite
def flag_case(draw: st.DrawFn) -> tuple[list[str], str]:
    base, flag, values = draw(st.sampled_from(FLAGS))
    value = draw(values)
    args = [*base, f"{flag}={value}"]
    if base[0] == "sandbox":
        args.append("true")  # the command comes last
    return args, flag


@settings(CASES, max_examples=160)
@given(case=flag_case())
def test_bad_flag_is_one_line_exit_2_naming_it(tmp_path: Path, case: tuple[list[str], str]) -> None:
    args, flag = case
    with case_dir(tmp_path) as where:
        line = invoke(args, where)
        assert flag in line or flag.lstrip("-") in line, line


# --- user text is text, never markup ------------------------------------------------------------

MARKUP = st.text(alphabet="[]/:-+1ab=#@!\\", min_size=1, max_size=12).map(lambda t: "x" + t)


@settings(CASES, max_examples=30)
@given(text=MARKUP, command=st.sampled_from(["report", "whatif", "run", "policy"]))
def test_user_text_is_printed_as_given(tmp_path: Path, text: str, command: str) -> None:
    with case_dir(tmp_path) as where:
        if command == "report":
            line = invoke(["report", text], where)
        elif command == "whatif":
            text = str(where / text)
            line = invoke(["whatif", text, "--model", "gpt-5"], where)
        elif command == "run":
            text = str(where / text)
            line = invoke(["run", text, "--model", "sim:gpt-5", "--sandbox", "local"], where)
        else:
            line = invoke([*RUN, "--policy", f"mask:{text}"], where)
        assert text in line, (text, line)


# --- task.toml -----------------------------------------------------------------------------------


def toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float):
        return {"nan": "nan", "inf": "inf", "-inf": "-inf"}.get(repr(v), repr(v))
    if isinstance(v, str):
        return json.dumps(v, ensure_ascii=False).replace("\x7f", "\\u007f")
    if isinstance(v, list):
        return "[" + ", ".join(toml_value(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{ " + ", ".join(f"{k} = {toml_value(x)}" for k, x in v.items()) + " }"
    return str(v)


def not_a_number() -> st.SearchStrategy[Any]:
    return st.one_of(st.booleans(), st.text(max_size=5), st.just([1]), st.just({"a": 1}))


def bad_seconds() -> st.SearchStrategy[Any]:
    return st.one_of(
        st.floats(max_value=0),
        st.just(float("nan")),
        st.just(float("inf")),
        st.floats(min_value=bounds.MAX_SECONDS, exclude_min=True),
        st.integers(min_value=-(2**63), max_value=0),
        st.integers(min_value=int(bounds.MAX_SECONDS) + 1, max_value=2**63 - 1),
        not_a_number(),
    )


def bad_mb(lo: int, hi: int) -> st.SearchStrategy[Any]:
    return st.one_of(
        st.integers(min_value=-(2**63), max_value=lo - 1),
        st.integers(min_value=hi + 1, max_value=2**63 - 1),
        st.floats(min_value=0, max_value=4096).filter(lambda x: x != int(x)),  # 0.5 MB caps
        st.just(float("nan")),
        st.just(float("inf")),
        not_a_number(),
    )


TASK_FIELDS = [
    ("agent", "timeout_sec", bad_seconds()),
    ("verifier", "timeout_sec", bad_seconds()),
    ("environment", "memory_mb", bad_mb(bounds.MIN_MEMORY_MB, bounds.MAX_MEMORY_MB)),
    ("environment", "storage_mb", bad_mb(1, bounds.MAX_STORAGE_MB)),
    (
        "environment",
        "allow_internet",
        st.one_of(st.integers(-(2**63), 2**63 - 1), st.text(max_size=4), st.floats()),
    ),
]


@st.composite
def task_toml(draw: st.DrawFn) -> tuple[bytes, str]:
    """A task.toml with one bad value (and the key it must name), or broken as a file."""
    kind = draw(st.sampled_from(["field", "field", "field", "section", "bytes", "syntax"]))
    if kind == "field":
        section, key, values = draw(st.sampled_from(TASK_FIELDS))
        return f"[{section}]\n{key} = {toml_value(draw(values))}\n".encode(), f"{section}.{key}"
    if kind == "section":
        section = draw(st.sampled_from(["agent", "verifier", "environment", "metadata"]))
        value = draw(st.one_of(st.booleans(), st.integers(0, 9), st.text(max_size=5), st.just([1])))
        return f"{section} = {toml_value(value)}\n".encode(), f"[{section}]"
    if kind == "bytes":
        return b"[agent]\ntimeout_sec = 5\n# " + draw(
            st.sampled_from([b"\xff", b"\xc3\x28", b"\xed\xa0\x80"])
        ) + b"\n", "UTF-8"
    return draw(
        st.sampled_from([b"[agent\n", b"a = = 1\n", b"[agent]\ntimeout_sec = \n", b"x = [1,\n"])
    ), "TOML"


def copy_task(where: Path, name: str = "task") -> Path:
    task = where / name
    shutil.copytree(TASK, task)
    return task


@settings(CASES, max_examples=60)
@given(doc=task_toml(), command=st.sampled_from(["run", "eval", "tasks check"]))
def test_bad_task_toml_names_the_file_and_key(
    tmp_path: Path, doc: tuple[bytes, str], command: str
) -> None:
    content, needle = doc
    with case_dir(tmp_path) as where:
        task = copy_task(where)
        (task / "task.toml").write_bytes(content)
        if command == "tasks check":
            # Checking a suite is what finds a broken task: a failed check (exit 1) naming it.
            if shutil.which("bwrap") is None:
                pytest.skip("tasks check needs bubblewrap")
            doc = json.loads(invoke(["tasks", "check", str(task), "--json"], where, code=1))
            (problem,) = doc["tasks"][0]["problems"]
            assert (
                problem["kind"] == "invalid"
                and "task.toml" in problem["detail"]
                and needle in problem["detail"]
            )
            return
        args = {
            "run": ["run", str(task), "--model", "sim:gpt-5", "--sandbox", "local"],
            "eval": [
                "eval",
                str(task),
                "--model",
                "sim:gpt-5",
                "--sandbox",
                "local",
                "--out",
                str(where / "out"),
            ],
        }[command]
        line = invoke(args, where)
        assert "task.toml" in line and needle in line, line


# --- stayer.toml (--config) ----------------------------------------------------------------------

CONFIG_FIELDS = [
    ("guard", "max_wall_s", bad_seconds()),
    (
        "guard",
        "max_tokens",
        st.one_of(
            st.integers(min_value=-(2**63), max_value=0),
            st.integers(min_value=bounds.MAX_TOKENS + 1, max_value=2**63 - 1),
            st.just(float("inf")),
            not_a_number(),
        ),
    ),
    (
        "guard",
        "soft_fraction",
        st.one_of(
            st.floats(max_value=0),
            st.floats(min_value=1, exclude_min=True),
            st.just(float("nan")),
            not_a_number(),
        ),
    ),
    (
        "guard",
        "anomaly_factor",
        st.one_of(
            st.floats(max_value=0, exclude_max=True),
            st.just(float("nan")),
            st.just(float("inf")),
            not_a_number(),
        ),
    ),
    ("tiers", "latency_target_s", bad_seconds()),
    (
        "models",
        "planning_steps",
        st.one_of(
            st.integers(min_value=-(2**63), max_value=-1),
            st.integers(min_value=bounds.MAX_STEPS + 1, max_value=2**63 - 1),
            st.just(1.5),
            not_a_number(),
        ),
    ),
    (
        "subagents",
        "budget_fraction",
        st.one_of(
            st.floats(max_value=0), st.floats(min_value=1, exclude_min=True), st.just(float("nan"))
        ),
    ),
    (
        "subagents",
        "max_steps",
        st.one_of(
            st.integers(min_value=-(2**63), max_value=0),
            st.integers(min_value=bounds.MAX_STEPS + 1, max_value=2**63 - 1),
        ),
    ),
]


@st.composite
def stayer_toml(draw: st.DrawFn) -> tuple[bytes, str]:
    kind = draw(st.sampled_from(["field", "field", "field", "unknown", "bytes", "syntax"]))
    if kind == "field":
        section, key, values = draw(st.sampled_from(CONFIG_FIELDS))
        return f"[{section}]\n{key} = {toml_value(draw(values))}\n".encode(), f"{section}.{key}"
    if kind == "unknown":
        key = draw(st.sampled_from(["max_wal_s", "[/x]", "budget"]))
        return f'[guard]\n"{key}" = 1\n'.encode(), key
    if kind == "bytes":
        return b"[guard]\nmax_wall_s = 5 # \xff\xfe\n", "UTF-8"
    return draw(st.sampled_from([b"[guard\n", b"[guard]\nmax_wall_s = \n", b"= 1\n"])), "TOML"


@settings(CASES, max_examples=40)
@given(doc=stayer_toml())
def test_bad_stayer_toml_names_the_file_and_key(tmp_path: Path, doc: tuple[bytes, str]) -> None:
    content, needle = doc
    with case_dir(tmp_path) as where:
        config = where / "stayer.toml"
        config.write_bytes(content)
        line = invoke([*RUN, "--config", str(config)], where)
        assert "stayer.toml" in line and needle in line, line


# --- Terminal-Bench task.yaml (tasks import-tb) -----------------------------------------------


@st.composite
def tb_yaml(draw: st.DrawFn) -> tuple[bytes, str]:
    kind = draw(
        st.sampled_from(
            ["timeout", "timeout", "instruction", "alias", "shape", "bytes", "syntax", "deep"]
        )
    )
    if kind == "timeout":
        key = draw(st.sampled_from(["max_agent_timeout_sec", "max_test_timeout_sec"]))
        value = draw(
            st.sampled_from(
                [".nan", ".inf", "-.inf", "0", "-5", "1e300", "true", "'ten'", "[1]", "604801"]
            )
        )
        return f"instruction: do it\n{key}: {value}\n".encode(), key
    if kind == "instruction":
        return draw(
            st.sampled_from([b"instruction: ''\n", b"instruction: [1, 2]\n", b"author_name: x\n"])
        ), "instruction"
    if kind == "alias":
        depth = draw(st.integers(min_value=1, max_value=9))
        lines = ['a0: &a0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
        lines += [
            f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 9) + "]" for i in range(1, depth + 1)
        ]
        return ("instruction: x\n" + "\n".join(lines) + f"\ntags: *a{depth}\n").encode(), "alias"
    if kind == "shape":
        return draw(
            st.sampled_from([b"- a\n- b\n", b"just text\n", b"42\n", b"null\n"])
        ), "task.yaml"
    if kind == "bytes":
        return b"instruction: caf\xe9\n", "UTF-8"
    if kind == "deep":
        return b"instruction: " + b"[" * 1200 + b"\n", "task.yaml"
    return draw(
        st.sampled_from([b"instruction: [\n", b"a: b: c\n", b"\t- x\n", b"instruction: 'x\n"])
    ), "task.yaml"


@settings(CASES, max_examples=40)
@given(doc=tb_yaml(), solution=st.sampled_from([None, b"echo ok\n", b"echo \xff\n"]))
def test_bad_terminal_bench_task_imports_nothing(
    tmp_path: Path, doc: tuple[bytes, str], solution: bytes | None
) -> None:
    content, needle = doc
    with case_dir(tmp_path) as where:
        src = where / "tb" / "t1"
        src.mkdir(parents=True)
        (src / "task.yaml").write_bytes(content)
        if solution is not None:
            (src / "solution.sh").write_bytes(solution)
        line = invoke(["tasks", "import-tb", str(where / "tb"), str(where / "suite")], where)
        assert "task.yaml" in line or "solution.sh" in line, line
        assert needle in line or "solution.sh" in line, line


# --- recorded trajectories (whatif, --sim-policy replay:) -----------------------------------------

JSONISH = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(), st.text(max_size=4)),
    lambda inner: st.one_of(
        st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=3), inner, max_size=3)
    ),
    max_leaves=6,
)


@st.composite
def trajectory_line(draw: st.DrawFn) -> bytes:
    """One line of a stayer trajectory.jsonl that is not a record stayer wrote."""
    kind = draw(st.sampled_from(["array", "scalar", "tool_calls", "call", "truncated", "bytes"]))
    if kind == "array":
        return json.dumps(draw(st.lists(JSONISH, max_size=3))).encode()
    if kind == "scalar":
        return json.dumps(
            draw(st.one_of(st.integers(), st.text(max_size=5), st.booleans()))
        ).encode()
    if kind == "tool_calls":
        calls = draw(
            st.one_of(
                st.integers(min_value=1),
                st.text(min_size=1, max_size=4),
                st.dictionaries(st.text(max_size=2), JSONISH, min_size=1, max_size=2),
            )
        )
        return json.dumps({"role": "assistant", "content": "x", "tool_calls": calls}).encode()
    if kind == "call":
        call = draw(
            st.one_of(
                st.just({"id": "c1"}),
                st.just({"name": "bash"}),
                st.just({"id": 1, "name": "bash"}),
                st.lists(JSONISH, max_size=2),
                st.integers(),
                st.text(max_size=3),
            )
        )
        return json.dumps({"role": "assistant", "content": "x", "tool_calls": [call]}).encode()
    if kind == "truncated":
        return b'{"role": "assistant", "content": "x'
    return b'{"role": "assistant", "content": "caf\xe9"}'


@settings(CASES, max_examples=40)
@given(
    bad=trajectory_line(),
    position=st.integers(min_value=0, max_value=2),
    command=st.sampled_from(["whatif", "whatif-id", "replay"]),
)
def test_bad_stayer_trajectory_names_the_file(
    tmp_path: Path, bad: bytes, position: int, command: str
) -> None:
    good = [
        json.dumps({"kind": "task", "content": "do it"}).encode(),
        json.dumps(
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [{"id": "c1", "name": "bash", "arguments": "{}"}],
            }
        ).encode(),
        json.dumps({"role": "tool", "tool_call_id": "c1", "content": "ok"}).encode(),
    ]
    good.insert(position, bad)
    with case_dir(tmp_path) as where:
        run = where / "home" / "runs" / "r1"
        run.mkdir(parents=True)
        (run / "trajectory.jsonl").write_bytes(b"\n".join(good) + b"\n")
        args = {
            "whatif": ["whatif", str(run), "--model", "gpt-5"],
            "whatif-id": ["whatif", "r1", "--model", "gpt-5"],
            "replay": [*RUN, "--sim-policy", f"replay:{run}"],
        }[command]
        line = invoke(args, where)
        assert "trajectory.jsonl" in line, line


@st.composite
def traj_json(draw: st.DrawFn) -> bytes:
    """A mini-swe-agent .traj.json or SWE-agent .traj that is malformed inside."""
    kind = draw(st.sampled_from(["messages", "tool_calls", "history", "steps", "bytes", "json"]))
    if kind == "messages":
        items = draw(
            st.lists(
                st.one_of(st.integers(), st.text(max_size=3), st.lists(JSONISH, max_size=2)),
                min_size=1,
                max_size=3,
            )
        )
        return json.dumps({"messages": [{"role": "user", "content": "x"}, *items]}).encode()
    if kind == "tool_calls":
        calls = draw(
            st.one_of(
                st.integers(min_value=1),
                st.text(min_size=1, max_size=3),
                st.lists(st.one_of(st.integers(), st.text(max_size=2)), min_size=1, max_size=2),
            )
        )
        return json.dumps(
            {
                "messages": [
                    {"role": "user", "content": "x"},
                    {"role": "assistant", "content": "", "tool_calls": calls},
                ]
            }
        ).encode()
    if kind == "history":
        items = draw(
            st.lists(st.one_of(st.integers(), st.text(max_size=3)), min_size=1, max_size=3)
        )
        return json.dumps(
            {"history": items, "trajectory": [{"response": "r", "observation": "o"}]}
        ).encode()
    if kind == "steps":
        steps = draw(
            st.lists(
                st.one_of(st.integers(), st.text(max_size=3), st.none()), min_size=1, max_size=3
            )
        )
        return json.dumps({"history": [], "trajectory": steps}).encode()
    if kind == "bytes":
        return b'{"messages": [{"role": "user", "content": "caf\xe9"}]}'
    return draw(st.sampled_from([b"{", b"[1, 2]", b'{"messages": 5}', b"[" * 100_000]))


@settings(CASES, max_examples=30)
@given(content=traj_json(), suffix=st.sampled_from([".traj", ".traj.json"]))
def test_bad_swe_agent_trajectory_names_the_file(
    tmp_path: Path, content: bytes, suffix: str
) -> None:
    with case_dir(tmp_path) as where:
        trace = where / f"t{suffix}"
        trace.write_bytes(content)
        line = invoke(["whatif", str(trace), "--model", "gpt-5"], where)
        assert str(trace) in line, line


# --- audit logs: bad lines are counted, never fatal ---------------------------------------------

CODEX_HEAD = [
    {
        "timestamp": "2025-10-02T09:00:00Z",
        "type": "session_meta",
        "payload": {"id": "0199a1b2-0000-7000-8000-000000000001", "cwd": "/w"},
    },
    {"timestamp": "2025-10-02T09:00:01Z", "type": "turn_context", "payload": {"model": "gpt-5"}},
]


@st.composite
def codex_line(draw: st.DrawFn) -> bytes:
    usage = st.one_of(
        JSONISH,
        st.fixed_dictionaries(
            {
                "input_tokens": st.one_of(
                    st.integers(min_value=-5, max_value=10**6), st.none(), st.text(max_size=3)
                ),
                "cached_input_tokens": st.integers(min_value=0, max_value=10**6),
                "output_tokens": st.one_of(st.integers(min_value=0, max_value=10**5), st.floats()),
            }
        ),
    )
    kind = draw(st.sampled_from(["token_count", "token_count", "junk", "bytes"]))
    if kind == "token_count":
        info = draw(
            st.one_of(
                JSONISH,
                st.fixed_dictionaries({"total_token_usage": usage, "last_token_usage": usage}),
            )
        )
        ts = draw(st.one_of(st.just("2025-10-02T09:00:05Z"), JSONISH))
        return json.dumps(
            {"timestamp": ts, "type": "event_msg", "payload": {"type": "token_count", "info": info}}
        ).encode()
    if kind == "junk":
        return json.dumps(draw(JSONISH)).encode() + draw(
            st.sampled_from([b"", b'"token_count"', b"}"])
        )
    return b'{"type": "event_msg", "payload": {"type": "token_count", "info": "\xff"}}'


@settings(CASES, max_examples=25)
@given(lines=st.lists(codex_line(), min_size=1, max_size=6))
def test_malformed_codex_log_lines_are_counted_not_fatal(
    tmp_path: Path, lines: list[bytes]
) -> None:
    with case_dir(tmp_path) as where:
        log = (
            where
            / "logs"
            / "rollout-2025-10-02T09-00-00-0199a1b2-0000-7000-8000-000000000001.jsonl"
        )
        log.parent.mkdir()
        log.write_bytes(b"\n".join([json.dumps(x).encode() for x in CODEX_HEAD] + lines) + b"\n")
        before = snapshot(where)
        # The prices the audit compiles are cached: in this test's own directory (beside
        # ``where``, which must stay as it was), never the user's.
        env = {"STAYER_HOME": str(where / "home"), "STAYER_CACHE": str(tmp_path / "cache")}
        result = CliRunner().invoke(app, ["audit", str(log.parent), "--json"], env=env)
        assert result.exception is None or isinstance(result.exception, SystemExit), repr(
            result.exception
        )
        assert result.exit_code == 0, result.stderr
        doc = json.loads(result.stdout)
        usage = doc["totals"]["usage"]
        assert all(isinstance(v, int) and v >= 0 for v in usage.values()), usage
        assert snapshot(where) == before


# --- cases that need a real process -------------------------------------------------------------


def test_yaml_alias_bomb_is_refused_quickly_and_leaves_nothing(tmp_path: Path) -> None:
    src = tmp_path / "tb" / "bomb"
    src.mkdir(parents=True)
    lines = ['a0: &a0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    lines += [f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 9) + "]" for i in range(1, 10)]
    (src / "task.yaml").write_text("instruction: x\n" + "\n".join(lines) + "\ntags: *a9\n")
    p = stayer(
        "tasks",
        "import-tb",
        str(tmp_path / "tb"),
        str(tmp_path / "suite"),
        home=tmp_path / "home",
        timeout=120,
    )
    assert "alias" in one_error_line(p)
    assert not (tmp_path / "suite").exists() and not list(tmp_path.glob("**/.*importing"))


@pytest.mark.parametrize("command", [["runs"], ["report", "r1"], RUN])
def test_stayer_home_that_is_not_utf8(tmp_path: Path, command: list[str]) -> None:
    home = os.fsencode(tmp_path) + b"/h\xff"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    environb = {os.fsencode(k): os.fsencode(v) for k, v in env.items()} | {b"STAYER_HOME": home}
    p = subprocess.run(
        [sys.executable, "-m", "stayer.cli", *command],
        capture_output=True,
        text=True,
        env=environb,
        timeout=120,
        cwd=tmp_path,
    )  # type: ignore[arg-type]
    assert "STAYER_HOME" in one_error_line(p)
    assert not os.path.exists(home)


def _mount_namespace() -> tuple[str, ...]:
    """A private mount namespace for one command (root: its own; else a user namespace)."""
    if shutil.which("unshare") is None:
        pytest.skip("needs unshare(1) to mount a small or read-only file system")
    prefix = ("unshare", "-m") if os.geteuid() == 0 else ("unshare", "-rm")
    if subprocess.run([*prefix, "true"], capture_output=True).returncode != 0:
        pytest.skip("cannot create a mount namespace here")
    return prefix


@pytest.mark.slow
def test_full_disk_mid_run_is_one_line_then_resumes(tmp_path: Path) -> None:
    prefix = _mount_namespace()
    disk = tmp_path / "disk"
    disk.mkdir()
    home = disk / "home"
    stayer_cmd = f"{sys.executable} -m stayer.cli"
    script = f"""
set -u
mount -t tmpfs -o size=600k tmpfs {disk}
{stayer_cmd} run {TASK} --model sim:claude-sonnet-4-5 --sandbox local --run-id full1 \
  --sim-policy synthetic:steps=40,obs_tokens=3000,out_tokens=200 --max-steps 60 2>{tmp_path}/run.err
echo "run=$?" > {tmp_path}/codes
mount -o remount,size=64m {disk}
{stayer_cmd} resume full1 --json >{tmp_path}/resume.out 2>{tmp_path}/resume.err
echo "resume=$?" >> {tmp_path}/codes
"""
    env = {**os.environ, "STAYER_HOME": str(home), "PYTHONPATH": str(ROOT)}
    subprocess.run([*prefix, "sh", "-c", script], env=env, timeout=600, check=True)
    codes = dict(line.split("=") for line in (tmp_path / "codes").read_text().split())
    err = (tmp_path / "run.err").read_text()
    errors = [line for line in err.splitlines() if line.startswith("error")]
    assert codes["run"] == "2" and "Traceback" not in err and len(errors) == 1, err
    assert "full1" in errors[0] and "stayer resume full1" in errors[0]
    # Resumed, it finishes (the synthetic agent does not solve the task: its status is
    # whatever the loop ends with, never an error).
    resumed = (tmp_path / "resume.err").read_text()
    assert codes["resume"] in ("0", "1", "3") and "Traceback" not in resumed, resumed
    assert json.loads((tmp_path / "resume.out").read_text())["status"] in (
        "succeeded",
        "failed",
        "budget_exhausted",
    )


@pytest.mark.parametrize("which", ["eval --out", "audit --html"])
def test_read_only_output_directory_is_refused_before_any_work(tmp_path: Path, which: str) -> None:
    prefix = _mount_namespace()
    ro = tmp_path / "ro"
    ro.mkdir()
    log = (
        tmp_path / "logs" / "rollout-2025-10-02T09-00-00-0199a1b2-0000-7000-8000-000000000001.jsonl"
    )
    log.parent.mkdir()
    log.write_text("\n".join(json.dumps(x) for x in CODEX_HEAD) + "\n")
    args = {
        "eval --out": [
            "eval",
            str(TASK),
            "--model",
            "sim:gpt-5",
            "--sandbox",
            "local",
            "--out",
            str(ro / "out"),
        ],
        "audit --html": ["audit", str(log.parent), "--html", str(ro / "report.html")],
    }[which]
    mount = ("sh", "-c", f'mount --bind -o ro {ro} {ro} && exec "$@"', "sh")
    p = stayer(*args, home=tmp_path / "home", prefix=(*prefix, *mount))
    assert which.split()[1] in one_error_line(p)
    assert list(ro.iterdir()) == [] and not (tmp_path / "home").exists()


@pytest.mark.slow
def test_postgres_gone_mid_run_is_one_line_then_resumes(tmp_path: Path) -> None:
    pytest.importorskip("psycopg")
    sys.path.insert(0, str(ROOT / "tests"))
    import pg_server

    base = Path(tempfile.mkdtemp(prefix="stayer-pg-"))  # the server's user must reach it
    try:
        url = pg_server.start(base)
    except RuntimeError as e:
        shutil.rmtree(base, ignore_errors=True)
        pytest.skip(str(e))
    env = {
        **os.environ,
        "STAYER_HOME": str(tmp_path / "home"),
        "PYTHONPATH": str(ROOT),
        "STAYER_DB": url,
    }
    try:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "stayer.cli",
                "run",
                str(TASK),
                "--model",
                "sim:claude-sonnet-4-5",
                "--sandbox",
                "local",
                "--run-id",
                "pg1",
                "--sim-policy",
                "synthetic:steps=30,obs_tokens=200,out_tokens=50",
                "--sim-latency",
                "0.2",
            ],
            stderr=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            text=True,
            env=env,
        )
        assert proc.stderr is not None
        seen = []
        for line in proc.stderr:  # the database goes away once two steps are journaled:
            seen.append(line)  # after the header's lines, one progress line per step
            if sum(ln.startswith("step ") for ln in seen) == 2:  # held still while the
                # server stops, so the run cannot finish first
                proc.send_signal(signal.SIGSTOP)
                pg_server.stop(base)
                proc.send_signal(signal.SIGCONT)
                break
        rest = proc.stderr.read()
        code = proc.wait(timeout=300)
        err = "".join(seen) + rest
        errors = [line for line in err.splitlines() if line.startswith("error")]
        assert code == 2 and "Traceback" not in err and len(errors) == 1, err
        assert "pg1" in errors[0]
        url = pg_server.start(base)
        p = stayer("resume", "pg1", "--json", home=tmp_path / "home", env={"STAYER_DB": url})
        assert p.returncode in (0, 1, 3) and "Traceback" not in p.stderr, p.stderr
        assert json.loads(p.stdout)["status"] in ("succeeded", "failed", "budget_exhausted")
    finally:
        pg_server.stop(base)
        shutil.rmtree(base, ignore_errors=True)

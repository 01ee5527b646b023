"""Start-up (issue 13 §4): ``stayer --help`` and ``stayer runs`` import neither pydantic nor
the agent, and build no command they do not run. The times are bench/startup.py's."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from typer._click.exceptions import BadParameter
from typer._coercion import build_runtime_param

from stayer.cli import app
from stayer.cli.common import PlainValue, read_plainly

ROOT = Path(__file__).resolve().parent.parent
HEAVY = (
    "pydantic",
    "genai_prices",
    "stayer.agent",
    "stayer.settings",
    "stayer.eval",
    "stayer.sandbox",
)


def imported_by(*args: str, home: Path) -> tuple[subprocess.CompletedProcess[str], set[str]]:
    env = {**os.environ, "STAYER_HOME": str(home), "PYTHONPATH": str(ROOT)}
    p = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "stayer.cli", *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=home.parent,
        timeout=300,
    )
    lines = [line for line in p.stderr.splitlines() if line.startswith("import time:")]
    return p, {line.rsplit("|", 1)[1].strip() for line in lines}


@pytest.mark.parametrize(
    "args", [["--help"], ["runs"], ["runs", "--limit", "3", "--status", "failed"], ["--version"]]
)
def test_help_and_runs_import_no_pydantic_and_no_agent(tmp_path: Path, args: list[str]) -> None:
    p, modules = imported_by(*args, home=tmp_path / "home")
    assert p.returncode == 0, p.stderr[-2000:]
    heavy = sorted(m for m in modules if m.split(".")[0] in HEAVY or m.startswith(HEAVY))
    assert heavy == [], heavy


def test_stayer_help_builds_no_command(monkeypatch: pytest.MonkeyPatch) -> None:
    from typer.main import get_command
    from typer.testing import CliRunner

    group = get_command(app)
    top = CliRunner().invoke(app, ["--help"])
    assert top.exit_code == 0 and "runs " in top.output and "sandbox " in top.output
    assert group.commands.built == {}  # type: ignore[attr-defined]
    assert list(group.commands)[:2] == ["audit", "doctor"]  # commands first, then groups
    assert list(group.commands)[-5:] == ["sandbox", "tenants", "sim", "tasks", "tools"]


# What PlainValue reads must be what Typer's own (pydantic) reading gives, value for value.
INTS = [
    "5",
    "-5",
    "+5",
    "0005",
    "0",
    " 5",
    "5 ",
    "1_000",
    "1.0",
    "1.5",
    "1e3",
    "0x10",
    "½",
    "٣",
    "",
    "ten",
    "9" * 18,
    "9" * 19,
    "9" * 40,
    "\u20035",
]


def typers_reading(param, value: str):
    try:
        return build_runtime_param(param.type_descriptor)._coerce_value(value, param, None)
    except BadParameter as e:
        return ("error", e.message)


def plain_reading(param, value: str):
    try:
        return param._runtime_param._coerce_value(value, param, None)
    except BadParameter as e:
        return ("error", e.message)


def test_plain_values_read_as_typer_reads_them() -> None:
    from typer.main import get_command

    runs = read_plainly(get_command(app).commands["runs"])  # type: ignore[attr-defined]
    params = {p.name: p for p in runs.params}
    limit, task = params["limit"], params["task"]
    assert isinstance(limit._runtime_param, PlainValue) and isinstance(
        task._runtime_param, PlainValue
    )
    for value in INTS:
        assert plain_reading(limit, value) == typers_reading(limit, value), value
        assert plain_reading(task, value) == typers_reading(task, value) == value


def test_rerendering_a_finished_eval_imports_neither_the_agent_nor_price_data(
    tmp_path: Path,
) -> None:
    # Issue 13 §5: reusing an --out only renders; the trials' records are all it needs.
    out = tmp_path / "out"
    args = [
        "eval",
        str(ROOT / "examples" / "hello-file"),
        "--model",
        "sim:gpt-5",
        "--out",
        str(out),
    ]
    first, _ = imported_by(*args, home=tmp_path / "home")
    assert first.returncode == 0, first.stderr[-2000:]
    again, modules = imported_by(*args, home=tmp_path / "home")
    assert again.returncode == 0, again.stderr[-2000:]
    assert "reused 1" in again.stderr and (out / "report.html").exists()
    assert not {"stayer.agent", "stayer.run", "genai_prices", "stayer.pricing"} & modules


@pytest.mark.parametrize("args", [["--version"], ["audit", "{logs}", "--json"]])
def test_json_and_version_never_import_rich(tmp_path: Path, args: list[str]) -> None:
    """Rich is imported where something is rendered with it: a document piped as JSON, or
    the version, loads none of it (a twentieth of an audit's wall time)."""
    logs = tmp_path / "logs" / "project"
    logs.mkdir(parents=True)
    (logs / "s.jsonl").write_text(
        '{"type":"assistant","sessionId":"s","timestamp":"2026-01-01T00:00:00.000Z",'
        '"message":{"id":"msg_1","model":"claude-sonnet-4-5","usage":{"input_tokens":10,'
        '"output_tokens":5}},"requestId":"req_1"}\n'
    )
    p, modules = imported_by(*[a.format(logs=logs) for a in args], home=tmp_path / "home")
    assert p.returncode == 0, p.stderr[-2000:]
    assert sorted(m for m in modules if m.split(".")[0] == "rich") == []
    if args[0] == "audit":
        assert json.loads(p.stdout)["totals"]["calls"] == 1

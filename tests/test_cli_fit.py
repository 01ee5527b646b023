"""Output that fits (issue 35): at an 80-column terminal and in a pipe, `report`, `audit`,
`eval` and `images list` print every number whole; at the terminal no line is wider than
80 columns (columns fold or are left out, and a line says which), in a pipe every column
is there at its full width."""

from __future__ import annotations

import fcntl
import json
import os
import pty
import re
import struct
import subprocess
import sys
import termios
from collections.abc import Iterable
from decimal import Decimal
from pathlib import Path
from typing import Any

from rich.cells import cell_len

from stayer.cli.common import usd
from stayer.tables import Col, FitTable, layout, print_table

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)")


def _env(home: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.endswith("_API_KEY") and k != "STAYER_DB"}
    for k in ("FORCE_COLOR", "NO_COLOR", "TTY_COMPATIBLE", "TTY_INTERACTIVE"):
        env.pop(k, None)
    env.update({"STAYER_HOME": str(home), "PYTHONPATH": str(ROOT), **extra})
    return env


def at_terminal(*args: str, env: dict[str, str], columns: int = 80) -> str:
    """stdout of ``stayer ARGS`` on a terminal ``columns`` wide (COLUMNS too), as shown."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 50, columns, 0, 0))
    p = subprocess.Popen(
        [sys.executable, "-m", "stayer.cli", *args],
        stdin=subprocess.DEVNULL,
        stdout=slave,
        stderr=subprocess.PIPE,
        env={**env, "COLUMNS": str(columns), "TERM": "xterm"},
        cwd=ROOT,
    )
    os.close(slave)
    chunks = []
    while True:
        try:
            chunk = os.read(master, 65536)
        except OSError:  # EIO: the terminal's last writer has gone
            break
        if not chunk:
            break
        chunks.append(chunk)
    os.close(master)
    _, err = p.communicate(timeout=300)
    assert p.returncode == 0, err.decode()
    return ANSI.sub("", b"".join(chunks).decode()).replace("\r", "")


def in_pipe(*args: str, env: dict[str, str]) -> str:
    p = subprocess.run(
        [sys.executable, "-m", "stayer.cli", *args],
        capture_output=True,
        text=True,
        env={**env, "COLUMNS": "80"},
        cwd=ROOT,
        timeout=300,
    )
    assert p.returncode == 0, p.stderr
    return p.stdout


def assert_whole(text: str, values: Iterable[str]) -> None:
    """Each value stands whole in ``text``, not as part of a longer number."""
    for v in values:
        assert re.search(rf"(?<![\w.,$]){re.escape(v)}(?![\w.,])", text), (v, text)


def assert_fits(text: str, columns: int = 80) -> None:
    wide = [line for line in text.splitlines() if cell_len(line) > columns]
    assert not wide, "\n".join(wide)


def check(args: tuple[str, ...], env: dict[str, str], numbers: list[str], words: list[str]) -> str:
    """``args`` at an 80-column terminal and in a pipe: every number whole in both, no line
    past 80 columns at the terminal, every word (names, headers) whole in the pipe."""
    shown = at_terminal(*args, env=env)
    assert_fits(shown)
    assert_whole(shown, numbers)
    piped = in_pipe(*args, env=env)
    assert_whole(piped, numbers + words)
    assert "…" not in piped and "not shown at" not in piped
    return shown


# --- the layout ------------------------------------------------------------------------------


def test_layout_drops_by_priority_and_never_narrows_a_number() -> None:
    t = FitTable(
        Col("name"), Col("a", number=True, drop=1), Col("b", number=True, drop=2), Col("c")
    )
    t.add_row("x" * 40, "1" * 20, "2" * 20, "some text here")
    shown, widths, dropped = layout(t, 60)
    assert dropped == ["b"] and shown == [0, 1, 3]
    assert widths[1] == 20 and sum(widths) + 3 * 3 + 1 <= 60
    assert layout(t, None) == ([0, 1, 2, 3], [40, 20, 20, 14], [])


def test_a_terminal_too_narrow_for_the_table_gets_a_block_per_row() -> None:
    from rich.console import Console

    t = FitTable(Col("name"), Col("cost", number=True), Col("tokens", number=True))
    t.add_row("a-model-with-a-long-name", "$123.456789", "12,345,678")
    t.add_row("b", "$0.000001", "1")
    console = Console(width=24, force_terminal=True, record=True, color_system=None)
    print_table(console, t)
    text = console.export_text()
    assert_fits(text, 24)
    assert_whole(text, ["$123.456789", "12,345,678", "$0.000001", "a-model-with-a-long-name"])
    assert "cost: $123.456789" in text


# --- the commands -----------------------------------------------------------------------------


def test_report_at_80_columns_and_in_a_pipe(tmp_path: Path) -> None:
    env = _env(tmp_path / "home")
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "stayer.cli",
            "run",
            str(EXAMPLES / "hello-file"),
            "--model",
            "sim:claude-sonnet-4-5",
            "--sim-policy",
            "synthetic:steps=4,obs_tokens=800,out_tokens=100",
            "--run-id",
            "wide",
        ],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=600,
    )
    assert run.returncode in (0, 1), run.stderr
    doc = json.loads(in_pipe("report", "wide", "--json", env=env))
    numbers = [usd(doc["totals"]["cost_usd"])]
    for u in [e["usage"] for e in doc["ledger"]] + [doc["totals"]["usage"]]:
        numbers += [f"{u[k]:,}" for k in ("input_tokens", "cache_read_tokens", "output_tokens")]
    numbers += [usd(e["cost_usd"]) for e in doc["ledger"]]
    shown = check(
        ("report", "wide"), env, numbers, ["sim:claude-sonnet-4-5", "cache write", "tools"]
    )
    assert "not shown at 80 columns:" in shown  # what was left out is said


def _audit_sessions(root: Path) -> None:
    from test_audit import assistant, user, write_jsonl

    # Two Sonnets (the same first 10 characters) and a session id longer than any column;
    # tool calls, so that a what-if can replay them.
    for n, model in enumerate(["claude-sonnet-4-5-20250929", "claude-sonnet-4-20250514"]):
        s = f"session-{n}-with-a-long-identifier-0123456789abcdef"
        lines: list[dict[str, Any]] = [
            {**user(s, 0), "message": {"role": "user", "content": "Fix calc.py"}}
        ]
        for i in range(4):
            call = f"toolu_{n}_{i}"
            line = assistant(
                s,
                10 + 20 * i,
                f"msg_{n}_{i}",
                model=model,
                read=123_456 * i,
                write=98_765 if i == 0 else 4_321,
                out=1_234,
            )
            line["message"]["content"] = [
                {"type": "tool_use", "id": call, "name": "Bash", "input": {"command": f"cat f{i}"}}
            ]
            result = {"type": "tool_result", "tool_use_id": call, "content": "x = 1\n" * 200}
            lines += [
                line,
                {**user(s, 20 + 20 * i), "message": {"role": "user", "content": [result]}},
            ]
        write_jsonl(root / "p" / f"{s}.jsonl", lines)


def test_audit_at_80_columns_and_in_a_pipe(tmp_path: Path) -> None:
    _audit_sessions(tmp_path / "projects")
    env = _env(tmp_path / "home", HOME=str(tmp_path), STAYER_CACHE=str(tmp_path / "cache"))
    for args in [("--group", "model"), ("--what-if", "policy=none")]:
        full = (
            "audit",
            str(tmp_path / "projects"),
            *args,
        )
        doc = json.loads(in_pipe(*full, "--json", env=env))
        numbers = [f"${Decimal(g['cost_usd']):,.4f}" for g in doc["groups"]]
        numbers.append(f"${Decimal(doc['totals']['cost_usd']):,.4f}")
        numbers += [str(g["calls"]) for g in doc["groups"]]
        words = [g["key"] for g in doc["groups"]]
        for w in doc["what_if"]:
            assert "error" not in w, w
            numbers += [w["cost_usd"], w["baseline_cost_usd"]]
            words += [w["actual_main_chain_cost_usd"], w["actual_cost_usd"]]
        shown = check(full, env, numbers, words)
        if doc["what_if"]:
            assert "What-if" in shown and "replayed" in shown and "what-if" in shown


def test_eval_at_80_columns_and_in_a_pipe(tmp_path: Path) -> None:
    suite = tmp_path / "suite"
    suite.mkdir()
    subprocess.run(["cp", "-r", str(EXAMPLES / "hello-file"), str(suite)], check=True)
    env = _env(tmp_path / "home")
    out = tmp_path / "out"
    args = ("eval", str(suite), "--model", "sim:claude-sonnet-4-5,sim:gpt-5", "--out", str(out))
    doc = json.loads(in_pipe(*args, "--json", env=env))
    numbers = []
    for c in doc["configs"]:
        numbers += [usd(c["mean_cost_usd"]), usd(c["cost_per_success_usd"])]
        numbers += [f"{c['ci_low']:.3f}–{c['ci_high']:.3f}", f"{c['success_rate']:.3f}"]
    # The trials are done: these runs print the table of the results kept in --out.
    check(args, env, numbers, ["sim:claude-sonnet-4-5", "pass^k", "infra"])


def test_images_list_at_80_columns_and_in_a_pipe(tmp_path: Path) -> None:
    from test_images_cli import _layer

    cache = tmp_path / "cache"
    day = 86400.0
    for i, name in enumerate("abcdef"):
        _layer(
            cache,
            name,
            parent=None if i in (0, 3) else "abcdef"[i - 1],
            age=(i + 1) * day,
            size=(i + 1) * 123_456_789,
            images=(f"/home/someone/projects/suite-{name}/tasks/{name}/environment/Dockerfile",),
        )
    env = _env(tmp_path / "home", STAYER_CACHE=str(cache))
    doc = json.loads(in_pipe("images", "list", "--json", env=env))
    from stayer.cli.images import _human

    numbers = [_human(layer["size_bytes"]) for layer in doc["layers"]]
    numbers += [layer["last_used"][:16].replace("T", " ") for layer in doc["layers"]]
    numbers.append(_human(doc["total_bytes"]))
    words = [layer["id"] for layer in doc["layers"]] + [doc["layers"][0]["images"][0]]
    shown = check(("images", "list"), env, numbers, words)
    # A layer a line (and its folds), not a paragraph per layer.
    assert len(shown.splitlines()) <= 3 * len(doc["layers"]) + 6, shown


def test_run_progress_at_80_columns_and_in_a_pipe(tmp_path: Path) -> None:
    """The per-step lines of ``stayer run`` (stderr) fit a terminal: the model, which the
    header names, gives way first; every cost stays whole. A pipe gets whole lines."""
    from stayer.cli.common import usd

    env = _env(tmp_path / "home")
    args = ("run", str(EXAMPLES / "fix-median"), "--model", "sim:claude-sonnet-4-5")
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 50, 80, 0, 0))
    p = subprocess.Popen(
        [sys.executable, "-m", "stayer.cli", *args], stdin=subprocess.DEVNULL,
        stdout=slave, stderr=slave, env={**env, "COLUMNS": "80", "TERM": "xterm"}, cwd=ROOT,
    )  # fmt: skip
    os.close(slave)
    chunks = []
    while True:
        try:
            chunk = os.read(master, 65536)
        except OSError:
            break
        if not chunk:
            break
        chunks.append(chunk)
    os.close(master)
    assert p.wait(timeout=300) == 0
    shown = ANSI.sub("", b"".join(chunks).decode()).replace("\r", "")
    assert_fits(shown)
    doc = json.loads(in_pipe("report", "--last", "--json", env=env))
    costs = [e["cost_usd"] for e in doc["ledger"]]
    assert_whole(shown, [usd(c) for c in costs])  # as the line formats them, whole
    piped = subprocess.run(
        [sys.executable, "-m", "stayer.cli", *args], capture_output=True, text=True,
        env={**env, "COLUMNS": "80"}, cwd=ROOT, timeout=300,
    )  # fmt: skip
    assert "sim:claude-sonnet-4-5 │ ctx" in piped.stderr  # a pipe keeps the whole line

"""Output that explains itself: why a run stopped and what to do next, the model and cache
events of every step, filters on `runs`, plain progress in logs, typo'd models, help."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from typer.main import get_command
from typer.testing import CliRunner

from stayer import __version__
from stayer.cli import app
from stayer.cli.common import step_notes, usd

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"
MONEY = re.compile(r"\$[0-9][0-9,]*(?:\.[0-9]+)?")


def stayer(*args: str, home: Path, columns: int = 250, **kw) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.endswith("_API_KEY") and k != "STAYER_DB"}
    env.update({"STAYER_HOME": str(home), "COLUMNS": str(columns)})
    return subprocess.run(
        [sys.executable, "-m", "stayer.cli", *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=home.parent,
        timeout=600,
        **kw,
    )


def assert_plain_money(text: str) -> None:
    """No "None" anywhere, and every amount stayer formats with the same precision (6
    decimals); the breakers' and the wrap-up's own words, quoted, keep theirs."""
    assert "None" not in text, text
    ours = [line for line in text.splitlines() if not line.startswith(("stopped:", "  "))]
    amounts = MONEY.findall("\n".join(ours))
    assert amounts, text
    assert all(re.fullmatch(r"\$[0-9][0-9,]*\.[0-9]{6}", a) for a in amounts), amounts


# --- help ------------------------------------------------------------------------------------


def command_paths(group, prefix=()):
    for name, cmd in group.commands.items():
        if hasattr(cmd, "commands"):
            yield from command_paths(cmd, (*prefix, name))
        else:
            yield (*prefix, name)


def test_help_has_short_flag_version_and_an_example_per_command():
    runner = CliRunner()
    top = runner.invoke(app, ["-h"])
    assert top.exit_code == 0 and "stayer doctor" in top.output
    version = runner.invoke(app, ["--version"])
    assert version.exit_code == 0 and version.output.strip() == f"stayer {__version__}"
    paths = list(command_paths(get_command(app)))
    assert ("run",) in paths and ("sandbox", "exec") in paths and ("doctor",) in paths
    for path in paths:
        r = runner.invoke(app, [*path, "-h"])
        assert r.exit_code == 0, (path, r.output)
        assert re.search(rf"Example:\s+(\S+=\S+\s+)?stayer {' '.join(path)}\b", r.output), path
        assert "<bool>" not in r.output, path


# --- a run says why it stopped and what to do next ------------------------------------------


def test_budget_exhausted_run_says_why_with_the_summary_and_a_next_step(tmp_path):
    r = stayer(
        "run",
        str(EXAMPLES / "hello-file"),
        "--model",
        "sim:claude-sonnet-4-5",
        "--max-cost",
        "0.001",
        "--run-id",
        "capped-run",
        home=tmp_path / "home",
    )
    assert r.returncode == 3, r.stderr
    out = r.stdout
    assert "run capped-run · hello-file · sim:claude-sonnet-4-5" in out
    assert re.search(
        r"^stopped: max_cost: the next call's worst case \(\$[0-9.]+ or more\) does not fit",
        out,
        re.M,
    )
    assert "wrap-up summary:" in out and "  DONE: 0 step(s)" in out and "  REMAINING:" in out
    need = re.search(r"^next: raise --max-cost to ≥ \$([0-9.]+)", out, re.M)
    assert need and float(need.group(1)) > 0.001, out
    assert_plain_money(out)


def test_failed_run_shows_the_verifier_output_and_the_model_of_each_step(tmp_path):
    r = stayer(
        "run",
        str(EXAMPLES / "fix-median"),
        "--model",
        "sim:claude-sonnet-4-5",
        "--sim-policy",
        "synthetic:steps=1,obs_tokens=50,out_tokens=20",
        "--run-id",
        "failing",
        home=tmp_path / "home",
    )
    assert r.returncode == 1, r.stderr
    steps = [line for line in r.stderr.splitlines() if line.startswith("step ")]
    assert len(steps) == 2 and all("│ sim:claude-sonnet-4-5 │" in line for line in steps)
    out = r.stdout
    assert re.search(r"^verifier output: \(last \d+ lines, exit code \d+\)", out, re.M)
    assert "IndexError" in out  # the failing test's own words
    assert "next: read the verifier output above; `stayer report failing`" in out
    assert f"`stayer tasks check {EXAMPLES / 'fix-median'}`" in out
    assert_plain_money(r.stdout + r.stderr)


def readme_toml() -> str:
    text = (ROOT / "README.md").read_text()
    blocks = re.findall(r"```toml\n(.*?)```", text, re.S)
    assert len(blocks) == 1, "README.md: expected one stayer.toml example"
    return blocks[0]


def test_readme_stayer_toml_runs_as_written_and_steps_show_model_switches(tmp_path):
    home = tmp_path / "home"
    (tmp_path / "stayer.toml").write_text(readme_toml())
    r = stayer(
        "run",
        str(EXAMPLES / "fix-median"),
        "--model",
        "sim:claude-sonnet-4-5",
        "--config",
        "stayer.toml",
        "--sim-policy",
        "synthetic:steps=4,obs_tokens=300,out_tokens=50",
        "--run-id",
        "routed",
        home=home,
    )
    assert r.returncode == 1, r.stderr  # synthetic work fails the task's tests; the config ran
    steps = [line for line in r.stderr.splitlines() if line.startswith("step ")]
    assert "│ sim:claude-sonnet-4-5 │" in steps[0]
    switch = next(line for line in steps if "│ sim:claude-haiku-4-5 │" in line)
    assert "cache break: model_switch" in switch and "switched to sim:claude-haiku-4-5" in switch
    report = stayer("report", "routed", home=home)
    assert report.returncode == 0, report.stderr
    assert "sim:claude-haiku-4-5" in report.stdout and "cache break: model_switch" in report.stdout
    assert_plain_money(report.stdout)
    # and as the plain run of README command 1 would use it
    plain = stayer(
        "run",
        str(EXAMPLES / "fix-median"),
        "--model",
        "sim:claude-sonnet-4-5",
        "--config",
        "stayer.toml",
        "--json",
        home=home,
    )
    assert plain.returncode == 0 and json.loads(plain.stdout)["status"] == "succeeded", plain.stderr


def test_compactions_show_in_progress_lines_and_report(tmp_path):
    home = tmp_path / "home"
    r = stayer(
        "run",
        str(EXAMPLES / "hello-file"),
        "--model",
        "sim:gpt-5",
        "--policy",
        "summarize:3000",
        "--sim-policy",
        "synthetic:steps=8,obs_tokens=800,out_tokens=50",
        "--sandbox",
        "local",
        "--run-id",
        "compacting",
        home=home,
    )
    note = re.compile(r"compacted [0-9,]+ → [0-9,]+ tokens \(\w+\)")
    compacted = [line for line in r.stderr.splitlines() if note.search(line)]
    assert compacted and all("cache break: compaction" in line for line in compacted), r.stderr
    report = stayer("report", "compacting", home=home)
    assert len(note.findall(report.stdout)) == len(compacted), report.stdout


def test_step_notes_name_breaks_compactions_and_switches():
    entry = {
        "cache_break": {"position_tokens": 10, "reason": "prefix_edit", "detail": "message 3"},
        "compaction": {"reason": "threshold", "tokens_before": 12000, "tokens_after": 4000},
        "route": {"model": "sim:gpt-5", "reason": "failover", "switched": True},
    }
    assert step_notes(entry) == [
        "cache break: prefix_edit (message 3)",
        "compacted 12,000 → 4,000 tokens (threshold)",
        "switched to sim:gpt-5 (failover)",
    ]
    assert step_notes({"cache_break": None, "compaction": None, "route": None}) == []
    assert [usd(None), usd("unknown"), usd("0"), usd("1234.5")] == [
        "—",
        "unknown",
        "$0.000000",
        "$1,234.500000",
    ]


# --- runs: filters, where it looked, whole ids ----------------------------------------------


def test_runs_filters_say_where_they_looked_and_never_cut_an_id(tmp_path):
    home = tmp_path / "home"
    empty = stayer("runs", home=home)
    assert empty.returncode == 0 and f"no journal at {home / 'stayer.db'}" in empty.stdout
    ok = stayer(
        "run",
        str(EXAMPLES / "hello-file"),
        "--model",
        "sim:gpt-5",
        "--run-id",
        "a-run-with-a-rather-long-id-0001",
        home=home,
    )
    capped = stayer(
        "run",
        str(EXAMPLES / "hello-file"),
        "--model",
        "sim:claude-sonnet-4-5",
        "--max-cost",
        "0.001",
        "--run-id",
        "a-run-with-a-rather-long-id-0002",
        home=home,
    )
    assert (ok.returncode, capped.returncode) == (0, 3), ok.stderr + capped.stderr

    def ids(*flags: str) -> list[str]:
        r = stayer("runs", "--json", *flags, home=home)
        assert r.returncode == 0, r.stderr
        return [d["id"] for d in json.loads(r.stdout)["runs"]]

    both = ["a-run-with-a-rather-long-id-0002", "a-run-with-a-rather-long-id-0001"]
    assert ids() == both and ids("--task", "hello") == both
    assert ids("--status", "budget_exhausted") == both[:1]
    assert ids("--model", "gpt") == both[1:]
    assert ids("--since", "2000-01-01") == both and ids("--since", "2999-01-01") == []
    for bad in (["--status", "done"], ["--since", "yesterday"]):
        r = stayer("runs", *bad, home=home)
        assert r.returncode == 2 and bad[0] in r.stderr and len(r.stderr.strip().splitlines()) == 1
    narrow = stayer("runs", "--status", "succeeded", home=home, columns=50)
    assert "a-run-with-a-rather-long-id-0001" in narrow.stdout  # whole, on one line
    assert f"1 of 2 run(s) matching status succeeded in {home / 'stayer.db'}" in narrow.stdout
    assert_plain_money(stayer("runs", home=home).stdout)


# --- typo'd models ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("model", "suggestion"),
    [("sim:claude-sonet-4-5", "sim:claude-sonnet-4-5"), ("sim:gpt-9", "sim:gpt-5")],
)
def test_a_typod_model_is_rejected_with_the_closest_names(tmp_path, model, suggestion):
    home = tmp_path / "home"
    for cmd in (["run", str(EXAMPLES / "hello-file")], ["eval", str(EXAMPLES / "hello-file")]):
        r = stayer(*cmd, "--model", model, "--json", home=home)
        assert r.returncode == 2 and r.stdout == "", r.stderr
        line = r.stderr.strip()
        assert (
            len(line.splitlines()) == 1
            and model in line
            and "did you mean" in line
            and suggestion in line
        )
    assert not home.exists()


# --- eval: plain progress in a log, Ctrl-C says how to resume -----------------------------------


def test_eval_without_a_terminal_prints_plain_progress_and_no_none(tmp_path):
    r = stayer(
        "eval",
        str(EXAMPLES / "hello-file"),
        "--model",
        "sim:claude-sonnet-4-5",
        "--max-cost",
        "0.001",
        home=tmp_path / "home",
    )
    assert r.returncode == 0, r.stderr
    progress = [line for line in r.stderr.splitlines() if line.startswith("eval: ")]
    assert progress, r.stderr
    assert re.fullmatch(
        r"eval: 1/1 done · .* · \$[0-9.]+ so far · \S+ elapsed · ETA 0s", progress[-1]
    )
    assert "\x1b[" not in r.stderr  # no terminal control codes in a log
    assert "None" not in r.stderr + r.stdout and "—" in r.stdout  # cost / success: no success


def ctrl_c_as_at_a_terminal() -> None:
    """In the child: SIGINT as a terminal's shell gives it. A job a script starts in the
    background (``.ci/run &``) inherits SIGINT ignored, and Python then never raises
    KeyboardInterrupt: the child would sleep through the Ctrl-C these tests send."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def test_ctrl_c_on_eval_says_how_far_it_got_and_how_to_resume(tmp_path):
    out = tmp_path / "out"
    env = {k: v for k, v in os.environ.items() if not k.endswith("_API_KEY") and k != "STAYER_DB"}
    env["STAYER_HOME"] = str(tmp_path / "home")
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "stayer.cli",
            "eval",
            str(EXAMPLES),
            "--model",
            "sim:gpt-5",
            "--epochs",
            "2",
            "--concurrency",
            "1",
            "--sim-latency",
            "30",
            "--sandbox",
            "local",
            "--out",
            str(out),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        cwd=tmp_path,
        preexec_fn=ctrl_c_as_at_a_terminal,
    )
    try:
        assert proc.stderr is not None
        for line in proc.stderr:  # interrupt once the trials have started
            if line.startswith("stayer eval"):
                break
        proc.send_signal(signal.SIGINT)
        stdout, stderr = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, stderr
    done = re.search(
        rf"interrupted: (\d)/8 done; rerun with the same --out {re.escape(str(out))} to resume",
        stderr,
    )
    assert done, stderr
    assert "Traceback" not in stderr and stdout == ""
    # what it says is so: as many trials as it counted are kept in --out for the rerun
    assert len(list((out / "trials").glob("*.json"))) >= int(done.group(1))


def test_ctrl_c_while_the_event_loop_is_being_made_cancels_the_work_cleanly() -> None:
    # The moment between making the coroutine and the loop's own Ctrl-C handler: Python
    # used to raise there, inside the loop's construction (a traceback from its __del__,
    # "coroutine was never awaited"); now the work is cancelled and unwinds.
    code = """
import asyncio, os, signal
from stayer.cli.common import run_async
real = asyncio.run
def ctrl_c_first(coro):
    os.kill(os.getpid(), signal.SIGINT)
    return real(coro)
asyncio.run = ctrl_c_first
seen = []
async def work():
    try:
        await asyncio.sleep(300)
    except asyncio.CancelledError:
        seen.append("cancelled")
        raise
try:
    run_async(work)
except KeyboardInterrupt:
    print("interrupted", seen)
"""
    proc = subprocess.run(
        [sys.executable, "-W", "error", "-c", code],
        capture_output=True,
        text=True,
        timeout=300,
        preexec_fn=ctrl_c_as_at_a_terminal,
    )
    assert proc.stdout.strip() == "interrupted ['cancelled']", proc.stderr
    assert proc.stderr == ""


def test_report_follow_tails_a_running_run_from_another_process(tmp_path: Path) -> None:
    import time

    from stayer.cli.common import usd

    env = {**os.environ, "STAYER_HOME": str(tmp_path / "home")}
    task = Path(__file__).resolve().parent.parent / "examples" / "hello-file"
    run = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "stayer.cli",
            "run",
            str(task),
            "--model",
            "sim:claude-sonnet-4-5",
            "--run-id",
            "tailed",
            "--sim-policy",
            "synthetic:steps=6,obs_tokens=50,out_tokens=10",
            "--sim-latency",
            "0.3",
            "--json",
        ],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        for _ in range(2400):  # until the run is in the journal (a hang guard, not a timing margin)
            probe = subprocess.run(
                [sys.executable, "-m", "stayer.cli", "runs", "--json"],
                env=env,
                capture_output=True,
                text=True,
            )
            if '"tailed"' in probe.stdout:
                break
            time.sleep(0.1)
        tail = subprocess.run(
            [sys.executable, "-m", "stayer.cli", "report", "tailed", "--follow"],
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
        )
        doc = json.loads(run.communicate(timeout=600)[0])
    finally:
        run.kill()
    lines = [line for line in tail.stdout.splitlines() if line.startswith("step")]
    assert len(lines) == doc["steps"] == 7
    assert lines[-1].split("│")[5].strip() == f"total {usd(doc['cost_usd'])}"
    assert tail.stdout.splitlines()[-1].startswith(f"finished: {doc['status']}")
    assert tail.returncode == run.returncode


@pytest.mark.parametrize("status", ["running", "interrupted", "cancelled", "error", "corrupt"])
def test_runs_takes_every_status_it_shows(tmp_path, status):
    """Before: --status cancelled was refused though the hosted runtime's cancelled runs
    are listed as cancelled. The choices are the journal's own statuses."""
    from stayer.journal import open_store
    from stayer.journal.store import RunRow

    home = tmp_path / "home"
    store = open_store(home)
    try:
        for n, final in enumerate(
            ("succeeded", "failed", "budget_exhausted", "error", "cancelled")
        ):
            row = RunRow(f"r{n}", "t", "sim:gpt-5", final, 1, "0.1", "2026-01-01", "2026-01-01")
            store.create_run(row, "nobody", 0)
    finally:
        store.close()
    r = stayer("runs", "--status", status, "--json", home=home)
    assert r.returncode in (0, 2) and "--status" not in r.stderr, r.stderr
    if status == "cancelled":
        assert [d["id"] for d in json.loads(r.stdout)["runs"]] == ["r4"]
    help_text = " ".join(stayer("runs", "--help", home=home, columns=200).stdout.split())
    assert "cancelled" in help_text


def test_help_names_every_choice_a_command_takes(tmp_path):
    """Before: sandbox exec --help omitted bwrap-persistent and run --help textbook. The
    choices in help come from the lists the commands check against."""
    from stayer.context.policies import POLICIES, make_policy
    from stayer.errors import ConfigError
    from stayer.sandbox import KINDS, make_sandbox

    def help_of(*command: str) -> str:
        r = stayer(*command, "--help", home=tmp_path / "home", columns=200)
        assert r.returncode == 0, r.stderr
        return " ".join(r.stdout.split()).replace("- ", "-")  # a name split at its hyphen

    for command in (("run",), ("whatif",), ("eval",)):
        text = help_of(*command)
        for name in POLICIES:
            make_policy(name)  # taken…
            assert f"{name}" in text.split("--policy", 1)[1], (command, name)  # …and named
    for command in (("run",), ("eval",), ("sandbox", "exec")):
        text = help_of(*command).split("--sandbox", 1)[1].split(" --", 1)[0]
        for kind in KINDS:
            try:
                make_sandbox(kind, tmp_path)
                taken = True
            except ConfigError:
                taken = command != ("sandbox", "exec")  # a task's image: run and eval build it
            assert (f"{kind} (" in text) == taken, (command, kind, text)

"""`stayer run` end to end, through the real command line, on the simulator."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from decimal import Decimal
from pathlib import Path

import pytest
from genai_prices import Usage as GPUsage
from genai_prices import calc_price
from test_cli_output import ctrl_c_as_at_a_terminal

from stayer.sandbox.locate import locate_bwrap

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"
CORPUS_TASK = ROOT.parent / "shared" / "corpus" / "terminal-bench" / "harbor" / "simple-task"
PROVIDER = {"claude-sonnet-4-5": "anthropic", "gpt-5": "openai"}

needs_bwrap = pytest.mark.skipif(locate_bwrap() is None, reason="bubblewrap not installed")


def stayer(
    *args: str, home: Path, env: dict[str, str] | None = None, timeout: float = 120
) -> subprocess.CompletedProcess:
    """``stayer ARGS`` with ``home`` as STAYER_HOME; ``timeout`` only stops a hang."""
    full_env = {k: v for k, v in os.environ.items() if not k.endswith("_API_KEY")}
    full_env.update({"STAYER_HOME": str(home)}, **(env or {}))
    return subprocess.run(
        [sys.executable, "-m", "stayer.cli", *args],
        capture_output=True,
        text=True,
        env=full_env,
        cwd=home.parent,
        timeout=timeout,
    )


def genai_cost(step: dict, model_id: str) -> Decimal:
    u = step["usage"]
    return calc_price(
        GPUsage(
            input_tokens=u["input_tokens"],
            cache_read_tokens=u["cache_read_tokens"],
            cache_write_tokens=u["cache_write_tokens"],
            output_tokens=u["output_tokens"],
        ),
        model_ref=model_id,
        provider_id=PROVIDER[model_id],
    ).total_price


@needs_bwrap
@pytest.mark.parametrize("model_id", ["claude-sonnet-4-5", "gpt-5"])
@pytest.mark.parametrize("example", ["hello-file", "fix-median", "sales-report"])
def test_examples_succeed_with_exact_cost(tmp_path, example, model_id):
    home = tmp_path / "home"
    r = stayer("run", str(EXAMPLES / example), "--model", f"sim:{model_id}", "--json", home=home)
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)  # exactly one JSON document on stdout
    assert doc["status"] == "succeeded" and doc["reward"] == 1
    assert doc["task"] == example and doc["model"] == f"sim:{model_id}"
    ledger = doc["ledger"]
    assert len(ledger) == doc["steps"] >= 2
    total = Decimal(doc["cost_usd"])
    assert total == sum(Decimal(e["cost_usd"]) for e in ledger)
    for e in ledger:
        assert Decimal(e["cost_usd"]) == genai_cost(e, model_id)
        assert set(e) >= {
            "step",
            "model",
            "usage",
            "cost_usd",
            "cache_hit_ratio",
            "latency_s",
            "tool_calls",
        }
    assert set(doc["usage"]) >= {
        "input_tokens",
        "cache_read_tokens",
        "cache_write_tokens",
        "output_tokens",
        "reasoning_tokens",
    }
    assert doc["usage"]["input_tokens"] == sum(e["usage"]["input_tokens"] for e in ledger)
    # Progress goes to stderr, one line per step.
    assert "step   1" in r.stderr


@needs_bwrap
@pytest.mark.parametrize(("model_id", "minimum"), [("claude-sonnet-4-5", 1024), ("gpt-5", 1024)])
def test_synthetic_run_reads_whole_previous_prompt_from_cache(tmp_path, model_id, minimum):
    home = tmp_path / "home"
    r = stayer(
        "run",
        str(EXAMPLES / "hello-file"),
        "--model",
        f"sim:{model_id}",
        "--json",
        "--sim-policy",
        "synthetic:steps=10,obs_tokens=2000,out_tokens=200",
        "--policy",
        "none",
        home=home,
    )
    doc = json.loads(r.stdout)
    assert r.returncode == 1 and doc["status"] == "failed"  # synthetic work does not solve the task
    ledger = doc["ledger"]
    assert len(ledger) == 11
    checked = 0
    for prev, cur in zip(ledger, ledger[1:], strict=False):
        previous_prompt = prev["usage"]["input_tokens"]
        if previous_prompt < minimum:
            continue
        read = cur["usage"]["cache_read_tokens"]
        if model_id == "gpt-5":
            assert read == minimum + (previous_prompt - minimum) // 128 * 128
        else:
            assert read == previous_prompt
        checked += 1
    assert checked >= 9
    # The observations really ran: the workspace file grew every step.
    log = Path(doc["run_dir"]) / "workspace" / "synthetic.log"
    assert len(log.read_text().splitlines()) > 10 * 50


@needs_bwrap
def test_replay_of_a_recorded_run(tmp_path):
    home = tmp_path / "home"
    first = json.loads(
        stayer(
            "run",
            str(EXAMPLES / "fix-median"),
            "--model",
            "sim:gpt-5",
            "--json",
            "--run-id",
            "a",
            home=home,
        ).stdout
    )
    r = stayer(
        "run",
        str(EXAMPLES / "fix-median"),
        "--model",
        "sim:claude-sonnet-4-5",
        "--json",
        "--run-id",
        "b",
        "--sim-policy",
        f"replay:{first['run_dir']}",
        home=home,
    )
    doc = json.loads(r.stdout)
    assert doc["status"] == "succeeded" and doc["steps"] == first["steps"]


@needs_bwrap
@pytest.mark.skipif(not CORPUS_TASK.is_dir(), reason="shared corpus not present")
def test_third_party_harbor_task(tmp_path):
    """simple-task from the Harbor repository: its verifier installs pytest from the network,
    which the sandbox does not have, so we also run its own test file offline."""
    home = tmp_path / "home"
    # Where mmdebstrap is installed and ~/.cache/stayer is cold, the run first makes the
    # image's base: minutes, more on a loaded machine (it once took over 120 s here).
    original = stayer(
        "run", str(CORPUS_TASK), "--model", "sim:claude-sonnet-4-5", "--json", home=home,
        timeout=1800,
    )  # fmt: skip
    doc = json.loads(original.stdout)
    # It ran (in its image, as it has a Dockerfile), and its verifier could install nothing
    # (no network, no root for apt): the environment's failure, not the agent's.
    assert doc["status"] == "error" and doc["reward"] == 0 and original.returncode == 1
    why = doc["verifier"]["infrastructure"]
    assert doc["verifier"]["outcome"] == "infrastructure"
    assert "network" in why or "installs system packages" in why, why
    task = tmp_path / "simple-task"
    shutil.copytree(CORPUS_TASK, task)
    (task / "tests" / "test.sh").write_text(
        "cd /tests && python3 -c 'import test_state as t; t.test_hello_file_exists(); t.test_hello_file_contents()'"
        " && echo 1 > /logs/verifier/reward.txt || echo 0 > /logs/verifier/reward.txt\n"
    )
    # its image (ubuntu:24.04) has no python3 for this offline test: the host's system
    r = stayer(
        "run", str(task), "--model", "sim:claude-sonnet-4-5", "--sandbox", "bwrap", "--json",
        home=home,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["status"] == "succeeded"


@needs_bwrap
def test_max_cost_stops_before_overshooting(tmp_path):
    home = tmp_path / "home"
    r = stayer(
        "run",
        str(EXAMPLES / "hello-file"),
        "--model",
        "sim:claude-sonnet-4-5",
        "--json",
        "--sim-policy",
        "synthetic:steps=40,obs_tokens=3000,out_tokens=200",
        "--max-cost",
        "0.2",
        home=home,
    )
    assert r.returncode == 3, r.stderr
    doc = json.loads(r.stdout)
    assert doc["status"] == "budget_exhausted"
    assert Decimal(doc["cost_usd"]) <= Decimal("0.2")
    assert 5 <= doc["steps"] < 40
    assert doc["stop_reason"] == "max_cost"


@needs_bwrap
def test_a_cost_cap_stop_says_which_worst_case_did_not_fit(tmp_path):
    """Before: only "stopped: max_cost" at 57 % of the cap, and no field in --json."""
    import re

    args = [
        "run",
        str(EXAMPLES / "sales-report"),
        "--model",
        "sim:claude-sonnet-4-5",
        "--sim-policy",
        "synthetic:steps=40,obs_tokens=800,out_tokens=100",
        "--max-cost",
        "0.05",
    ]
    doc = json.loads(stayer(*args, "--json", home=tmp_path / "a").stdout)
    assert doc["stop_reason"] == "max_cost"
    m = re.search(
        r"worst case \(\$([0-9.]+) or more\) does not fit the \$([0-9.]+) left of the \$0.05 "
        r"cap: ([0-9,]+) prompt tokens × \$([0-9.]+)/M \(the dearest input rate\) \+ "
        r"([0-9,]+) max_tokens \(the fewest a call is sent with\) × \$([0-9.]+)/M",
        doc["stop_detail"],
    )
    assert m, doc["stop_detail"]
    worst, left, prompt, in_rate, out, out_rate = m.groups()
    exact = (
        int(prompt.replace(",", "")) * Decimal(in_rate)
        + int(out.replace(",", "")) * Decimal(out_rate)
    ) / 1_000_000
    assert Decimal(worst) == round(exact, 6) and Decimal(worst) > Decimal(left)
    assert in_rate == "3.75" and out_rate == "15"  # Sonnet 4.5: a 5m cache write, output
    text = stayer(*args, home=tmp_path / "b").stdout
    assert "stopped: max_cost: the next call's worst case ($" in " ".join(text.split())


@needs_bwrap
def test_tests_that_pass_after_a_limit_was_reached_succeed_and_name_the_limit(tmp_path):
    """The oracle solves hello-file at step 1, where --max-steps 1 stops the agent before it
    submits: the verifier decides, so the run succeeded (exit 0) and stop_reason says why
    the agent stopped."""
    r = stayer(
        "run",
        str(EXAMPLES / "hello-file"),
        "--model",
        "sim:gpt-5",
        "--max-steps",
        "1",
        "--json",
        home=tmp_path / "home",
    )
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert (doc["status"], doc["reward"], doc["stop_reason"], doc["steps"]) == (
        "succeeded",
        1.0,
        "max_steps",
        1,
    )
    assert doc["verifier"]["outcome"] == "passed"


@needs_bwrap
def test_tests_failing_after_a_limit_was_reached_are_budget_exhausted(tmp_path):
    r = stayer(
        "run",
        str(EXAMPLES / "hello-file"),
        "--model",
        "sim:gpt-5",
        "--max-steps",
        "2",
        "--json",
        "--sim-policy",
        "synthetic:steps=5,obs_tokens=50,out_tokens=20",
        home=tmp_path / "home",
    )
    assert r.returncode == 3, r.stderr
    doc = json.loads(r.stdout)
    assert (doc["status"], doc["reward"], doc["stop_reason"]) == (
        "budget_exhausted",
        0.0,
        "max_steps",
    )
    assert doc["verifier"]["outcome"] == "failed"


@needs_bwrap
@pytest.mark.parametrize(
    ("test_sh", "reason"),
    [
        (
            "stayer-test-missing-tool --check && echo 1 > /logs/verifier/reward.txt || echo 0 > /logs/verifier/reward.txt\n",
            "needs commands this host lacks: stayer-test-missing-tool",
        ),
        ("echo 0 > /logs/verifier/reward.txt\nexit 127\n", "exited 127"),
        ("echo 'the verifier crashed' >&2\n", "neither reward.txt nor reward.json"),
    ],
)
def test_tests_that_cannot_run_here_are_an_infrastructure_error_not_a_failure(
    tmp_path, test_sh, reason
):
    task = tmp_path / "task"
    shutil.copytree(EXAMPLES / "hello-file", task)
    (task / "tests" / "test.sh").write_text("#!/bin/bash\n" + test_sh)
    r = stayer("run", str(task), "--model", "sim:gpt-5", "--json", home=tmp_path / "home")
    assert r.returncode == 1, r.stderr
    doc = json.loads(r.stdout)
    assert doc["status"] == "error" and doc["stop_reason"] == "submit"
    assert (
        doc["verifier"]["outcome"] == "infrastructure"
        and reason in doc["verifier"]["infrastructure"]
    )
    assert doc["error"] == doc["verifier"]["infrastructure"]


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["run", "{missing}", "--model", "sim:gpt-5"], "instruction.md"),
        (["run", "{bad_toml}", "--model", "sim:gpt-5"], "task.toml"),
        (["run", "{ok}", "--model", "bogus:gpt-5"], "--model"),
        (["run", "{ok}", "--model", "gpt-5"], "--model"),
        (["run", "{ok}", "--model", "sim:llama-3"], "sim:llama-3"),
        (["run", "{ok}", "--model", "anthropic:claude-sonnet-4-5"], "ANTHROPIC_API_KEY"),
        (["run", "{ok}", "--model", "openai:gpt-5"], "OPENAI_API_KEY"),
        (
            ["run", "{ok}", "--model", "sim:gpt-5", "--sim-policy", "synthetic:steps=-1"],
            "--sim-policy",
        ),
        (["run", "{ok}", "--model", "sim:gpt-5", "--max-steps", "-3"], "--max-steps"),
        (["run", "{ok}", "--model", "sim:gpt-5", "--max-cost", "-1"], "--max-cost"),
        (["run", "{ok}", "--model", "sim:gpt-5", "--max-cost", "ten"], "--max-cost"),
        (["run", "{ok}", "--model", "sim:gpt-5", "--sandbox", "docker"], "docker"),
        (["run", "{ok}", "--model", "sim:gpt-5", "--memory-mb", "0"], "--memory-mb"),
        (["run", "{ok}", "--model", "sim:gpt-5", "--command-timeout", "-1"], "--command-timeout"),
        (
            [
                "estimate",
                "--steps",
                "0",
                "--new-tokens",
                "1",
                "--output-tokens",
                "1",
                "--price-miss",
                "1",
                "--price-hit",
                "1",
                "--price-out",
                "1",
            ],
            "--steps",
        ),
        (
            [
                "estimate",
                "--steps",
                "3",
                "--new-tokens",
                "1",
                "--output-tokens",
                "1",
                "--price-miss",
                "1",
            ],
            "--price-hit",
        ),
    ],
)
def test_bad_input_is_one_line_exit_2_and_writes_nothing(tmp_path, args, needle):
    home = tmp_path / "home"
    ok = EXAMPLES / "hello-file"
    bad_toml = tmp_path / "bad"
    shutil.copytree(ok, bad_toml)
    (bad_toml / "task.toml").write_text("[agent\n")
    missing = tmp_path / "missing"
    shutil.copytree(ok, missing)
    (missing / "instruction.md").unlink()
    subst = {"{ok}": str(ok), "{bad_toml}": str(bad_toml), "{missing}": str(missing)}
    r = stayer(*[subst.get(a, a) for a in args], "--json", home=home)
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert r.stdout == ""
    lines = [line for line in r.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and needle in lines[0], r.stderr
    assert not home.exists()


def test_estimate_command_published_example(tmp_path):
    r = stayer(
        "estimate",
        "--steps",
        "30",
        "--new-tokens",
        "20000",
        "--output-tokens",
        "2000",
        "--price-miss",
        "10",
        "--price-hit",
        "1",
        "--price-out",
        "50",
        "--json",
        home=tmp_path / "h",
    )
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert Decimal(doc["with_cache"]["total"]) == Decimal("17.7")
    assert Decimal(doc["without_cache"]["total"]) == Decimal("96.0")
    assert len(doc["steps"]) == 30


def test_estimate_with_model_prices_long_context_steps_at_their_tier(tmp_path):
    args = [
        "estimate",
        "--new-tokens",
        "50000",
        "--output-tokens",
        "1000",
        "--model",
        "claude-sonnet-4-5",
        "--json",
    ]
    short = json.loads(stayer(*args, "--steps", "4", home=tmp_path / "h").stdout)
    long = json.loads(stayer(*args, "--steps", "5", home=tmp_path / "h").stdout)
    # Step 5 has 250K tokens of context: past the 200K threshold every rate doubles or more.
    step4 = Decimal(short["steps"][3]["without_cache"])
    step5 = Decimal(long["steps"][4]["without_cache"])
    assert step5 > step4 * 5 / 4 * Decimal("1.9")


@needs_bwrap
def test_per_run_sandbox_limits_apply(tmp_path):
    """A run's own --storage-mb holds the agent's commands (the synthetic workload's log grows
    past it), where the task sets none."""
    home = tmp_path / "home"
    r = stayer(
        "run",
        str(EXAMPLES / "hello-file"),
        "--model",
        "sim:gpt-5",
        "--json",
        "--storage-mb",
        "1",
        "--sim-policy",
        "synthetic:steps=4,obs_tokens=200000,out_tokens=50",
        "--policy",
        "none",
        home=home,
    )
    doc = json.loads(r.stdout)
    log = Path(doc["run_dir"]) / "workspace" / "synthetic.log"
    assert log.stat().st_size <= 2 * 1024 * 1024


@needs_bwrap
def test_ctrl_c_names_the_resume_that_continues_the_run(tmp_path):
    """Before: exit 130 and nothing said. Ctrl-C once the first step is done."""
    import signal

    home = tmp_path / "home"
    env = {k: v for k, v in os.environ.items() if not k.endswith("_API_KEY")}
    env["STAYER_HOME"] = str(home)
    args = ["--sim-policy", "synthetic:steps=400", "--max-steps", "500", "--sim-latency", "0.2"]
    p = subprocess.Popen(
        [sys.executable, "-m", "stayer.cli", "run", str(EXAMPLES / "hello-file")]
        + ["--model", "sim:claude-sonnet-4-5", "--run-id", "cc1", *args],
        stderr=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        text=True,
        env=env,
        cwd=tmp_path,
        preexec_fn=ctrl_c_as_at_a_terminal,
    )
    assert p.stderr is not None
    for line in p.stderr:
        if line.startswith("step"):
            break
    p.send_signal(signal.SIGINT)
    rest = p.stderr.read()
    assert p.wait(timeout=120) == 130
    assert "interrupted: run cc1 stopped; `stayer resume cc1` continues it" in rest
    assert "Traceback" not in rest


def test_the_inbox_journals_people_s_messages_as_json_and_reads_them_back() -> None:
    from stayer.run import Inbox, InboxMessage

    class Journal:  # what the reader needs of a RunJournal: values kept as JSON
        def __init__(self) -> None:
            self.kept: list[str] = []

        def read_outside(self, compute):  # type: ignore[no-untyped-def]
            self.kept.append(json.dumps(compute()))
            return json.loads(self.kept[-1])

    sent = [
        InboxMessage(n=1, content="use printf", created_at="t1"),
        InboxMessage(n=2, content="x"),
    ]
    asked: list[int] = []

    def fetch(after: int) -> list[InboxMessage]:
        asked.append(after)
        return [m for m in sent if m.n > after]

    journal = Journal()
    read = Inbox(fetch).reader(journal)  # type: ignore[arg-type]
    assert [(m.content, m.kind) for m in read()] == [("use printf", "person"), ("x", "person")]
    assert read() == [] and asked == [0, 2]
    assert json.loads(journal.kept[0])[0] == {"n": 1, "content": "use printf", "created_at": "t1"}

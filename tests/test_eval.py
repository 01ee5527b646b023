"""`stayer eval` end to end, through the real command line, on the provider simulator."""

from __future__ import annotations

import json
from decimal import Decimal
from pathlib import Path

from test_eval_fixtures import EXAMPLES, FIXTURES, GOOD_TEST, needs_bwrap, stayer, write_task

MODELS = "sim:claude-sonnet-4-5,sim:gpt-5"


def runs(home: Path) -> set[str]:
    d = home / "runs"
    return {p.name for p in d.iterdir()} if d.is_dir() else set()


@needs_bwrap
def test_examples_two_models_three_epochs_resumable(tmp_path):
    home, out = tmp_path / "home", tmp_path / "out"
    args = ("eval", str(EXAMPLES), "--model", MODELS, "--epochs", "3", "--json", "--out", str(out))
    r = stayer(*args, home=home)
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert [c["model"] for c in doc["configs"]] == MODELS.split(",")
    for c in doc["configs"]:
        assert (c["trials"], c["successes"], c["success_rate"], c["infra_errors"]) == (
            12,
            12,
            1.0,
            0,
        )
        assert 0.6 < c["ci_low"] < 1.0 and c["ci_high"] == 1.0
        assert c["pass_hat_k"] == {"1": 1.0, "2": 1.0, "3": 1.0} and c["pass_at_k"]["3"] == 1.0
        assert Decimal(c["mean_cost_usd"]) > 0 and c["cost_per_success_usd"] == c["mean_cost_usd"]
        assert c["policy"] and c["mean_tokens"] > 0
    [cmp] = doc["comparisons"]
    assert (
        cmp["significant"] is False
        and cmp["success_diff"] == 0.0
        and "not significant" in cmp["verdict"]
    )
    assert Decimal(cmp["cost_diff_usd"]) != 0  # same work, different prices
    cheapest = min(doc["configs"], key=lambda c: Decimal(c["mean_cost_usd"]))
    assert [p["model"] for p in doc["pareto"]] == [cheapest["model"]]
    assert len(doc["tasks"]) == 4 and doc["trials_total"] == 24 and doc["trials_reused"] == 0
    # Each finished trial is one record; the page is self-contained.
    trials = sorted((out / "trials").rglob("*.json"))
    assert len(trials) == 24
    record = json.loads(trials[0].read_text())
    assert record["error_class"] is None and record["reward"] == 1.0 and record["wall_s"] > 0
    assert Decimal(record["cost_usd"]) > 0 and record["usage"]["input_tokens"] > 0
    page = (out / "report.html").read_text()
    assert page.count("<svg") == 2 and "src=" not in page
    # every trial links to a page of its run: transcript, per-step plots, ledger
    run_pages = sorted((out / "runs").glob("*.html"))
    assert len(run_pages) == 24 and all(f"href='runs/{p.name}'" in page for p in run_pages)
    assert "<h2>Transcript</h2>" in run_pages[0].read_text()
    assert json.loads((out / "eval.json").read_text())["configs"] == doc["configs"]
    assert "24/24" in r.stderr  # live progress on stderr

    # Resume: nothing runs again ...
    before = runs(home)
    r = stayer(*args, home=home)
    assert r.returncode == 0 and json.loads(r.stdout)["trials_reused"] == 24
    assert runs(home) == before
    # ... except a trial whose record is gone.
    trials[0].unlink()
    r = stayer(*args, home=home)
    again = json.loads(r.stdout)
    assert again["trials_reused"] == 23 and len(runs(home) - before) == 1
    assert again["configs"][0]["successes"] == 12


@needs_bwrap
def test_error_classes_and_infrastructure_errors_apart(tmp_path):
    suite = tmp_path / "suite"
    write_task(suite, "good")
    write_task(suite, "oracle-fails", **{k: v for k, v in FIXTURES["oracle-fails"].items()})
    write_task(suite, "no-reward", test="echo 'the verifier crashed' >&2\nexit 3\n")
    home, out = tmp_path / "home", tmp_path / "out"
    args = (
        "eval",
        str(suite),
        "--model",
        "sim:gpt-5",
        "--json",
        "--out",
        str(out),
        "--no-preflight",
    )
    r = stayer(*args, home=home)
    assert r.returncode == 1, r.stderr  # an evaluation with infrastructure errors is incomplete
    doc = json.loads(r.stdout)
    [c] = doc["configs"]
    assert (c["trials"], c["successes"], c["success_rate"], c["infra_errors"]) == (2, 1, 0.5, 1)
    assert c["error_classes"] == {"agent_failure": 1, "limit_reached": 0, "infrastructure": 1}
    cells = {t["task"]: next(iter(t["results"].values())) for t in doc["tasks"]}
    assert cells["no-reward"] == {"successes": 0, "trials": 0, "infra_errors": 1}
    # A resumed evaluation retries the infrastructure error and keeps the rest.
    r = stayer(*args, home=home)
    assert json.loads(r.stdout)["trials_reused"] == 2

    r = stayer(
        "eval",
        str(suite / "good"),
        "--model",
        "sim:gpt-5",
        "--max-steps",
        "2",
        "--json",
        "--sim-policy",
        "synthetic:steps=5,obs_tokens=50,out_tokens=20",
        home=home,
    )
    assert r.returncode == 0
    [c] = json.loads(r.stdout)["configs"]
    assert c["error_classes"]["limit_reached"] == 1 and c["successes"] == 0 and c["trials"] == 1


@needs_bwrap
def test_a_trial_is_scored_by_its_tests_not_by_why_the_agent_stopped(tmp_path):
    """The oracle solves the task at step 1 and --max-steps 1 stops it before it submits:
    the tests pass, so the trial is a success."""
    suite = tmp_path / "suite"
    write_task(suite, "good")
    out = tmp_path / "out"
    r = stayer(
        "eval",
        str(suite),
        "--model",
        "sim:gpt-5",
        "--max-steps",
        "1",
        "--json",
        "--out",
        str(out),
        home=tmp_path / "home",
    )
    assert r.returncode == 0, r.stderr
    [c] = json.loads(r.stdout)["configs"]
    assert (c["trials"], c["successes"], c["success_rate"]) == (1, 1, 1.0)
    assert c["error_classes"] == {"agent_failure": 0, "limit_reached": 0, "infrastructure": 0}
    [record] = [json.loads(p.read_text()) for p in (out / "trials").rglob("*.json")]
    assert (record["status"], record["stop_reason"], record["error_class"]) == (
        "succeeded",
        "max_steps",
        None,
    )


@needs_bwrap
def test_preflight_refuses_tasks_whose_tests_cannot_run_here_and_force_counts_them_apart(tmp_path):
    suite = tmp_path / "suite"
    write_task(suite, "good")
    write_task(
        suite, "needs-tool", test="stayer-fixture-missing-tool --check || exit 1\n" + GOOD_TEST
    )
    home, out = tmp_path / "home", tmp_path / "out"
    r = stayer("eval", str(suite), "--model", "sim:gpt-5", "--json", "--out", str(out), home=home)
    assert r.returncode == 2 and r.stdout == ""
    [line] = [line for line in r.stderr.splitlines() if line.startswith("error:")]
    assert (
        "needs-tool: environment" in line
        and "stayer-fixture-missing-tool" in line
        and "--force" in line
    )
    assert not out.exists() and not runs(home)

    r = stayer(
        "eval",
        str(suite),
        "--model",
        "sim:gpt-5",
        "--json",
        "--out",
        str(out),
        "--force",
        home=home,
    )
    assert r.returncode == 1, r.stderr  # incomplete: one task could not be judged
    doc = json.loads(r.stdout)
    [c] = doc["configs"]
    assert (c["trials"], c["successes"], c["success_rate"], c["infra_errors"]) == (1, 1, 1.0, 1)
    assert [f["task"] for f in doc["preflight"]] == ["needs-tool"]
    [record] = [json.loads(p.read_text()) for p in (out / "trials").rglob("needs-tool.*.json")]
    assert (
        record["error_class"] == "infrastructure" and record["verifier_outcome"] == "infrastructure"
    )
    assert "stayer-fixture-missing-tool" in record["error"]
    [infra] = doc["infra_trials"]
    assert infra["task"] == "needs-tool" and "stayer-fixture-missing-tool" in infra["reason"]

    # Without --json, what people read says it too: as it happens, and after the table with
    # what to do next (the rerun runs only the trial that could not be judged).
    r = stayer("eval", str(suite), "--model", "sim:gpt-5", "--out", str(out), "--force", home=home)
    assert r.returncode == 1, r.stderr
    said = " ".join(r.stdout.split())  # the reason may wrap
    assert "1 trial could not be judged (not scored):" in said
    assert "needs-tool · " in said and "stayer-fixture-missing-tool" in said
    assert f"rerun with the same --out {out} to run only these again" in said
    live = " ".join(r.stderr.split())
    assert "infra: needs-tool · " in live and "stayer-fixture-missing-tool" in live


@needs_bwrap
def test_preflight_refuses_a_task_that_passes_untouched(tmp_path):
    suite = tmp_path / "suite"
    write_task(suite, "nop-passes", **FIXTURES["nop-passes"])
    r = stayer("eval", str(suite), "--model", "sim:gpt-5", "--json", home=tmp_path / "home")
    assert r.returncode == 2 and "nop-passes: nop_passes" in r.stderr
    r = stayer(
        "eval",
        str(suite),
        "--model",
        "sim:gpt-5",
        "--json",
        "--no-preflight",
        home=tmp_path / "home",
    )
    assert r.returncode == 0, r.stderr


def test_invalid_suite_is_bad_input_one_line_per_problem_nothing_written(tmp_path):
    suite = tmp_path / "suite"
    write_task(suite, "good")
    write_task(suite, "no-tests", test=None)
    (write_task(suite, "bad-toml") / "task.toml").write_text("[agent\n")
    home, out = tmp_path / "home", tmp_path / "out"
    r = stayer("eval", str(suite), "--model", "sim:gpt-5", "--out", str(out), "--json", home=home)
    assert r.returncode == 2 and r.stdout == ""
    lines = [line for line in r.stderr.splitlines() if line.startswith("error:")]
    assert len(lines) == 2
    assert any("no-tests/tests/test.sh: missing" in line for line in lines)
    assert any("bad-toml/task.toml: malformed TOML" in line for line in lines)
    assert not out.exists() and not runs(home)


def test_unrunnable_configuration_is_bad_input_before_any_trial(tmp_path):
    suite = tmp_path / "suite"
    write_task(suite, "no-solution", solve=None)
    home, out = tmp_path / "home", tmp_path / "out"
    r = stayer("eval", str(suite), "--model", "sim:gpt-5", "--out", str(out), home=home)
    assert r.returncode == 2 and "no-solution" in r.stderr and "solve.sh" in r.stderr
    assert not out.exists() and not runs(home)
    for flags, named in [
        (("--epochs", "0"), "--epochs"),
        (("--concurrency", "0"), "--concurrency"),
        (("--model", ","), "--model"),
    ]:
        r = stayer("eval", str(EXAMPLES), "--model", "sim:gpt-5", *flags, home=home)
        assert r.returncode == 2 and named in r.stderr


@needs_bwrap
def test_policies_are_configurations(tmp_path):
    home = tmp_path / "home"
    r = stayer(
        "eval",
        str(EXAMPLES / "hello-file"),
        "--model",
        "sim:gpt-5",
        "--policy",
        "none,mask",
        "--json",
        home=home,
    )
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert [(c["model"], c["policy"]) for c in doc["configs"]] == [
        ("sim:gpt-5", "none"),
        ("sim:gpt-5", "mask"),
    ]
    assert len(doc["comparisons"]) == 1
    r = stayer(
        "eval", str(EXAMPLES), "--model", "sim:gpt-5", "--policy", "no-such-policy", home=home
    )
    assert r.returncode == 2 and "--policy" in r.stderr


@needs_bwrap
def test_a_trial_past_the_task_agent_timeout_is_stopped_and_counts_as_limit_reached(
    tmp_path, monkeypatch
):
    import asyncio

    from stayer.eval import runner
    from stayer.eval.task import load_task
    from stayer.pricing import PriceBook

    monkeypatch.setenv("STAYER_HOME", str(tmp_path / "home"))
    task = load_task(
        write_task(
            tmp_path / "suite",
            "slow",
            solve="#!/bin/bash\nsleep 30\n",
            toml="[agent]\ntimeout_sec = 1.0\n\n[verifier]\ntimeout_sec = 1.0\n",
        )
    )
    [trial] = runner.plan_trials([task], [runner.EvalConfig("sim:gpt-5")], epochs=1)
    record = asyncio.run(runner.run_trial(trial, PriceBook.load()))
    assert (record["error_class"], record["stop_reason"]) == ("limit_reached", "agent_timeout")
    # Its run and what it spent are kept: step 1's model call was billed.
    assert record["run_id"] and record["steps"] == 1 and Decimal(record["cost_usd"]) > 0

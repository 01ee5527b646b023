"""``stayer.run_task`` and ``stayer.eval`` do what ``stayer run`` and ``stayer eval`` do: the
same document (typed), the same files in ``$STAYER_HOME``, the same ``stayer report``; bad
input raises ``ConfigError`` before anything is written."""

from __future__ import annotations

import json
from decimal import Decimal
from pathlib import Path

import pytest
from test_eval_fixtures import EXAMPLES, needs_bwrap, stayer, write_task

import stayer as lib

HELLO = EXAMPLES / "hello-file"
SIM = "sim:claude-sonnet-4-5"


@needs_bwrap
def test_run_task_is_stayer_run_from_code(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    home = tmp_path / "home"
    monkeypatch.setenv("STAYER_HOME", str(home))
    steps: list[object] = []
    outcome = lib.run_task(HELLO, model=SIM, max_cost="0.5", run_id="lib-1", on_step=steps.append)
    assert isinstance(outcome, lib.RunOutcome) and outcome.succeeded and outcome.reward == 1.0
    doc = outcome.document
    assert json.loads((outcome.run_dir / "result.json").read_text()) == doc
    assert outcome.cost_usd == Decimal(doc["cost_usd"]) > 0 and outcome.ledger == doc["ledger"]
    assert len(steps) == outcome.steps == len(outcome.ledger)
    # the command, on the same task and model: the same work at the same price
    r = stayer("run", str(HELLO), "--model", SIM, "--max-cost", "0.5", "--json", home=home)
    cli = json.loads(r.stdout)
    assert r.returncode == 0 and cli.keys() == doc.keys()
    for key in ("status", "reward", "steps", "usage", "cost_usd", "stop_reason"):
        assert cli[key] == doc[key], key
    report = stayer("report", "lib-1", "--json", home=home)
    assert json.loads(report.stdout) == outcome.report()


@needs_bwrap
def test_eval_is_stayer_eval_from_code(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    home, out = tmp_path / "home", tmp_path / "out"
    monkeypatch.setenv("STAYER_HOME", str(home))
    models = [SIM, "sim:gpt-5"]
    outcome = lib.eval(HELLO, models=models, out=out)
    assert isinstance(outcome, lib.EvalOutcome) and outcome.trials_total == 2
    assert [(c["model"], c["successes"]) for c in outcome.configs] == [(m, 1) for m in models]
    written = {**json.loads((out / "eval.json").read_text()), "report": str(out / "report.html")}
    assert written == outcome.document and (out / "report.html").is_file()
    again = lib.eval(HELLO, models=models, out=out)  # a second call reuses every trial
    assert again.document["trials_reused"] == 2 and again.configs == outcome.configs
    r = stayer("eval", str(HELLO), "--model", ",".join(models), "--json", home=home)
    cli = json.loads(r.stdout)
    assert r.returncode == 0 and set(cli) <= set(outcome.document)
    for mine, theirs in zip(outcome.configs, cli["configs"], strict=True):
        for key in ("model", "policy", "successes", "mean_cost_usd", "mean_tokens"):
            assert mine[key] == theirs[key], key


def test_bad_input_raises_before_anything_is_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    home = tmp_path / "home"
    monkeypatch.setenv("STAYER_HOME", str(home))
    with pytest.raises(lib.ConfigError, match="--model: missing"):
        lib.run_task(HELLO)
    with pytest.raises(lib.ConfigError, match="max_cost"):
        lib.run_task(HELLO, model=SIM, max_cost="lots")
    with pytest.raises(lib.ConfigError, match="max-steps|max_steps"):
        lib.run_task(HELLO, model=SIM, max_steps=0)
    with pytest.raises(lib.ConfigError, match="listed twice"):
        lib.eval(HELLO, models=[SIM, SIM])
    with pytest.raises(lib.ConfigError, match="at least one model"):
        lib.eval(HELLO, models=[])
    with pytest.raises(lib.ConfigError, match="nowhere"):
        lib.eval(tmp_path / "nowhere", models=[SIM], out=tmp_path / "out")
    assert not home.exists() and not (tmp_path / "out").exists()


def test_eval_refuses_an_out_it_cannot_write_before_any_trial(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # As ``stayer eval --out FILE`` does (exit 2): refused up front, not after a trial ran
    # and its record could not be kept.
    home = tmp_path / "home"
    monkeypatch.setenv("STAYER_HOME", str(home))
    taken = tmp_path / "taken"
    taken.write_text("mine\n")
    with pytest.raises(lib.ConfigError, match=f"^out {taken}: exists and is not a directory"):
        lib.eval(HELLO, models=[SIM], out=taken)
    assert taken.read_text() == "mine\n" and not home.exists()


def test_a_task_or_config_that_is_no_file_is_refused_naming_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    home = tmp_path / "home"
    monkeypatch.setenv("STAYER_HOME", str(home))
    (tmp_path / "file").write_text("x\n")
    (tmp_path / "dangling").symlink_to(tmp_path / "nowhere")
    (tmp_path / "to-file").symlink_to(tmp_path / "file")
    for name in ("file", "dangling", "to-file", "nowhere"):
        task = tmp_path / name
        with pytest.raises(lib.ConfigError, match=f"^{task}: not a task directory"):
            lib.run_task(task, model=SIM)
        with pytest.raises(lib.ConfigError, match=f"^{task}: not a directory"):
            lib.eval(task, models=[SIM], out=tmp_path / "out")
    # A device or a FIFO as the configuration: refused, never read (/dev/zero has no end,
    # a FIFO waits for a writer).
    with pytest.raises(lib.ConfigError, match="^--config /dev/null: not a regular file"):
        lib.run_task(HELLO, model=SIM, config="/dev/null")
    with pytest.raises(lib.ConfigError, match=f"^--config {tmp_path}: not a regular file"):
        lib.run_task(HELLO, model=SIM, config=tmp_path)
    assert not home.exists() and not (tmp_path / "out").exists()


def test_a_directory_of_no_task_beside_the_tasks_is_not_a_task(tmp_path: Path) -> None:
    from stayer.eval.suite import scan_suite

    write_task(tmp_path, "good")
    (tmp_path / "python").mkdir()  # as examples/python sits beside the example tasks
    (tmp_path / "python" / "example.py").write_text("print('hi')\n")
    (tmp_path / "half").mkdir()
    (tmp_path / "half" / "task.toml").write_text("")  # a task, broken: still reported
    suite = scan_suite(tmp_path)
    assert [t.name for t in suite.tasks] == ["good"]
    assert [i.path.name for i in suite.invalid] == ["half"]
    examples = scan_suite(EXAMPLES)
    assert examples.invalid == [] and len(examples.tasks) == 4


def test_a_run_outcome_is_read_from_the_run_s_report() -> None:
    from stayer.ledger import LedgerEntry
    from stayer.records import from_json, to_json
    from stayer.run import RunReport

    made = {"step": 1, "model": "m", "usage": {"input_tokens": 3}, "cost_usd": "0.25"}
    entry = to_json(from_json(made, LedgerEntry))  # as result.json has it: every field
    report = RunReport(
        run_id="r", status="succeeded", cost_usd="0.25", run_dir="/r", ledger=[entry]
    )
    outcome = lib.RunOutcome.of(report)
    assert outcome.succeeded and outcome.cost_usd == Decimal("0.25")
    assert outcome.ledger[0].cost.total == Decimal("0.25") and outcome.ledger == [entry]
    assert outcome.document == report.to_json() and outcome.run_dir == Path("/r")


def test_a_run_with_an_unpriced_call_has_an_unknown_cost_not_an_error() -> None:
    """A run's total is "unknown" when a call's price is: the outcome says None (unknown),
    as ``RunResult.cost_usd`` does, rather than failing to read it after the run."""
    from stayer.run import RunReport

    report = RunReport(run_id="r", status="succeeded", cost_usd="unknown", run_dir="/r")
    outcome = lib.RunOutcome.of(report)
    assert outcome.cost_usd is None and outcome.document["cost_usd"] == "unknown"

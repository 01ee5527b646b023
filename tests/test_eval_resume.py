"""Every dollar an evaluation spends is in its totals: a killed evaluation's trials in flight
are continued through their journals (same run, no model call paid twice) and counted once;
a trial that crashes keeps its run and cost; a retried trial keeps its earlier attempt's."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from decimal import Decimal
from pathlib import Path

from test_eval_fixtures import needs_bwrap, stayer, write_task

from stayer.journal import open_store

LONG_TOML = "[agent]\ntimeout_sec = 600.0\n\n[verifier]\ntimeout_sec = 60.0\n"
SYNTHETIC = (
    "--sim-policy",
    "synthetic:steps=20,obs_tokens=50,out_tokens=20",
    "--sim-latency",
    "0.1",
)


def journal(home: Path):
    return open_store(home, "", create=False)


@needs_bwrap
def test_a_killed_eval_resumes_its_trial_in_flight_through_the_journal(tmp_path):
    task = write_task(tmp_path / "suite", "long", toml=LONG_TOML)
    home, out = tmp_path / "home", tmp_path / "out"
    args = ("eval", str(task), "--model", "sim:gpt-5", *SYNTHETIC, "--json", "--out", str(out))
    env = {k: v for k, v in os.environ.items() if not k.endswith("_API_KEY") and k != "STAYER_DB"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "stayer.cli", *args],
        env={**env, "STAYER_HOME": str(home)},
        cwd=tmp_path,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    run_id, deadline = None, time.monotonic() + 120
    while run_id is None and time.monotonic() < deadline and proc.poll() is None:
        store = journal(home)
        if store is not None:
            run_id = next((r.id for r in store.runs() if r.steps >= 3), None)
            store.close()
        time.sleep(0.05)
    assert run_id is not None, "the trial's run never reached step 3"
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert not (out / "eval.json").exists()
    [listed] = json.loads(stayer("runs", "--json", home=home).stdout)["runs"]
    assert (listed["id"], listed["status"]) == (run_id, "interrupted")

    r = stayer(*args, home=home)
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    [record] = [json.loads(p.read_text()) for p in (out / "trials").rglob("*.json")]
    assert not list((out / "trials").rglob("*.run"))
    # The same run, continued: no other run was started, and no model call was made twice.
    assert (record["run_id"], record["resumed"], record["steps"]) == (run_id, True, 21)
    store = journal(home)
    try:
        assert [r.id for r in store.runs()] == [run_id]
        events = store.events(run_id)
    finally:
        store.close()
    finished = Counter(e.data["n"] for e in events if e.kind == "model_finished")
    assert sorted(finished) == list(range(21)) and set(finished.values()) == {1}
    assert sum(1 for e in events if e.kind == "resumed") == 1
    # Counted once, with everything the run spent (a call lost in flight at the kill included).
    report = json.loads(stayer("report", run_id, "--json", home=home).stdout)
    assert record["cost_usd"] == report["totals"]["cost_usd"]
    assert (
        Decimal(doc["configs"][0]["total_cost_usd"]) == Decimal(record["cost_usd"])
        and doc["trials_total"] == 1
    )


@needs_bwrap
def test_a_crashed_trial_keeps_its_run_and_cost_and_its_retry_keeps_both_attempts(
    tmp_path, monkeypatch
):
    from stayer import run as run_module
    from stayer.eval import runner
    from stayer.eval.summary import summarise
    from stayer.eval.task import load_task
    from stayer.pricing import PriceBook

    monkeypatch.setenv("STAYER_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("STAYER_DB", raising=False)
    task = load_task(write_task(tmp_path / "suite", "good", toml=LONG_TOML))
    config = runner.EvalConfig("sim:gpt-5")
    trials = runner.plan_trials([task], [config], epochs=1)
    store = runner.TrialStore(tmp_path / "out")

    async def crash(*args, **kwargs):
        raise RuntimeError("the verifier's machine went away")

    with monkeypatch.context() as m:  # the agent's work is done and paid for; then the crash
        m.setattr(run_module, "verify", crash)
        [first] = asyncio.run(
            runner.run_trials(trials, concurrency=1, prices=PriceBook.load(), store=store)
        )
    assert first["error_class"] == "infrastructure" and "went away" in first["error"]
    assert first["run_id"] and first["steps"] == 2 and Decimal(first["cost_usd"]) > 0

    [second] = asyncio.run(
        runner.run_trials(trials, concurrency=1, prices=PriceBook.load(), store=store)
    )
    assert second["status"] == "succeeded" and second["run_id"] != first["run_id"]
    [earlier] = second["earlier_attempts"]
    assert (earlier["run_id"], earlier["cost_usd"]) == (first["run_id"], first["cost_usd"])
    [summary] = summarise([second], [config], 1)["configs"]
    total = Decimal(first["cost_usd"]) + Decimal(second["cost_usd"])
    assert Decimal(summary["total_cost_usd"]) == total and Decimal(
        summary["mean_cost_usd"]
    ) == Decimal(second["cost_usd"])

"""The task's agent time limit (``[agent] timeout_sec``), enforced in the one place that runs
a task, so that `stayer run`, `resume` and every eval trial stop at it alike: the command in
flight is killed with its sandbox, and what the run spent stays on its ledger."""

from __future__ import annotations

import json
import os
import uuid
from decimal import Decimal
from pathlib import Path

from test_eval_fixtures import needs_bwrap, stayer, write_task

SLOW_TOML = "[agent]\ntimeout_sec = 2.0\n\n[verifier]\ntimeout_sec = 30.0\n"


def slow_task(tmp_path: Path) -> tuple[Path, str]:
    """A task whose oracle sleeps far past the agent's limit before writing its answer; the
    sleep's argument is unique, so a surviving sleep can be found by its command line."""
    seconds = f"300.{uuid.uuid4().int % 10**9:09d}"
    solve = f"#!/bin/bash\nsleep {seconds}\nprintf 'done\\n' > /app/out.txt\n"
    return write_task(tmp_path / "suite", "slow", solve=solve, toml=SLOW_TOML), seconds


def processes_running(needle: str) -> list[int]:
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if needle.encode() in f.read():
                    found.append(int(pid))
        except OSError:
            continue
    return found


@needs_bwrap
def test_run_stops_at_the_task_agent_timeout_and_keeps_what_it_spent(tmp_path):
    task, seconds = slow_task(tmp_path)
    home = tmp_path / "home"
    r = stayer("run", str(task), "--model", "sim:gpt-5", "--json", home=home)
    assert r.returncode == 3, r.stderr  # a limit was reached
    doc = json.loads(r.stdout)
    assert (doc["status"], doc["stop_reason"]) == ("budget_exhausted", "agent_timeout")
    assert (
        "time limit of 2 s" in doc["summary"] and doc["breakers"][-1]["reason"] == "agent_timeout"
    )
    # The sleep was killed, not waited for: nothing after it ran, and it is gone.
    assert not (Path(doc["run_dir"]) / "workspace" / "out.txt").exists()
    assert processes_running(f"sleep {seconds}") == []
    assert doc["reward"] == 0.0  # the verifier judged the unfinished work
    # Step 1's model call was answered and billed before the limit cut the step short.
    [entry] = doc["ledger"]
    assert entry["kind"] == "cut_short" and entry["tool_calls"][0]["name"] == "bash"
    assert doc["steps"] == 1 and Decimal(doc["cost_usd"]) == Decimal(entry["cost_usd"]) > 0
    assert doc["usage"]["input_tokens"] == entry["usage"]["input_tokens"] > 0
    report = json.loads(stayer("report", doc["run_id"], "--json", home=home).stdout)
    assert (
        report["status"] == "budget_exhausted" and report["totals"]["cost_usd"] == doc["cost_usd"]
    )
    assert report["ledger"] == doc["ledger"]
    [row] = json.loads(stayer("runs", "--json", home=home).stdout)["runs"]
    assert (row["status"], row["steps"], row["cost_usd"]) == (
        "budget_exhausted",
        1,
        doc["cost_usd"],
    )


@needs_bwrap
def test_an_eval_trial_stopped_by_the_agent_timeout_keeps_its_run_and_cost(tmp_path):
    task, seconds = slow_task(tmp_path)
    home, out = tmp_path / "home", tmp_path / "out"
    r = stayer("eval", str(task), "--model", "sim:gpt-5", "--json", "--out", str(out), home=home)
    assert r.returncode == 0, (
        r.stderr
    )  # a limit reached is a judged trial, not an infrastructure error
    [config] = json.loads(r.stdout)["configs"]
    [record] = [json.loads(p.read_text()) for p in (out / "trials").rglob("*.json")]
    assert (record["error_class"], record["stop_reason"]) == ("limit_reached", "agent_timeout")
    assert record["run_id"] and record["steps"] == 1 and Decimal(record["cost_usd"]) > 0
    report = json.loads(stayer("report", record["run_id"], "--json", home=home).stdout)
    assert (
        Decimal(report["totals"]["cost_usd"])
        == Decimal(record["cost_usd"])
        == Decimal(config["total_cost_usd"])
    )
    assert processes_running(f"sleep {seconds}") == []


@needs_bwrap
def test_a_team_stopped_by_the_agent_timeout_keeps_the_step_its_thread_was_in(tmp_path):
    # A team's threads journal their own model calls: the step the limit cut short is the
    # thread's, billed and on the ledger under the thread's name, as a single agent's is.
    task, seconds = slow_task(tmp_path)
    home = tmp_path / "home"
    team = tmp_path / "team.toml"
    team.write_text('entry = "lead"\n[agents.lead]\nmodel = "sim:gpt-5"\n')
    r = stayer("run", str(task), "--team", str(team), "--json", home=home)
    assert r.returncode == 3, r.stderr
    doc = json.loads(r.stdout)
    assert (doc["status"], doc["stop_reason"]) == ("budget_exhausted", "agent_timeout")
    assert processes_running(f"sleep {seconds}") == []
    [entry] = doc["ledger"]
    assert (entry["kind"], entry["agent"], entry["step"]) == ("cut_short", "lead", 1)
    assert doc["steps"] == 1 and Decimal(doc["cost_usd"]) == Decimal(entry["cost_usd"]) > 0
    assert doc["usage"]["input_tokens"] == entry["usage"]["input_tokens"] > 0
    assert [a["agent"] for a in doc["agents"]] == ["lead"]
    report = json.loads(stayer("report", doc["run_id"], "--json", home=home).stdout)
    assert report["totals"]["cost_usd"] == doc["cost_usd"] and report["ledger"] == doc["ledger"]
    [row] = json.loads(stayer("runs", "--json", home=home).stdout)["runs"]
    assert (row["status"], row["steps"], row["cost_usd"]) == (
        "budget_exhausted",
        1,
        doc["cost_usd"],
    )

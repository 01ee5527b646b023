"""Rollouts, their exports and the scheduler: real runs on the provider simulator, real
sandboxes, the real command line. (Ray: tests/test_scale_ray.py.)"""

from __future__ import annotations

import asyncio
import json
import statistics
from decimal import Decimal
from pathlib import Path

import msgspec
import pytest
from test_eval_fixtures import EXAMPLES, needs_bwrap, stayer

from stayer.eval.runner import EvalConfig, Trial
from stayer.eval.task import load_task
from stayer.pricing import PriceBook
from stayer.scale.exports import ATIF_VERSION, atif, normalised_rewards, segments
from stayer.scale.rollouts import rollout_trial
from stayer.scale.scheduler import Job, Scheduler, expected_remaining, straggler_action
from stayer.tokens import TiktokenCounter

MODEL = "sim:claude-sonnet-4-5"
D = Decimal


def rollouts(tmp_path: Path, *args: str, fmt: str = "jsonl"):
    out = tmp_path / "ro"
    r = stayer(
        "rollouts",
        str(EXAMPLES),
        "--model",
        MODEL,
        "--out",
        str(out),
        "--format",
        fmt,
        "--json",
        *args,
        home=tmp_path / "home",
    )
    return r, out


def records(out: Path) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted((out / "trials").rglob("*.json"))]


# --- the ATIF v1.7 RFC's required fields (Harbor RFC 0001) ----------------------------


def check_atif(doc: dict) -> None:
    """Raise AssertionError where ``doc`` breaks a rule of ATIF v1.7 that the RFC marks
    required: root schema_version, agent{name, version}, steps (non-empty, step_id 1..n in
    order, source one of system/user/agent, message); agent-only fields only on agent steps;
    tool calls {tool_call_id, function_name, arguments (object)}; observation results with
    content; final_metrics' totals as numbers; subagent_trajectories a list."""
    assert doc["schema_version"] == "ATIF-v1.7"
    assert isinstance(doc["agent"]["name"], str) and isinstance(doc["agent"]["version"], str)
    for t in doc["agent"].get("tool_definitions", []):
        assert t["type"] == "function" and isinstance(t["function"]["name"], str)
    steps = doc["steps"]
    assert steps and [s["step_id"] for s in steps] == list(range(1, len(steps) + 1))
    call_ids: set[str] = set()
    for s in steps:
        assert s["source"] in ("system", "user", "agent")
        assert isinstance(s["message"], str)
        if s["source"] != "agent":
            assert not {"model_name", "reasoning_content", "tool_calls", "metrics"} & s.keys()
        for c in s.get("tool_calls", []):
            assert isinstance(c["tool_call_id"], str) and isinstance(c["function_name"], str)
            assert isinstance(c["arguments"], dict)
            call_ids.add(c["tool_call_id"])
        for res in s.get("observation", {}).get("results", []):
            assert isinstance(res["content"], str)
            assert res.get("source_call_id") is None or res["source_call_id"] in call_ids
        m = s.get("metrics")
        if m is not None:
            for k in ("prompt_tokens", "completion_tokens", "cached_tokens"):
                assert isinstance(m[k], int) and m[k] >= 0
            assert m["cached_tokens"] <= m["prompt_tokens"]  # prompt_tokens includes cached
        if "is_copied_context" in s:
            assert isinstance(s["is_copied_context"], bool)
    fm = doc["final_metrics"]
    for k in (
        "total_prompt_tokens",
        "total_completion_tokens",
        "total_cached_tokens",
        "total_steps",
    ):
        assert isinstance(fm[k], int)
    assert fm["total_steps"] == len(steps)
    assert isinstance(doc["subagent_trajectories"], list)


@needs_bwrap
def test_rollouts_token_ids_masks_and_costs_match_the_ledger(tmp_path):
    r, out = rollouts(tmp_path, "--n", "2", "--target", "3", fmt="verl")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert (doc["groups_complete"], doc["samples"], doc["stop_reason"]) == (3, 6, "target")
    assert doc["export"]["samples"] == 6 and doc["export"]["skipped"] == []
    counter = TiktokenCounter()
    recs = {x["key"]: x for x in records(out)}
    for rec in recs.values():
        result = json.loads((Path(rec["run_dir"]) / "result.json").read_text())
        main = [e for e in result["ledger"] if e["agent"] == "main"]
        assert rec["trace_complete"] and [s["step"] for s in rec["trace"]] == [
            e["step"] for e in main
        ]
        for s, e in zip(rec["trace"], main, strict=True):
            # the ids are the tokens the provider billed: as many as it counted
            assert len(s["prompt_ids"]) == e["usage"]["input_tokens"]
            assert len(s["completion_ids"]) == e["usage"]["output_tokens"]
            assert s["cost_usd"] == e["cost_usd"]
            parts = {k: D(v) for k, v in s["cost_parts"].items()}
            assert sum(parts.values()) == D(e["cost_usd"])
            assert parts["read"] > 0 or e["usage"]["cache_read_tokens"] == 0
        assert sum(D(s["cost_usd"]) for s in rec["trace"]) == D(rec["cost_usd"])
        assert rec["task"] in {"hello-file", "fix-median", "sales-report"}
        assert load_task(rec["task_path"]).instruction.strip()[:40] in counter.decode(
            rec["trace"][0]["prompt_ids"]
        )
    lines = [json.loads(x) for x in (out / "verl.jsonl").read_text().splitlines()]
    assert len(lines) == 6
    for row in lines:
        rec = recs[row["extra_fields"]["sample_id"]]
        trace = rec["trace"]
        assert row["prompt_ids"] == trace[0]["prompt_ids"]
        assert len(row["response_ids"]) == len(row["response_mask"])
        # the model's tokens are exactly its replies; the rest is what the tools returned
        model_tokens = [
            t for t, m in zip(row["response_ids"], row["response_mask"], strict=True) if m == 1
        ]
        assert model_tokens == [t for s in trace for t in s["completion_ids"]]
        tool_text = counter.decode(
            [t for t, m in zip(row["response_ids"], row["response_mask"], strict=True) if m == 0]
        )
        tool_msgs = [m["content"] for s in trace[1:] for m in s["messages"] if m["role"] == "tool"]
        assert tool_msgs and all(c in tool_text for c in tool_msgs)
        # the whole sequence is the last prompt plus the last reply
        assert (
            row["prompt_ids"] + row["response_ids"]
            == trace[-1]["prompt_ids"] + trace[-1]["completion_ids"]
        )
        assert (
            row["num_turns"] == len(trace) and row["reward_score"] == 0.0
        )  # all pass: no advantage
        assert row["extra_fields"]["reward_raw"] == 1.0

    # stats: per-domain rewards, success, cost per sample, allocation over time
    s = stayer("rollouts", "stats", str(out), "--json", home=tmp_path / "home")
    assert s.returncode == 0, s.stderr
    st = json.loads(s.stdout)
    [dom] = st["domains"]
    assert (
        dom["domain"],
        dom["samples"],
        dom["groups"],
        dom["success_rate"],
        dom["groups_with_signal"],
    ) == ("examples", 6, 3, 1.0, 0)
    assert D(dom["cost_per_sample_usd"]) == sum(D(x["cost_usd"]) for x in recs.values()) / 6
    assert [rd["round"] for rd in st["rounds"]] == [1] and len(
        st["rounds"][0]["allocation_history"]
    ) == 3


@needs_bwrap
@pytest.mark.parametrize("fmt", ["skyrl", "verifiers", "atif", "jsonl"])
def test_each_export_format(tmp_path, fmt):
    r, out = rollouts(tmp_path, "--n", "2", "--target", "1", fmt=fmt)
    assert r.returncode == 0, r.stderr
    recs = records(out)
    assert len(recs) == 2
    if fmt == "skyrl":
        g = json.loads((out / "skyrl.json").read_text())
        n = len(g["response_ids"])
        assert n == 2
        for k in ("prompt_token_ids", "rewards", "loss_masks", "stop_reasons", "trajectory_ids"):
            assert len(g[k]) == n, k
        assert all(
            len(m) == len(ids) for m, ids in zip(g["loss_masks"], g["response_ids"], strict=True)
        )
        assert sorted(t["repetition_id"] for t in g["trajectory_ids"]) == [1, 2]
        assert len({t["instance_id"] for t in g["trajectory_ids"]}) == 1  # one group
        assert g["stop_reasons"] == ["tool_use", "tool_use"]
    elif fmt == "verifiers":
        v = json.loads((out / "verifiers.json").read_text())
        for p, pm, c, cm, lp in zip(
            v["prompt_ids"],
            v["prompt_mask"],
            v["completion_ids"],
            v["completion_mask"],
            v["completion_logprobs"],
            strict=True,
        ):
            assert len(p) == len(pm) and len(c) == len(cm) == len(lp) and set(cm) == {0, 1}
        assert len(v["rewards"]) == 2
    elif fmt == "atif":
        docs = [json.loads(p.read_text()) for p in sorted((out / "atif").glob("*.json"))]
        assert len(docs) == 2
        for doc in docs:
            check_atif(doc)
            assert doc["schema_version"] == ATIF_VERSION
            rec = next(x for x in recs if x["key"] == doc["trajectory_id"])
            agent_steps = [s for s in doc["steps"] if s["source"] == "agent"]
            assert [s["metrics"]["cost_usd"] for s in agent_steps] == [
                float(s["cost_usd"]) for s in rec["trace"]
            ]
            assert [s["metrics"]["prompt_token_ids"] for s in agent_steps] == [
                s["prompt_ids"] for s in rec["trace"]
            ]
            assert doc["final_metrics"]["total_cost_usd"] == float(rec["cost_usd"])
            assert doc["final_metrics"]["total_prompt_tokens"] == rec["usage"]["input_tokens"]
            assert any(s.get("observation") for s in agent_steps)  # the tool's output
    else:
        rows = [json.loads(x) for x in (out / "rollouts.jsonl").read_text().splitlines()]
        assert [r["sample_id"] for r in rows] == sorted(x["key"] for x in recs)
        assert all(r["reward"] == 1.0 and r["reward_normalised"] == 0.0 for r in rows)


def test_compacted_context_is_marked_copied_and_starts_a_new_sequence(tmp_path, monkeypatch):
    """A summarising policy rewrites the head of the context: the steps after it are a new
    sequence, the messages it kept are copied context (ATIF is_copied_context)."""
    monkeypatch.setenv("STAYER_HOME", str(tmp_path / "home"))
    config = EvalConfig(
        MODEL, "summarize", "synthetic:steps=30,obs_tokens=6000,out_tokens=100", 40, sandbox="local"
    )
    rec = asyncio.run(
        rollout_trial(Trial(load_task(EXAMPLES / "hello-file"), config, 1, "x"), PriceBook.load())
    )
    trace = rec["trace"]
    resets = [s["step"] for s in trace if s["context_reset"]]
    assert rec["trace_complete"] and resets, "the policy compacted"
    assert all(len(s["prompt_ids"]) == s["usage"]["input_tokens"] for s in trace)
    segs = segments(trace)
    assert segs is not None and [seg["steps"][0] for seg in segs] == [1, *resets]
    rec = msgspec.structs.replace(rec, key="k", group="g", domain="d")
    doc = atif(rec, 0.0)
    check_atif(doc)
    copied = [s for s in doc["steps"] if s.get("is_copied_context")]
    assert copied and all(
        s["source"] in ("user", "system", "agent") and "metrics" not in s for s in copied
    )
    assert any(s.get("extra", {}).get("context_management") == "summary" for s in doc["steps"])


def test_normalised_reward_is_a_z_score_within_each_group():
    recs = (
        [{"key": f"a{i}", "group": "a", "reward": r} for i, r in enumerate([0.0, 1.0, 1.0, 0.0])]
        + [{"key": f"b{i}", "group": "b", "reward": r} for i, r in enumerate([10.0, 30.0])]
        + [
            {"key": "c0", "group": "c", "reward": 1.0},
            {"key": "c1", "group": "c", "reward": 1.0},
            {"key": "d0", "group": "d", "reward": None},  # a sample with no reward scores 0
        ]
    )
    z = normalised_rewards(recs)
    for g in ("a", "b"):
        vals = [z[r["key"]] for r in recs if r["group"] == g]
        assert statistics.fmean(vals) == pytest.approx(0) and statistics.pstdev(
            vals
        ) == pytest.approx(1)
    assert z["b0"] == z["a0"] == -1.0  # a reward scale ten times larger weighs the same
    assert z["c0"] == z["c1"] == z["d0"] == 0.0


# --- the scheduler -----------------------------------------------------------------------


def test_allocation_moves_to_domains_with_learning_signal_within_a_minimum():
    s = Scheduler(min_share=0.2)
    for i in range(40):
        s.add(Job(f"easy{i}", domain="easy"))
        s.add(Job(f"mixed{i}", domain="mixed"))
    assert s.allocation() == {"easy": 0.5, "mixed": 0.5}  # nothing known yet
    for _ in range(4):  # every easy group all passes, every mixed group is split
        s.finished(Job("x", domain="easy"), D("0.01"), [True, True])
        s.finished(Job("y", domain="mixed"), D("0.01"), [True, False])
    alloc = s.allocation()
    assert alloc["easy"] == pytest.approx(0.2 / 1.2) and alloc["mixed"] == pytest.approx(1 / 1.2)
    picked = [s.next().domain for _ in range(24)]
    assert picked.count("mixed") == 20 and picked.count("easy") == 4  # the minimum holds
    assert s.history[-1]["allocation"] == alloc


def test_fair_share_in_dollars_and_priority_first():
    s = Scheduler(tenant_shares={"a": 1.0, "b": 1.0})
    for i in range(3):
        s.add(Job(f"a{i}", tenant="a"))
        s.add(Job(f"b{i}", tenant="b"))
    s.add(Job("urgent", tenant="a", priority=5))
    assert s.next().key == "urgent"
    s.finished(Job("urgent", tenant="a"), D("1.00"), [])  # a has spent a dollar
    assert [s.next().tenant for _ in range(3)] == ["b", "b", "b"]  # b has spent nothing
    s2 = Scheduler(tenant_shares={"a": 3.0, "b": 1.0})
    s2.add(Job("a1", tenant="a"))
    s2.add(Job("b1", tenant="b"))
    s2.spent.update({"a": D("2"), "b": D("1")})  # a's share is 3x: 2/3 < 1/1
    assert s2.next().tenant == "a"


def test_down_weighted_jobs_count_less_toward_their_domain():
    s = Scheduler()
    s.add(Job("flaky", domain="d1", weight=0.25))
    s.add(Job("ok", domain="d2"))
    s.add(Job("flaky2", domain="d1", weight=0.25))
    s.add(Job("ok2", domain="d2"))
    assert s.next().key == "flaky" and s.launched["d1"] == 0.25


def test_straggler_decisions_by_marginal_dollars():
    costs = [D("1")] * 8 + [D("3"), D("5")]  # a heavy tail
    assert expected_remaining(D("2"), costs) == D("2")  # (3 - 2 + 5 - 2) / 2
    assert expected_remaining(D("6"), costs) == D("6")  # none got that far: as much again
    # cheap to finish and its cache is warm: finish it now
    assert straggler_action(D("0.5"), costs, cache_warm=True, cold_premium=D("0.1")) == "finish"
    # the same but cold: carry it over, the premium still leaves it cheaper than a fresh one
    assert straggler_action(D("0.5"), costs, cache_warm=False, cold_premium=D("0.1")) == "carry"
    # a premium that makes it dearer than a fresh sample (mean 1.6): abandon
    assert straggler_action(D("0.5"), costs, cache_warm=False, cold_premium=D("1.5")) == "abandon"
    # deep in the tail: finishing is expected to cost more than a fresh sample
    assert straggler_action(D("2"), costs, cache_warm=True, cold_premium=D("0")) == "abandon"
    # too stale to carry
    assert (
        straggler_action(
            D("0.5"), costs, cache_warm=False, cold_premium=D("0"), staleness=2, max_staleness=2
        )
        == "abandon"
    )
    assert (
        straggler_action(D("0.5"), [], cache_warm=True, cold_premium=D("0")) == "carry"
    )  # nothing known


# --- the job's dollars and the task checks ----------------------------------------------


@needs_bwrap
def test_max_cost_holds_for_the_whole_job(tmp_path):
    # each sample costs ~$0.005-0.010: $0.02 over two slots is $0.01 a sample, two at a time
    r, out = rollouts(
        tmp_path, "--n", "2", "--target", "3", "--max-cost", "0.02", "--concurrency", "2"
    )
    doc = json.loads(r.stdout)
    spent = sum(D(x["cost_usd"]) for x in records(out))
    assert spent <= D("0.02") and D(doc["cost_usd"]) == spent
    assert (
        doc["groups_complete"] < 3 and doc["stop_reason"] == "max_cost" and r.returncode == 3
    )  # budget exhausted


@needs_bwrap
def test_flagged_tasks_are_excluded_or_down_weighted_and_said_so(tmp_path):
    checks = tmp_path / "checks.json"
    checks.write_text(
        json.dumps(
            {
                "suite": "examples",
                "ok": False,
                "tasks": [
                    {
                        "name": "hello-file",
                        "ok": False,
                        "problems": [
                            {"kind": "nop_passes", "detail": "the untouched environment scores 1"}
                        ],
                    },
                    {
                        "name": "fix-median",
                        "ok": False,
                        "problems": [{"kind": "flaky", "detail": "2 of 3 verdicts"}],
                    },
                    {"name": "sales-report", "ok": True, "problems": []},
                ],
            }
        )
    )
    r, out = rollouts(tmp_path, "--n", "1", "--target", "2", "--checks", str(checks))
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert "hello-file" in doc["excluded"] and "fix-median" in doc["down_weighted"]
    assert (
        "excluded: hello-file: nop_passes" in r.stderr
        and "down-weighted: fix-median: flaky" in r.stderr
    )
    assert {x["task"] for x in records(out)} <= {"fix-median", "sales-report"}
    assert {x["weight"] for x in records(out) if x["task"] == "fix-median"} <= {0.25}


def test_bad_input_is_one_line_and_exit_2(tmp_path):
    for args in (
        [],
        ["--target", "0"],
        ["--target", "1", "--format", "parquet"],
        ["--target", "1", "--overprovision", "-1"],
    ):
        r = stayer(
            "rollouts",
            str(EXAMPLES),
            "--model",
            MODEL,
            "--out",
            str(tmp_path / "o"),
            *args,
            home=tmp_path / "h",
        )
        assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, (args, r.stderr)
    r = stayer("rollouts", "stats", str(tmp_path / "nothing"), home=tmp_path / "h")
    assert r.returncode == 2
    bad = tmp_path / "checks.json"
    bad.write_text("[]")
    r = stayer(
        "rollouts",
        str(EXAMPLES),
        "--model",
        MODEL,
        "--target",
        "1",
        "--out",
        str(tmp_path / "o"),
        "--checks",
        str(bad),
        home=tmp_path / "h",
    )
    assert r.returncode == 2 and "--checks" in r.stderr
    assert not (tmp_path / "o").exists()


# --- over-provisioning: stragglers carried over or abandoned ------------------------------


def _straggler_round(out: Path, policy: str, target: int, overprovision: float) -> dict:
    """One round on hello-file, one sample a group: epoch 2 is a straggler (30 steps at a
    simulated second each), every other epoch the oracle (two steps, no latency)."""
    from stayer.journal.backends import stayer_home  # noqa: F401  (STAYER_HOME set by the test)
    from stayer.scale.rollouts import RolloutSpec, collect

    task = load_task(EXAMPLES / "hello-file")
    fast = EvalConfig(MODEL)
    slow = EvalConfig(
        MODEL, None, "synthetic:steps=30,obs_tokens=200,out_tokens=50", 40, sim_latency=1.0
    )
    spec = RolloutSpec(fast, samples=1, target=target, overprovision=overprovision, concurrency=2)
    return asyncio.run(
        collect(
            {"d": [task]},
            spec,
            PriceBook.load(),
            out,
            config_of=lambda t, epoch: slow if epoch == 2 else fast,
            stragglers=lambda *a, **k: policy,
        )
    )


@pytest.mark.slow
@needs_bwrap
def test_a_straggler_carried_over_continues_from_its_journal_next_round(tmp_path, monkeypatch):
    monkeypatch.setenv("STAYER_HOME", str(tmp_path / "home"))
    out = tmp_path / "ro"
    first = _straggler_round(out, "carry", target=1, overprovision=1.0)
    assert (first["groups_complete"], first["groups_launched"]) == (1, 2)
    [key] = first["stragglers"]["carry"]
    assert key.endswith("hello-file.e2")
    run_file = next((out / "trials").rglob("hello-file.e2.run"))
    run_id = run_file.read_text().strip()
    # the next round continues it first, from its journal, and counts its group
    second = _straggler_round(out, "carry", target=3, overprovision=0.0)
    assert second["round"] == 2 and second["carried_in"] == [key] and second["groups_complete"] == 3
    rec = json.loads(run_file.with_suffix(".json").read_text())
    assert rec["run_id"] == run_id and rec["resumed"] is True and rec["steps"] == 31
    # the steps replayed from the journal were not seen again: the trace holds the live ones
    steps = [s["step"] for s in rec["trace"]]
    assert steps == list(range(steps[0], 32)) and rec["trace_complete"] is (steps[0] == 1)
    assert not run_file.exists()
    state = json.loads((out / "rollouts-state.json").read_text())
    assert state["carried"] == {} and state["round"] == 2


@pytest.mark.slow
@needs_bwrap
def test_an_abandoned_straggler_is_never_continued_and_its_dollars_are_counted(
    tmp_path, monkeypatch
):
    from stayer.journal import open_store

    monkeypatch.setenv("STAYER_HOME", str(tmp_path / "home"))
    out = tmp_path / "ro"
    doc = _straggler_round(out, "abandon", target=1, overprovision=1.0)
    [key] = doc["stragglers"]["abandon"]
    state = json.loads((out / "rollouts-state.json").read_text())
    [gone] = state["abandoned"]
    assert gone["key"] == key and doc["abandoned_cost_usd"] == gone["cost_usd"]
    assert not list((out / "trials").rglob("*.run"))
    store = open_store(tmp_path / "home")
    try:
        row = store.run(gone["run_id"])
    finally:
        store.close()
    assert row is not None and D(row.cost_usd) == D(gone["cost_usd"]) and row.status != "succeeded"

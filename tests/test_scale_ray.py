"""The Ray backend on a real one-machine Ray cluster (loopback only, no dashboard, no usage
reporting). A head takes 20-35 s to start on a loaded machine, so the tests here share one
cluster: they are ``slow`` (run by .ci/run) and one xdist group, so that one worker runs
them all (pytest runs with ``--dist loadgroup``)."""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path

import pytest
from test_eval_fixtures import EXAMPLES, needs_bwrap, stayer

ray = pytest.importorskip("ray")

from stayer.eval.runner import EvalConfig, plan_trials, run_trials  # noqa: E402
from stayer.eval.suite import load_suite  # noqa: E402
from stayer.pricing import PriceBook  # noqa: E402
from stayer.scale import ray_backend  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("ray"), needs_bwrap]

MODEL = "sim:claude-sonnet-4-5"


@pytest.fixture(scope="session")
def cluster(tmp_path_factory):
    home = tmp_path_factory.mktemp("ray-home")
    os.environ["STAYER_HOME"] = str(home)  # the workers' journal: fixed when the cluster starts
    ray_backend.connect("local", num_cpus=2)
    yield home
    ray_backend.shutdown()


def comparable(doc: dict) -> list:
    """What must not depend on where the trials ran: per configuration, trials, successes,
    costs and tokens; per task, the same."""
    return [
        {
            k: c[k]
            for k in (
                "model",
                "trials",
                "successes",
                "success_rate",
                "total_cost_usd",
                "mean_tokens",
                "error_classes",
            )
        }
        for c in doc["configs"]
    ] + [json.dumps(doc["tasks"], sort_keys=True)]


def test_eval_with_ray_local_equals_the_local_runner(tmp_path):
    """The command line, end to end: `stayer eval examples --ray local` starts its own
    cluster (its own process) and gives the local runner's results."""
    args = ("eval", str(EXAMPLES), "--model", f"{MODEL},sim:gpt-5", "--epochs", "2", "--json")
    local = stayer(*args, "--out", str(tmp_path / "local"), home=tmp_path / "h1")
    on_ray = stayer(
        *args, "--out", str(tmp_path / "ray"), "--ray", "local", home=tmp_path / "h2", timeout=600
    )
    assert local.returncode == 0, local.stderr
    assert on_ray.returncode == 0, on_ray.stderr
    a, b = json.loads(local.stdout), json.loads(on_ray.stdout)
    assert b["settings"]["ray"] == "local" and b["trials_total"] == a["trials_total"] == 16
    assert comparable(a) == comparable(b)

    def keys(out):
        return sorted(p.relative_to(out).as_posix() for p in (out / "trials").rglob("*.json"))

    assert keys(tmp_path / "local") == keys(tmp_path / "ray")


def test_ray_trials_journal_to_the_shared_store_and_resume_there(cluster):
    """A trial whose run id was written down but whose run did not finish (its worker was
    lost) is continued from the shared journal by the Ray task that runs it again."""
    from stayer.eval.runner import TrialStore

    tasks = load_suite(str(EXAMPLES))
    prices = PriceBook.load()
    trials = plan_trials(tasks, [EvalConfig(MODEL)], 1)
    store = TrialStore(cluster / "out")
    executor = ray_backend.RayTrials()
    first = asyncio.run(
        run_trials(trials, concurrency=4, prices=prices, store=store, executor=executor)
    )
    assert [r["status"] for r in first] == ["succeeded"] * 4
    # Every run is in the journal the driver reads: nothing lives only on a worker.
    from stayer.journal import open_store

    journal = open_store(cluster)
    try:
        rows = {r["run_id"]: journal.run(r["run_id"]) for r in first}
    finally:
        journal.close()
    assert all(row is not None and row.status == "succeeded" for row in rows.values())
    # A finished trial is never run again: running the same trials reuses every record.
    again = asyncio.run(
        run_trials(trials, concurrency=4, prices=prices, store=store, executor=executor)
    )
    assert [r["run_id"] for r in again] == [r["run_id"] for r in first]
    # A run id written down for a run that finished in the journal but whose record was
    # lost (its node died after the run, before the record): taken from the journal as is.
    rec = store.path(trials[0])
    run_id = json.loads(rec.read_text())["run_id"]
    rec.unlink()
    store.started(trials[0], run_id)
    [redo] = asyncio.run(
        run_trials(trials[:1], concurrency=1, prices=prices, store=store, executor=executor)
    )
    assert (
        redo["run_id"] == run_id
        and redo["resumed"] is True
        and redo["cost_usd"] == first[0]["cost_usd"]
    )


def test_rollouts_on_ray_equal_local_rollouts(cluster, tmp_path):
    """Samples run as Ray tasks carry the same token ids, masks and costs."""
    from stayer.eval.runner import LocalTrials
    from stayer.scale.exports import export
    from stayer.scale.rollouts import RolloutSpec, collect, rollout_trial

    domains = {"examples": load_suite(str(EXAMPLES))}
    spec = RolloutSpec(EvalConfig(MODEL), samples=2, target=3)
    prices = PriceBook.load()
    docs = {}
    for name, executor in (
        ("local", LocalTrials(rollout_trial)),
        ("ray", ray_backend.RayTrials(rollout_trial)),
    ):
        out = tmp_path / name
        doc = asyncio.run(collect(domains, spec, prices, out, executor=executor))
        assert doc["groups_complete"] == 3
        recs = [json.loads(p.read_text()) for p in sorted((out / "trials").rglob("*.json"))]
        export(recs, out, "verl")
        docs[name] = [json.loads(x) for x in (out / "verl.jsonl").read_text().splitlines()]

    def strip(rows):
        return [
            {k: v for k, v in r.items() if k != "extra_fields"}
            | {"cost": r["extra_fields"]["cost_usd"]}
            for r in rows
        ]

    assert strip(docs["local"]) == strip(docs["ray"]) and len(docs["ray"]) == 6


def test_a_killed_worker_loses_no_work_its_trial_resumes_from_the_journal(cluster):
    """SIGKILL the worker process running a trial mid-run: Ray runs the task again, which
    continues the same run from the shared journal (its finished steps are not paid for
    again) and finishes it."""
    import signal
    import time

    from stayer.eval.runner import Trial
    from stayer.eval.task import load_task
    from stayer.journal import open_store

    config = EvalConfig(
        MODEL, None, "synthetic:steps=8,obs_tokens=100,out_tokens=20", 20, sim_latency=1.0
    )
    trial = Trial(load_task(EXAMPLES / "hello-file"), config, 1, "x")
    run_id = "eval-killed-worker-test"

    async def main() -> dict:
        job = asyncio.ensure_future(
            ray_backend.RayTrials().run(trial, PriceBook.load(), run_id, None)
        )
        journal = open_store(cluster)
        try:
            # Wait (on the journal's state, not a clock) until two steps are journaled.
            deadline = time.monotonic() + 300  # only bounds a failing test
            while (row := journal.run(run_id)) is None or row.steps < 2:
                assert time.monotonic() < deadline and not job.done(), "the trial never got going"
                await asyncio.sleep(0.2)
            pid = int(row.lease_owner.rsplit(":", 3)[1])
        finally:
            journal.close()
        os.kill(pid, signal.SIGKILL)
        return await job

    record = asyncio.run(main())
    assert record["run_id"] == run_id and record["resumed"] is True, record.get("error")
    result = json.loads((Path(record["run_dir"]) / "result.json").read_text())
    steps = [e["step"] for e in result["ledger"] if e.get("kind") != "lost_in_flight"]
    assert steps == list(range(1, 10))  # each step once: 8 tool steps and the submit

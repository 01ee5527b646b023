"""Trials on Ray: the ``TrialExecutor`` behind ``stayer eval --ray`` and ``stayer rollouts --ray``.

A Ray actor call runs one trial exactly as the local runner does (``eval.runner.run_trial``),
in a worker process on one of the cluster's nodes; each node runs its own sandboxes. The run is
journaled in the shared store (``STAYER_DB``, PostgreSQL, on a cluster; SQLite in
``$STAYER_HOME`` on one machine), and its run id is written down before the task is sent,
so a finished trial is never lost with its node, and a task that Ray retries after its
worker died continues the same run from its journal (its finished model calls are not paid
for again).

Ray is optional (the ``ray`` extra) and imported only here.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable
from typing import Any

from stayer.errors import ConfigError
from stayer.eval.records import TrialRecord
from stayer.eval.runner import Trial, TrialFunction, crashed_record, run_trial
from stayer.journal.backends import stayer_home
from stayer.pricing import PriceBook

#: What this process sets before starting or joining a cluster: no usage reporting, and a
#: single-machine cluster stays on loopback.
RAY_ENV = {"RAY_USAGE_STATS_ENABLED": "0", "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}

#: A trial whose worker died is run again this many times (it resumes its run's journal).
TASK_RETRIES = 3


def connect(address: str, *, num_cpus: int = 2) -> None:
    """Start a single-machine cluster (``address`` "local": loopback only, no dashboard, at
    most ``num_cpus`` CPUs) or join the one at ``address``; once per process."""
    try:
        import ray
    except ImportError:
        raise ConfigError("--ray: Ray is not installed; pip install 'stayer[ray]'") from None
    if ray.is_initialized():
        return
    for key, value in RAY_ENV.items():
        os.environ.setdefault(key, value)
    if address != "local" and not os.environ.get("STAYER_DB"):
        raise ConfigError(
            f"--ray {address}: the nodes of a cluster need a shared journal; set STAYER_DB=postgresql://…"
        )
    # Workers journal to the same store and import the same code as this process.
    env = {k: os.environ[k] for k in ("STAYER_DB", "PYTHONPATH", *RAY_ENV) if k in os.environ}
    env["STAYER_HOME"] = str(stayer_home().resolve())
    options: dict[str, Any] = {
        "runtime_env": {"env_vars": env},
        "include_dashboard": False,
        "logging_level": "WARNING",
        "log_to_driver": False,
    }
    if address == "local":
        ray.init(address="local", num_cpus=num_cpus, _node_ip_address="127.0.0.1", **options)
    else:
        ray.init(address=address, **options)


def shutdown() -> None:
    import ray

    ray.shutdown()


class _TrialWorker:
    """A Ray actor that runs trials as coroutines in its process, as the local runner does
    (veRL's agent-loop workers do the same): a trial waits on model calls and sandboxed
    commands, so one process serves many, and Python and stayer are loaded once per
    worker rather than once per trial."""

    async def run(
        self, trial_fn: TrialFunction, trial: Trial, prices: PriceBook, run_id: str
    ) -> TrialRecord:
        return await trial_fn(trial, prices, run_id=run_id)


class RayTrials:
    """``TrialExecutor``: trials spread over ``workers`` Ray actors (default: one per node
    of the cluster), each sent to the actor with the fewest in flight. An actor whose
    process dies is restarted and its trials are run again (``TASK_RETRIES``), continuing
    their runs from the journal. The runner's ``concurrency`` bounds trials in flight."""

    def __init__(
        self,
        trial_fn: TrialFunction = run_trial,
        *,
        workers: int | None = None,
        cpus_per_worker: float = 0.0,
    ) -> None:
        import ray

        self._ray = ray
        self.trial_fn = trial_fn
        count = workers or max(1, sum(1 for n in ray.nodes() if n.get("Alive")))
        actor = ray.remote(_TrialWorker).options(
            num_cpus=cpus_per_worker,
            max_restarts=-1,
            max_task_retries=TASK_RETRIES,
            max_concurrency=10_000,
            scheduling_strategy="SPREAD",  # over the nodes: each runs its own sandboxes
        )
        self._workers = [actor.remote() for _ in range(count)]
        self._in_flight = [0] * count
        self._prices: tuple[PriceBook, Any] | None = None

    def _prices_ref(self, prices: PriceBook) -> Any:
        """The price book in Ray's object store, sent once rather than with every task."""
        if self._prices is None or self._prices[0] is not prices:
            self._prices = (prices, self._ray.put(prices))
        return self._prices[1]

    async def run(
        self,
        trial: Trial,
        prices: PriceBook,
        run_id: str | None,
        on_started: Callable[[str], None] | None,
    ) -> TrialRecord:
        started = time.monotonic()
        run_id = run_id or trial.new_run_id()
        if on_started is not None:
            on_started(run_id)  # before it is sent: a retry on another worker continues this run
        i = min(range(len(self._workers)), key=self._in_flight.__getitem__)
        self._in_flight[i] += 1
        try:
            # Ray's typing gives an actor handle's methods no ``.remote`` (it adds it at runtime).
            ref = self._workers[i].run.remote(  # type: ignore[attr-defined]
                self.trial_fn, trial, self._prices_ref(prices), run_id
            )
            try:
                return await ref
            except asyncio.CancelledError:  # stopped (a straggler): its journal keeps what it did
                self._ray.cancel(ref)
                raise
            except Exception as e:  # the trial failed every retry (e.g. its node is gone)
                return crashed_record(trial, run_id, e, time.monotonic() - started)
        finally:
            self._in_flight[i] -= 1

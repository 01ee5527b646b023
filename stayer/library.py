"""``stayer.run_task``: what ``stayer run`` does, from code. It takes the command's flags
as keyword arguments (same names, same bounds: bad input raises ``ConfigError`` before
anything is written) and returns its ``--json`` document wrapped in a typed
``RunOutcome`` (the raw document stays at ``.document``). State lives in
``$STAYER_HOME`` as for the command, so ``stayer report RUN_ID`` and ``stayer resume
RUN_ID`` work on a run made here. (``stayer.eval`` lives in ``stayer.eval.engine``.)
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from typing import TYPE_CHECKING, Any

from stayer.money import usd_argument
from stayer.settings import RunSettings

if TYPE_CHECKING:
    from stayer.ledger import LedgerEntry
    from stayer.run import RunReport


@dataclass(frozen=True)
class RunOutcome:
    """One run's result (``stayer run --json``): the fields most callers read, typed, and
    the whole document. Before 1.0 this becomes the run result record itself."""

    run_id: str
    task: str
    model: str
    status: str  # succeeded | failed | budget_exhausted | error
    reward: float | None
    steps: int
    cost_usd: Decimal | None  # None: unknown (a call's price was), never 0
    stop_reason: str | None
    ledger: list[LedgerEntry]  # ``e[name]``: a field as the JSON document has it
    run_dir: Path
    document: dict[str, Any]  # as JSON: the API's boundary (``stayer run --json``)

    @classmethod
    def of(cls, report: RunReport) -> RunOutcome:
        """The outcome of a finished run's report (what ``execute`` returned)."""
        from stayer.ledger import LedgerEntry
        from stayer.records import from_json

        return cls(
            run_id=report.run_id,
            task=report.task,
            model=report.model,
            status=report.status,
            reward=report.reward,
            steps=report.steps,
            cost_usd=report.spent.amount,
            stop_reason=report.stop_reason,
            ledger=from_json(report.ledger, list[LedgerEntry]),
            run_dir=Path(report.run_dir),
            document=report.to_json(),
        )

    @property
    def succeeded(self) -> bool:
        return self.status == "succeeded"

    def report(self) -> dict[str, Any]:
        """What ``stayer report RUN_ID --json`` prints for this run."""
        from stayer.journal.backends import stayer_home
        from stayer.sdk import Session

        return Session(self.run_id, home=stayer_home()).report()


async def _execute_run(config: RunSettings, on_step: Callable[[Any], None] | None) -> RunReport:
    """The one call into the run's entry point (``stayer.run``): prepare, then execute."""
    from stayer.run import execute, prepare

    return await execute(prepare(config), on_step)


def run_task(
    task_dir: str | Path,
    *,
    model: str | None = None,
    max_steps: int = RunSettings.max_steps,
    max_cost: Decimal | str | int | float | None = None,
    run_id: str | None = None,
    base_url: str | None = None,
    sim_policy: str | None = None,
    sim_latency: float = RunSettings.sim_latency,
    sandbox: str | None = None,
    service_tier: str | None = None,
    policy: str = RunSettings.policy,
    max_context: int | None = None,
    config: str | Path | None = None,
    team: str | Path | None = None,
    command_timeout: float = RunSettings.command_timeout,
    memory_mb: int | None = None,
    storage_mb: int | None = None,
    max_processes: int | None = None,
    on_step: Callable[[Any], None] | None = None,
) -> RunOutcome:
    """Run an agent on the task in ``task_dir`` (Harbor layout), verify the result, and
    return it: ``stayer run TASK --model MODEL …``. ``config``/``team`` are ``--config``
    and ``--team`` files; ``on_step`` receives each step's ledger entry as it is made.
    Not from inside a running event loop (it runs one)."""
    settings = RunSettings(
        task_dir=str(task_dir),
        model=model or "",
        max_steps=max_steps,
        max_cost=usd_argument(max_cost, "max_cost"),
        run_id=run_id,
        base_url=base_url,
        sim_policy=sim_policy,
        sim_latency=sim_latency,
        sandbox=sandbox,
        service_tier=service_tier,
        policy=policy,
        max_context=max_context,
        config_file=None if config is None else str(config),
        team_file=None if team is None else str(team),
        command_timeout=command_timeout,
        memory_mb=memory_mb,
        storage_mb=storage_mb,
        max_processes=max_processes,
    )
    report = asyncio.run(_execute_run(settings, on_step))
    return RunOutcome.of(report)

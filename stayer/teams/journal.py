"""A team thread's journal stream: a ``RunJournal`` of its own inside the run's journal.

Each thread replays by its own cursors (its n-th model call, t-th tool call, …), so threads
that interleave differently after a resume still find their own records. Its events go
into the run's journal tagged with the thread's name (``RunLog.threads`` reads them back),
written by the run's one writer. Workspace snapshots are the team's (see ``Team``): a
thread records its steps and asks for one.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from stayer.journal.log import RunLog
from stayer.journal.session import RunJournal
from stayer.journal.steps import StepEntryRecord
from stayer.journal.store import RunUpdate


class ThreadJournal(RunJournal):
    def __init__(
        self,
        run: RunJournal,
        name: str,
        row_update: Callable[[], RunUpdate],
        snapshot: Callable[[], None],
    ) -> None:
        log = run.log.threads.get(name) or RunLog(
            run.run_id, blobs=run.log.blobs, header=run.log.header
        )
        super().__init__(
            run.store,
            run.run_id,
            run.owner,
            log,
            run.workspace,
            run.prices,
            started=run.started,
            snapshots=run.snapshots,
            ttl_s=run.ttl_s,
            warn=run.warn,
        )
        self.run = run
        self.writer = run.writer  # the run's one writer writes the thread's events too
        self.name = self.agent = name
        self.tags = {"thread": name}
        self.lost = run.lost  # one list for the run: its ledger's lost_in_flight entries
        self.unknown = run.unknown  # and its outcome_unknown records
        self.row_update = row_update  # the run's row after this step: the team's totals
        self.snapshot = snapshot  # the team's workspace snapshot, when it can take one

    def flush(self, *, sync: bool = True) -> None:
        self.run.flush(sync=sync)

    def on_step(self, entry: Any) -> None:
        self.steps_done = entry.step
        self._unstepped.clear()
        self.steps_cost += entry.cost.total  # ``Usd``: an unpriced step makes it unknown
        if entry.step not in self.log.steps:
            self.record("step", StepEntryRecord(entry.step, entry), update=self.row_update())
        self.snapshot()

"""Continue a run that was interrupted: from its journal back to ``execute``.

The journal's header holds the run's configuration, so the run is prepared exactly as it
was (same task, model, limits and policies); ``execute`` then restores the workspace from
the latest snapshot and replays the journal (``stayer.journal.session``).
"""

from __future__ import annotations

import dataclasses

from stayer.journal import JournalError, RunJournal, Store, open_store, stayer_home
from stayer.pricing import PriceBook
from stayer.records import from_json
from stayer.run import PreparedRun, RunSettings, prepare, run_workspace


def prepare_resume(
    run_id: str,
    *,
    store: Store | None = None,
    prices: PriceBook | None = None,
    owner: str | None = None,
    ttl_s: float | None = None,
    task_dir: str | None = None,
    allow_private_mcp: bool | None = None,
) -> tuple[PreparedRun, RunJournal]:
    """The run ``run_id``, prepared and leased, ready for ``execute(p, journal=j)``.

    Raises JournalError (a ConfigError) for an unknown run, an unopenable or newer journal,
    or a run another live process holds; ``RunFinished`` (with the result document) for a
    run that already finished. Nothing is written unless the run can be continued.
    ``owner`` and ``ttl_s``: the lease to run it under (a worker's claim), see ``reopen``.
    ``task_dir``: where the task is on this machine, if not where the journal says (a
    worker on another host resuming a tenant's upload). ``allow_private_mcp``: whether
    the run's own MCP servers may be on non-public addresses, if not as when it started
    (the rule of the worker that takes it over).
    """
    home = stayer_home()
    opened = store is None
    store = store or open_store(home, create=False)
    if store is None:
        raise JournalError(
            f"run {run_id}: no such run (no journal in {home}); `stayer runs` lists the runs there"
        )
    try:
        row, log = RunJournal.load(store, run_id)
        try:
            config = from_json(row.header["config"], RunSettings)
            if task_dir is not None:
                config = dataclasses.replace(config, task_dir=task_dir)
            if allow_private_mcp is not None:
                config = dataclasses.replace(config, allow_private_mcp=allow_private_mcp)
        except (KeyError, TypeError, ValueError) as e:
            raise JournalError(
                f"run {run_id}: its journal header is not a run configuration ({e})"
            ) from None
        prepared = prepare(config, prices, store=store, resume=True)
        prepared.close_store = opened
        journal = RunJournal.reopen(
            store,
            row,
            log,
            run_workspace(prepared.run_dir),
            prepared.prices,
            owner=owner,
            ttl_s=ttl_s,
        )
    except BaseException:
        if opened:
            store.close()
        raise
    return prepared, journal

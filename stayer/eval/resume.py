"""Continue a run that was interrupted: from its journal back to ``execute``.

The journal's header holds the run's configuration, so the run is prepared exactly as it
was (same task, model, limits and policies); ``execute`` then restores the workspace from
the latest snapshot and replays the journal (``stayer.journal.session``).
"""

from __future__ import annotations

from stayer.journal import JournalError, RunJournal, Store, open_store, stayer_home
from stayer.pricing import PriceBook
from stayer.run import PreparedRun, RunConfig, prepare, run_workspace


def prepare_resume(
    run_id: str, *, store: Store | None = None, prices: PriceBook | None = None
) -> tuple[PreparedRun, RunJournal]:
    """The run ``run_id``, prepared and leased, ready for ``execute(p, journal=j)``.

    Raises JournalError (a ConfigError) for an unknown run, an unopenable or newer journal,
    or a run another live process holds; ``RunFinished`` (with the result document) for a
    run that already finished. Nothing is written unless the run can be continued.
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
            config = RunConfig.from_record(row.header["config"])
        except (KeyError, TypeError, ValueError) as e:
            raise JournalError(
                f"run {run_id}: its journal header is not a run configuration ({e})"
            ) from None
        prepared = prepare(config, prices, store=store, resume=True)
        prepared.close_store = opened
        journal = RunJournal.reopen(
            store, row, log, run_workspace(prepared.run_dir), prepared.prices
        )
    except BaseException:
        if opened:
            store.close()
        raise
    return prepared, journal

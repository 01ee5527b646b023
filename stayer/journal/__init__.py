"""Durable runs: an append-only journal per run, content-addressed blobs, exact resume.

* ``store`` — the Store protocol and ``open_store`` (SQLite under ``$STAYER_HOME`` by
  default, PostgreSQL with ``STAYER_DB=postgresql://…``);
* ``session`` — ``RunJournal``: wraps a run's model and tools, journals every step, and
  replays the journal on resume;
* ``log`` — a journal read back (a torn tail cut off, corruption refused);
* ``snapshot`` — workspace snapshots in the blob store (for Postgres; SQLite journals use
  the sandbox's ``FileSnapshotStore`` beside the database).
"""

from stayer.journal.log import RunLog, load_log
from stayer.journal.session import (
    CacheStateful,
    JournalStats,
    ReplayDiverged,
    RunFinished,
    RunJournal,
    lost_ledger_entries,
)
from stayer.journal.snapshot import BlobSnapshots
from stayer.journal.store import (
    SCHEMA_VERSION,
    Event,
    JournalCorrupt,
    JournalError,
    LeaseLost,
    RunRow,
    Store,
    open_store,
)

__all__ = [
    "SCHEMA_VERSION",
    "BlobSnapshots",
    "CacheStateful",
    "Event",
    "JournalCorrupt",
    "JournalError",
    "JournalStats",
    "LeaseLost",
    "ReplayDiverged",
    "RunFinished",
    "RunJournal",
    "RunLog",
    "RunRow",
    "Store",
    "load_log",
    "lost_ledger_entries",
    "open_store",
]

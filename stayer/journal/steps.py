"""The ``step`` row: a step's ledger entry, as a run's journal and a metered session's
ledger write it (and ``load_log`` reads it back)."""

from __future__ import annotations

from stayer.ledger import LedgerEntry
from stayer.records import Record


class StepEntryRecord(Record):
    """A ``step`` event: step ``step`` done, its ledger entry."""

    step: int
    entry: LedgerEntry

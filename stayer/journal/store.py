"""Where journals live: the Store protocol and its row types.

A store holds three things: runs (one row each, with a lease saying which process is
running it), events (append-only, numbered per run) and content-addressed blobs. Two
backends share one SQL implementation (``stayer.journal.sql``): SQLite in WAL mode under
``$STAYER_HOME`` (the default; blobs as files in ``$STAYER_HOME/blobs/``) and PostgreSQL
(``STAYER_DB=postgresql://…``; blobs in a table), where several processes or machines can
claim runs with leases. ``stayer.journal.backends`` chooses one.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import msgspec
from msgspec import UNSET, UnsetType

from stayer.errors import JournalError as JournalError  # re-exported: it lives at the floor
from stayer.errors import StoreUnavailable as StoreUnavailable
from stayer.records import Record, to_json

if TYPE_CHECKING:  # the snapshot code is only needed by runs, not by `stayer runs`
    from stayer.workspace.snapshot import SnapshotStore

#: Version of the tables and event payloads this code writes. A journal written by a newer
#: stayer is refused rather than misread.
SCHEMA_VERSION = 1


class JournalCorrupt(JournalError):
    """A journal damaged before its last write: an event that cannot be read, a gap in the
    numbering, or a blob that is missing or does not match its address. Unlike a torn tail
    (the last write cut short by a crash), what follows the damage was really done and
    paid for, so nothing is dropped and the run is neither reported nor resumed from a
    prefix; the message names the run and the first damaged event."""

    def __init__(self, run_id: str, seq: int, kind: str, reason: str, total: int) -> None:
        super().__init__(
            f"run {run_id}: journal corrupt at event {seq} of {total} ({kind}): {reason}; "
            "nothing was dropped or re-run (restore the store from a backup)"
        )
        self.run_id, self.seq, self.kind, self.reason = run_id, seq, kind, reason


class RunHeld(JournalError):
    """Another live process holds the run's lease; ``holder`` names it."""

    def __init__(self, message: str, holder: str) -> None:
        super().__init__(message)
        self.holder = holder


class LeaseLost(JournalError):
    """Another process took over this run (our lease expired while we were stalled). We
    must stop writing: its events and ours would interleave."""


@dataclass(frozen=True)
class JournalEvent:
    seq: int
    kind: str
    data: dict[str, Any]
    at: str  # ISO 8601 UTC, the writer's clock; one value for all events of one write
    damage: str | None = None  # why the stored record cannot be read (data is then empty)


#: Every final status a run's row can hold: ``stayer run``'s (``stayer.run.status_of``)
#: and the hosted runtime's ``cancelled`` (a run cancelled while no process ran it).
FINAL_STATUSES = ("succeeded", "failed", "budget_exhausted", "error", "cancelled")


@dataclass
class RunRow:
    id: str
    task: str
    model: str
    status: str  # running (or interrupted, see ``lease_live``), then the final status
    steps: int
    cost_usd: str  # decimal string, or "unknown"
    started: str
    updated: str
    header: dict[str, Any] = field(default_factory=dict)
    lease_owner: str | None = None
    lease_live: bool = False  # the lease has not expired (on the database's clock)

    def listing(self, status: str | None = None) -> RunListing:
        """The row as ``stayer runs`` lists it (``status``: as the lease makes it)."""
        return RunListing(
            id=self.id,
            task=self.task,
            model=self.model,
            status=self.status if status is None else status,
            steps=self.steps,
            cost=self.cost_usd,
            started=self.started,
            updated=self.updated,
        )


class RunListing(Record, kw_only=True):
    """A run as ``stayer runs`` lists it (``--json``: one of ``runs``)."""

    id: str
    task: str
    model: str
    status: str
    steps: int
    cost: str = msgspec.field(name="cost_usd")  # decimal string, or "unknown"
    started: str
    updated: str


class Tagged(msgspec.Struct, frozen=True):
    """A row's data with the keys that tag it (a team thread's name) after its own."""

    data: Record
    tags: dict[str, str]


def row_json(data: Record | Tagged) -> str:
    """The stored text of an event's data: compact JSON, ASCII-escaped, keys in the order
    the record declares them (a ``Tagged`` row's tags last): the one place a row is encoded."""
    tags = data.tags if isinstance(data, Tagged) else {}
    document = to_json(data.data if isinstance(data, Tagged) else data)
    return json.dumps({**document, **tags} if tags else document, separators=(",", ":"))


class RunUpdate(Record, kw_only=True):
    """What a write changes in the run's row besides ``updated``: its status, its steps and
    what it has spent (the total's text, or "unknown"); a field left out stays as it is."""

    status: str | UnsetType = UNSET
    steps: int | UnsetType = UNSET
    cost: str | UnsetType = msgspec.field(default=UNSET, name="cost_usd")

    def merged(self, later: RunUpdate) -> RunUpdate:
        """This update, then ``later`` (its fields win)."""
        given = {f: v for f in later.__struct_fields__ if (v := getattr(later, f)) is not UNSET}
        return msgspec.structs.replace(self, **given)


@dataclass
class PrunedRuns:
    """What ``Store.delete_runs`` deleted (or, on a dry run, would)."""

    runs: list[str] = field(default_factory=list)
    events: int = 0
    blobs: list[str] = field(default_factory=list)  # no remaining event refers to them
    blob_bytes: int = 0  # as stored (compressed)


class Store(Protocol):
    """Runs, their append-only events, and blobs. Every write is durable on return (see
    ``append`` for the one relaxation)."""

    location: str  # where it is, for messages (never contains a password)

    def create_run(self, row: RunRow, owner: str, ttl_s: float) -> None:
        """Insert ``row`` leased to ``owner``; JournalError if the id is taken."""

    def run(self, run_id: str) -> RunRow | None: ...

    def runs(self, limit: int | None = None) -> list[RunRow]:
        """Most recently started first."""

    def append(
        self,
        run_id: str,
        owner: str,
        first_seq: int,
        events: Sequence[tuple[str, Record | Tagged]],
        blobs: Mapping[str, bytes] = ...,
        update: RunUpdate | None = None,
        *,
        sync: bool = True,
    ) -> None:
        """Atomically store ``blobs`` and ``events`` (numbered from ``first_seq``) and apply
        ``update`` (the status, steps and cost_usd it sets) to the run row. LeaseLost if
        ``owner`` no longer holds the run. ``sync=False``: durable against the process
        dying on return, against a power cut only once a later synced append returns."""

    def events(self, run_id: str) -> list[JournalEvent]: ...

    def truncate(self, run_id: str, owner: str, after_seq: int) -> None:
        """Drop events numbered above ``after_seq`` (a torn tail found on resume)."""

    def delete_runs(self, run_ids: Sequence[str], *, dry_run: bool = False) -> PrunedRuns:
        """Delete these runs (rows, events), but not one with a live lease, and the blobs
        no remaining event refers to (``dry_run``: say which, delete nothing)."""

    def put_blobs(self, blobs: Mapping[str, bytes]) -> int:
        """Store blobs durably; returns the bytes newly stored."""

    def get_blob(self, address: str) -> bytes: ...

    def missing_blobs(self, addresses: Iterable[str]) -> set[str]: ...

    def blob_bytes(self, addresses: Iterable[str]) -> int:
        """Stored (compressed) size of those blobs that exist."""

    def claim(
        self, run_id: str, owner: str, ttl_s: float, is_dead: Callable[[str], bool]
    ) -> str | None:
        """Take the run's lease if it is free, expired, ours, or held by a process
        ``is_dead`` says has died. None when claimed; else the current holder."""

    def claim_next(self, owner: str, ttl_s: float) -> str | None:
        """Claim the least recently updated interrupted run (status running, lease expired);
        its id, or None. Safe with many concurrent claimers."""

    def renew(self, run_id: str, owner: str, ttl_s: float) -> bool: ...

    def release(self, run_id: str, owner: str) -> None: ...

    def snapshots(self) -> SnapshotStore:
        """Where this store's runs keep workspace snapshots: somewhere every process that
        can resume them can read."""

    def close(self) -> None: ...

"""The default store: SQLite in WAL mode at ``$STAYER_HOME/stayer.db``, large blobs as files
in ``$STAYER_HOME/blobs/``.

``synchronous=FULL``: a commit is on disk before it returns, so an event is durable before
the step that depends on it proceeds (NORMAL would survive a killed process but not a power
cut). SQLite never exposes a half-written transaction. Blobs up to ``INLINE_MAX`` stored
bytes (messages, most tool output) go into the blob table in the same transaction as the
events that refer to them: one fsync per step instead of one per blob, and SQLite reads
and writes small blobs faster than the file system does. Larger ones are files, written and
fsynced before the commit that refers to them (see ``FileBlobStore``).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from stayer.journal.blobs import FileBlobStore, encode
from stayer.journal.sql import SqlStore, schema
from stayer.journal.store import JournalError
from stayer.sqlite_tx import connect_private, immediate, private_dir

if TYPE_CHECKING:
    from stayer.workspace.snapshot import FileSnapshotStore, SnapshotStore

INLINE_MAX = 128 * 1024


class SqliteStore(SqlStore):
    NOW = "((julianday('now') - 2440587.5) * 86400.0)"
    EVENT_DATA = "CAST(data AS BLOB)"

    def __init__(self, path: Path, blobs_dir: Path) -> None:
        self.path = Path(path)
        self.location = str(self.path)
        self.blobs = FileBlobStore(blobs_dir)
        self._snapshots: FileSnapshotStore | None = None
        try:
            # Private: the runtime's tables (tenants' webhook secrets) are in it.
            self.conn = connect_private(self.path, isolation_level=None, timeout=30.0)
            private_dir(Path(blobs_dir))
            self.conn.execute("PRAGMA journal_mode=WAL")
            self.conn.execute("PRAGMA synchronous=FULL")
            with self._tx() as cur:
                for ddl in schema("BLOB"):
                    cur.execute(ddl)
                self._check_version(cur)
        except (sqlite3.Error, OSError) as e:
            raise JournalError(
                f"{self.path}: cannot open the journal database ({e}); move it aside or set "
                "STAYER_HOME to another directory"
            ) from None

    @contextmanager
    def _tx(self, *, sync: bool = True) -> Iterator[sqlite3.Cursor]:
        if not sync:  # WAL + NORMAL: appended to the log, fsynced by the next FULL commit
            self.conn.execute("PRAGMA synchronous=NORMAL")
        try:
            with immediate(self.conn) as cur:
                yield cur
        finally:
            if not sync:
                self.conn.execute("PRAGMA synchronous=FULL")

    def _read(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        return self.conn.execute(sql, tuple(params)).fetchall()

    def _store_blobs(self, cur: Any, blobs: Mapping[str, bytes]) -> int:
        small: list[tuple[str, bytes]] = []
        written = 0
        for address, data in blobs.items():
            stored = encode(data)
            if len(stored) <= INLINE_MAX:
                small.append((address, stored))
            else:
                # A file, fsynced before the transaction commits: an event never refers to
                # a blob that is not on disk.
                written += self.blobs.put_stored(address, stored)
        return written + self._insert_stored(cur, small)

    def _drop_blobs(self, cur: Any, addresses: Sequence[str]) -> None:
        # Files too, while this transaction holds the write lock: an append that would
        # find one present (and not rewrite it) waits for the lock.
        super()._drop_blobs(cur, addresses)
        for address in addresses:
            self.blobs.path(address).unlink(missing_ok=True)

    def get_blob(self, address: str) -> bytes:
        if self.blobs.has(address):
            return self.blobs.get(address)
        return super().get_blob(address)

    def missing_blobs(self, addresses: Iterable[str]) -> set[str]:
        return self.blobs.missing(super().missing_blobs(addresses))

    def blob_bytes(self, addresses: Iterable[str]) -> int:
        wanted = set(addresses)
        inline = self._blob_sizes(wanted)
        return sum(inline.values()) + sum(self.blobs.stored_size(a) for a in wanted - set(inline))

    def snapshots(self) -> SnapshotStore:
        # Local files beside the database, one store per journal store (it caches file
        # hashes across snapshots). Not fsynced: a snapshot only saves re-running tools. A
        # killed process loses nothing the kernel has; if a power cut takes a snapshot a
        # journal event names, resume falls back to an older one (or the task's own files)
        # and re-runs the journaled tool calls since, which the journal always has.
        if self._snapshots is None:
            from stayer.workspace.snapshot import FileSnapshotStore

            private_dir(self.path.parent / "snapshots")
            self._snapshots = FileSnapshotStore(self.path.parent / "snapshots")
        return self._snapshots

    def close(self) -> None:
        self.conn.close()

"""The SQL behind both stores: one implementation, two dialects (SQLite and PostgreSQL).

Statements are written with ``?`` placeholders; the Postgres store translates them. What
differs per dialect is small and named here: the database clock (``NOW``), row locking for
claims (``FOR UPDATE [SKIP LOCKED]``, which SQLite does not need: a write transaction
there locks the whole database), how a transaction starts, and (SQLite) which blobs go to
files instead of the blob table.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, TypeVar

from stayer.journal.blobs import BlobError, decode, encode
from stayer.journal.store import (
    SCHEMA_VERSION,
    JournalError,
    JournalEvent,
    LeaseLost,
    PrunedRuns,
    RunRow,
    RunUpdate,
    StoreUnavailable,
    Tagged,
    row_json,
)
from stayer.records import Record, to_json

if TYPE_CHECKING:
    from stayer.workspace.snapshot import SnapshotStore

RUN_COLUMNS = "id, task, model, status, steps, cost_usd, started, updated, header, lease_owner"
_UPDATABLE = ("status", "steps", "cost_usd")
_RUN_FIELDS = (*RUN_COLUMNS.split(", "), "lease_live")

T = TypeVar("T")


def record_of(
    cls: Callable[..., T], names: Sequence[str], row: Sequence[Any], **convert: Callable[[Any], Any]
) -> T:
    """A record from a row selected as ``names`` (each column a field of the same name);
    ``convert`` turns a column's stored value into the field's (JSON text, 0/1, …)."""
    values = dict(zip(names, row, strict=True))
    for name, to_field in convert.items():
        values[name] = to_field(values[name])
    return cls(**values)


def schema(blob_type: str) -> list[str]:
    ddl = [
        "CREATE TABLE IF NOT EXISTS stayer_meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)",
        """CREATE TABLE IF NOT EXISTS stayer_runs (
            id TEXT PRIMARY KEY,
            task TEXT NOT NULL,
            model TEXT NOT NULL,
            status TEXT NOT NULL,
            steps INTEGER NOT NULL DEFAULT 0,
            cost_usd TEXT NOT NULL DEFAULT '0',
            started TEXT NOT NULL,
            updated TEXT NOT NULL,
            header TEXT NOT NULL,
            lease_owner TEXT,
            lease_expires DOUBLE PRECISION
        )""",
        "CREATE INDEX IF NOT EXISTS stayer_runs_claim ON stayer_runs (status, updated)",
        """CREATE TABLE IF NOT EXISTS stayer_events (
            run_id TEXT NOT NULL,
            seq INTEGER NOT NULL,
            kind TEXT NOT NULL,
            data TEXT NOT NULL,
            at TEXT NOT NULL,
            PRIMARY KEY (run_id, seq)
        )""",
        f"CREATE TABLE IF NOT EXISTS stayer_blobs (hash TEXT PRIMARY KEY, data {blob_type} NOT NULL)",
        # Side-effecting tool calls, keyed by idempotency key (stayer.journal.effects).
        # The output is bytes (UTF-8): PostgreSQL's text cannot hold a NUL a tool gave.
        f"""CREATE TABLE IF NOT EXISTS stayer_effects (
            run_id TEXT NOT NULL,
            key TEXT NOT NULL,
            tool TEXT NOT NULL,
            args_hash TEXT NOT NULL,
            effects TEXT NOT NULL,
            state TEXT NOT NULL,
            sends INTEGER NOT NULL DEFAULT 1,
            output {blob_type},
            result TEXT,
            sent_at TEXT NOT NULL,
            done_at TEXT,
            PRIMARY KEY (run_id, key)
        )""",
    ]
    return ddl


def utc_now() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds")


class SqlStore:
    """Everything both backends do the same way. Subclasses provide the connection, the
    dialect constants and blob storage."""

    location: str
    NOW: str  # SQL expression: seconds since the epoch on the database's clock
    LOCK_ROW = ""  # appended to a SELECT that must lock the rows it returns
    LOCK_ROW_SKIP = ""
    # How an event's record is read: as stored (SQLite reads it as bytes, since a damaged
    # record need not even be UTF-8, which would fail the whole query as text).
    EVENT_DATA = "data"
    # The rest of the Store protocol, which each backend provides its own way (declared
    # here so that a SqlStore is a Store to the type checker).
    close: Callable[[], None]
    snapshots: Callable[[], SnapshotStore]

    # --- dialect hooks -----------------------------------------------------------------

    def _tx(self, *, sync: bool = True) -> AbstractContextManager[Any]:
        """A write transaction; yields something with ``execute(sql, params)``. With
        ``sync=False`` the commit is in the database's log when it returns (it survives
        the process) and on disk with the next synced commit (it may not survive a power
        cut before that)."""
        raise NotImplementedError

    def _read(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        raise NotImplementedError

    def _store_blobs(self, cur: Any, blobs: Mapping[str, bytes]) -> int:
        """Store blobs inside the transaction ``cur``; returns the bytes written. A blob
        sent again replaces the stored copy, so a damaged one heals the next time any run
        writes the same content (writers send only blobs new to their session)."""
        return self._insert_stored(cur, [(a, encode(d)) for a, d in blobs.items()])

    def _insert_stored(self, cur: Any, rows: list[tuple[str, bytes]]) -> int:
        """Blobs already in their stored form (:func:`encode`) into the blob table."""
        cur.executemany(
            "INSERT INTO stayer_blobs (hash, data) VALUES (?, ?) ON CONFLICT (hash) DO UPDATE SET data = excluded.data",
            rows,
        )
        return sum(len(stored) for _, stored in rows)

    # --- schema ------------------------------------------------------------------------

    def _lock_ddl(self, cur: Any) -> None:
        """Serialise schema creation with every other process opening the database (a
        SQLite write transaction already locks the whole database)."""

    def create_tables(self, ddl: Iterable[str], *, check_version: bool = False) -> None:
        """Run ``ddl`` (``CREATE … IF NOT EXISTS``) in one transaction under the schema
        lock the journal's own tables are created under: processes that open a fresh
        database at once neither race nor fail."""
        with self._tx() as cur:
            self._lock_ddl(cur)
            for statement in ddl:
                cur.execute(statement)
            if check_version:
                self._check_version(cur)

    def ping(self) -> None:
        """Raise unless the database answers (``StoreUnavailable`` when it is away)."""
        self._read("SELECT 1")

    def _check_version(self, cur: Any) -> None:
        row = cur.execute("SELECT value FROM stayer_meta WHERE key = 'schema_version'").fetchone()
        if row is None:
            cur.execute(
                "INSERT INTO stayer_meta (key, value) VALUES ('schema_version', ?)",
                (str(SCHEMA_VERSION),),
            )
            return
        try:
            version = int(row[0])
        except ValueError:
            raise JournalError(
                f"{self.location}: unreadable journal schema version {row[0]!r}"
            ) from None
        if version > SCHEMA_VERSION:
            raise JournalError(
                f"{self.location}: journal schema version {version} is newer than this stayer "
                f"supports ({SCHEMA_VERSION}); upgrade stayer to read it"
            )

    # --- runs --------------------------------------------------------------------------

    def create_run(self, row: RunRow, owner: str, ttl_s: float) -> None:
        with self._tx() as cur:
            # One statement, so that two processes creating one id at once (PostgreSQL
            # does not serialise a check and an insert) get this error, not a key violation.
            cur.execute(
                f"INSERT INTO stayer_runs ({RUN_COLUMNS}, lease_expires) "
                f"VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, {self.NOW} + ?) "
                "ON CONFLICT (id) DO NOTHING",
                (
                    row.id,
                    row.task,
                    row.model,
                    row.status,
                    row.steps,
                    row.cost_usd,
                    row.started,
                    row.updated,
                    json.dumps(row.header),
                    owner,
                    ttl_s,
                ),
            )
            if cur.rowcount != 1:
                raise JournalError(
                    f"--run-id {row.id}: a run with this id already exists in {self.location}"
                )

    def _select_runs(self, where: str, params: Sequence[Any]) -> list[RunRow]:
        live = f"CASE WHEN lease_owner IS NOT NULL AND lease_expires > {self.NOW} THEN 1 ELSE 0 END"
        rows = self._read(f"SELECT {RUN_COLUMNS}, {live} FROM stayer_runs {where}", params)
        return [
            record_of(RunRow, _RUN_FIELDS, r, steps=int, header=json.loads, lease_live=bool)
            for r in rows
        ]

    def run(self, run_id: str) -> RunRow | None:
        rows = self._select_runs("WHERE id = ?", (run_id,))
        return rows[0] if rows else None

    def runs(self, limit: int | None = None) -> list[RunRow]:
        if limit is None:
            return self._select_runs("ORDER BY started DESC, id", ())
        return self._select_runs("ORDER BY started DESC, id LIMIT ?", (limit,))

    # --- events ------------------------------------------------------------------------

    def _fence(self, cur: Any, run_id: str, owner: str, update: RunUpdate | None) -> None:
        sets, params = ["updated = ?"], [utc_now()]
        for key, value in (to_json(update) if update is not None else {}).items():
            if key not in _UPDATABLE:
                raise ValueError(f"run column {key!r} is not updatable")
            sets.append(f"{key} = ?")
            params.append(value)
        cur.execute(
            f"UPDATE stayer_runs SET {', '.join(sets)} WHERE id = ? AND lease_owner = ?",
            (*params, run_id, owner),
        )
        if cur.rowcount != 1:
            raise LeaseLost(
                f"run {run_id}: another process holds its lease now; this one stops writing"
            )

    def append(
        self,
        run_id: str,
        owner: str,
        first_seq: int,
        events: Sequence[tuple[str, Record | Tagged]],
        blobs: Mapping[str, bytes] | None = None,
        update: RunUpdate | None = None,
        *,
        sync: bool = True,
    ) -> None:
        # Microseconds: every write of a run gets its own ``at``, which is how ``load_log``
        # tells the last write (which a crash may have torn) from the ones before it.
        at = datetime.now(UTC).isoformat(timespec="microseconds")
        rows = [
            (run_id, first_seq + i, kind, row_json(data), at)
            for i, (kind, data) in enumerate(events)
        ]
        with self._tx(sync=sync) as cur:
            self._fence(cur, run_id, owner, update)
            if rows and first_seq > 0 and not self._has_event(cur, run_id, first_seq - 1):
                # A write acknowledged before the database crashed (``sync=False``) and lost
                # with it: appending after the gap would corrupt the journal.
                raise StoreUnavailable(
                    f"run {run_id}: the database lost the journal's last write ({first_seq - 1}) "
                    "in a crash; the run goes on from what it kept"
                )
            if blobs:
                self._store_blobs(cur, blobs)
            if rows:
                cur.executemany(
                    "INSERT INTO stayer_events (run_id, seq, kind, data, at) VALUES (?, ?, ?, ?, ?)",
                    rows,
                )

    @staticmethod
    def _has_event(cur: Any, run_id: str, seq: int) -> bool:
        found = cur.execute(
            "SELECT 1 FROM stayer_events WHERE run_id = ? AND seq = ?", (run_id, seq)
        ).fetchone()
        return found is not None

    def events(self, run_id: str) -> list[JournalEvent]:
        rows = self._read(
            f"SELECT seq, kind, {self.EVENT_DATA}, at FROM stayer_events WHERE run_id = ? ORDER BY seq",
            (run_id,),
        )
        out = []
        for seq, kind, data, at in rows:
            try:
                parsed = json.loads(data)
                if not isinstance(parsed, dict):
                    raise ValueError(f"a JSON {type(parsed).__name__}, not an object")
            except ValueError as e:
                # Returned, not skipped: whether it is a torn tail or corruption depends on
                # where it is (``load_log`` decides).
                out.append(JournalEvent(int(seq), kind, {}, at, damage=f"unreadable record ({e})"))
                continue
            out.append(JournalEvent(int(seq), kind, parsed, at))
        return out

    def delete_runs(self, run_ids: Sequence[str], *, dry_run: bool = False) -> PrunedRuns:
        """Delete these runs (their rows and events), except one whose lease is live (a
        process may be running it), and every blob they referred to that no other run's
        event refers to; in one write transaction. ``dry_run``: say what, delete nothing."""
        from stayer.journal.log import blob_refs

        def refs(rows: Iterable[Sequence[Any]]) -> set[str]:
            out: set[str] = set()
            for seq, kind, data in rows:
                try:
                    out.update(blob_refs(JournalEvent(int(seq), kind, json.loads(data), "")))
                except (ValueError, KeyError, TypeError):
                    continue  # a damaged record: nothing can be read through it
            return out

        live = f"lease_owner IS NOT NULL AND lease_expires > {self.NOW}"
        done = PrunedRuns()
        with self._tx() as cur:
            cur.execute(f"SELECT id FROM stayer_runs WHERE NOT ({live})")
            free = {r[0] for r in cur.fetchall()}
            done.runs = [r for r in dict.fromkeys(run_ids) if r in free]
            gone = set(done.runs)
            dropped: set[str] = set()
            for run_id in done.runs:
                cur.execute(
                    f"SELECT seq, kind, {self.EVENT_DATA} FROM stayer_events WHERE run_id = ?",
                    (run_id,),
                )
                rows = cur.fetchall()
                done.events += len(rows)
                dropped |= refs(rows)
            if dropped:
                cur.execute(f"SELECT run_id, seq, kind, {self.EVENT_DATA} FROM stayer_events")
                dropped -= refs(r[1:] for r in cur.fetchall() if r[0] not in gone)
            done.blobs = sorted(dropped)
            done.blob_bytes = self.blob_bytes(done.blobs)
            if not dry_run:
                for run_id in done.runs:
                    cur.execute("DELETE FROM stayer_events WHERE run_id = ?", (run_id,))
                    cur.execute("DELETE FROM stayer_effects WHERE run_id = ?", (run_id,))
                    cur.execute("DELETE FROM stayer_runs WHERE id = ?", (run_id,))
                self._drop_blobs(cur, done.blobs)
        return done

    def _drop_blobs(self, cur: Any, addresses: Sequence[str]) -> None:
        """Delete these blobs, inside the transaction ``cur``."""
        for part in chunked(addresses):
            marks = ", ".join("?" * len(part))
            cur.execute(f"DELETE FROM stayer_blobs WHERE hash IN ({marks})", tuple(part))

    def truncate(self, run_id: str, owner: str, after_seq: int) -> None:
        with self._tx() as cur:
            self._fence(cur, run_id, owner, None)
            cur.execute(
                "DELETE FROM stayer_events WHERE run_id = ? AND seq > ?", (run_id, after_seq)
            )

    # --- leases ------------------------------------------------------------------------

    def claim(
        self, run_id: str, owner: str, ttl_s: float, is_dead: Callable[[str], bool]
    ) -> str | None:
        with self._tx() as cur:
            row = cur.execute(
                f"SELECT lease_owner, CASE WHEN lease_expires > {self.NOW} THEN 1 ELSE 0 END "
                f"FROM stayer_runs WHERE id = ?{self.LOCK_ROW}",
                (run_id,),
            ).fetchone()
            if row is None:
                raise JournalError(f"run {run_id}: no such run in {self.location}")
            holder, live = row
            if holder is not None and live and holder != owner and not is_dead(holder):
                return str(holder)
            cur.execute(
                f"UPDATE stayer_runs SET lease_owner = ?, lease_expires = {self.NOW} + ?, updated = ? "
                "WHERE id = ?",
                (owner, ttl_s, utc_now(), run_id),
            )
        return None

    def claim_next(self, owner: str, ttl_s: float) -> str | None:
        return self._claim_first(
            "stayer_runs",
            f"status = 'running' AND (lease_owner IS NULL OR lease_expires <= {self.NOW})",
            "updated",
            f"lease_owner = ?, lease_expires = {self.NOW} + ?, updated = ?",
            (owner, ttl_s, utc_now()),
        )

    def _claim_first(
        self, table: str, claimable: str, order: str, lease: str, params: Sequence[Any]
    ) -> str | None:
        """In one transaction, the first row of ``table`` that is ``claimable`` (in ``order``;
        rows another claimer has locked are skipped) is updated by ``lease``, the ``SET``
        clauses taking ``params``. Its id, or None when no row is claimable."""
        with self._tx() as cur:
            row = cur.execute(
                f"SELECT id FROM {table} WHERE {claimable} "
                f"ORDER BY {order} LIMIT 1{self.LOCK_ROW_SKIP}",
                (),
            ).fetchone()
            if row is None:
                return None
            cur.execute(f"UPDATE {table} SET {lease} WHERE id = ?", (*params, row[0]))
        return str(row[0])

    def renew(self, run_id: str, owner: str, ttl_s: float) -> bool:
        with self._tx() as cur:
            cur.execute(
                f"UPDATE stayer_runs SET lease_expires = {self.NOW} + ? WHERE id = ? AND lease_owner = ?",
                (ttl_s, run_id, owner),
            )
            return bool(cur.rowcount == 1)

    def release(self, run_id: str, owner: str) -> None:
        with self._tx() as cur:
            cur.execute(
                "UPDATE stayer_runs SET lease_owner = NULL, lease_expires = NULL "
                "WHERE id = ? AND lease_owner = ?",
                (run_id, owner),
            )

    # --- blobs -------------------------------------------------------------------------

    def put_blobs(self, blobs: Mapping[str, bytes]) -> int:
        todo = {a: blobs[a] for a in self.missing_blobs(blobs)}
        if not todo:
            return 0
        with self._tx() as cur:
            return self._store_blobs(cur, todo)

    def get_blob(self, address: str) -> bytes:
        rows = self._read("SELECT data FROM stayer_blobs WHERE hash = ?", (address,))
        if not rows:
            raise BlobError(f"blob {address[:12]}: missing from {self.location}")
        return decode(bytes(rows[0][0]), address)

    def _blob_sizes(self, addresses: Iterable[str]) -> dict[str, int]:
        """Stored size of each of ``addresses`` that the table holds."""
        out: dict[str, int] = {}
        for part in chunked(sorted(set(addresses))):
            marks = ", ".join("?" * len(part))
            rows = self._read(
                f"SELECT hash, length(data) FROM stayer_blobs WHERE hash IN ({marks})", part
            )
            out.update((h, int(n)) for h, n in rows)
        return out

    def missing_blobs(self, addresses: Iterable[str]) -> set[str]:
        wanted = set(addresses)
        return wanted - set(self._blob_sizes(wanted))

    def blob_bytes(self, addresses: Iterable[str]) -> int:
        return sum(self._blob_sizes(addresses).values())


def chunked(items: Sequence[str], n: int = 500) -> Iterator[Sequence[str]]:
    for i in range(0, len(items), n):
        yield items[i : i + n]

"""The runtime's tables, beside the journal's in the same database, and the run queue.

``stayer_tenants``: a tenant's name, the SHA-256 of its API key and its webhook signing
secret. Keys are 256-bit random tokens, so a fast hash is enough (there is nothing to
brute-force) and a stolen database yields no usable key.

``stayer_service_runs``: what was asked (the request, as JSON), by which tenant, and where
the run stands: status, stop reason and the totals of its result, the worker holding it and
until when (a lease on the database's clock, as the journal's), whether a person asked to
cancel it, and the tenant-budget hold that funds it. A worker claims the oldest queued run,
or a running one whose worker's lease expired (it died); the journal then resumes it.

Both backends share the journal's SQL layer (``stayer.journal.sql.SqlStore``): statements
use ``?`` placeholders and the dialect's ``NOW`` and row locks.
"""

from __future__ import annotations

import hashlib
import json
import secrets
from dataclasses import dataclass, field
from decimal import Decimal
from typing import TYPE_CHECKING, Any

import msgspec
from msgspec import UNSET, UnsetType

from stayer.errors import ConfigError
from stayer.journal.sql import SqlStore, record_of, utc_now
from stayer.journal.store import FINAL_STATUSES, JournalEvent
from stayer.ledger import TokenTotals
from stayer.records import Record, decode, to_json
from stayer.settings import RunSettings

if TYPE_CHECKING:
    from stayer.run import InboxMessage

QUEUED, RUNNING, PAUSED, CANCELLED, ERROR = "queued", "running", "paused", "cancelled", "error"
REQUIRES_ACTION = "requires_action"
TERMINAL = frozenset(FINAL_STATUSES)
STATUSES = (QUEUED, RUNNING, REQUIRES_ACTION, PAUSED, *FINAL_STATUSES)

_DDL = [
    """CREATE TABLE IF NOT EXISTS stayer_tenants (
        name TEXT PRIMARY KEY,
        key_hash TEXT NOT NULL UNIQUE,
        webhook_secret TEXT NOT NULL,
        created_at TEXT NOT NULL
    )""",
    """CREATE TABLE IF NOT EXISTS stayer_service_runs (
        id TEXT PRIMARY KEY,
        tenant TEXT NOT NULL,
        task TEXT NOT NULL,
        model TEXT NOT NULL,
        request TEXT NOT NULL,
        status TEXT NOT NULL,
        stop_reason TEXT,
        steps INTEGER NOT NULL DEFAULT 0,
        cost_usd TEXT NOT NULL DEFAULT '0',
        reward DOUBLE PRECISION,
        error TEXT,
        created_at TEXT NOT NULL,
        updated_at TEXT NOT NULL,
        worker TEXT,
        lease_expires DOUBLE PRECISION,
        cancel_requested INTEGER NOT NULL DEFAULT 0,
        budget_hold INTEGER,
        run_cap TEXT,
        usage TEXT,
        paused_on TEXT,
        held TEXT
    )""",
    """CREATE TABLE IF NOT EXISTS stayer_messages (
        run_id TEXT NOT NULL,
        n INTEGER NOT NULL,
        content TEXT NOT NULL,
        created_at TEXT NOT NULL,
        PRIMARY KEY (run_id, n)
    )""",
    # Tasks tenants uploaded: the archive is a blob of the journal's (stayer.runtime.uploads).
    """CREATE TABLE IF NOT EXISTS stayer_uploads (
        tenant TEXT NOT NULL,
        name TEXT NOT NULL,
        archive TEXT NOT NULL,
        files INTEGER NOT NULL,
        created_at TEXT NOT NULL,
        PRIMARY KEY (tenant, name)
    )""",
    # A tenant's Idempotency-Key: the run its first request created, and that request's
    # digest (a retry must send the same body).
    """CREATE TABLE IF NOT EXISTS stayer_idempotency (
        tenant TEXT NOT NULL,
        key TEXT NOT NULL,
        digest TEXT NOT NULL,
        run_id TEXT NOT NULL,
        created_at TEXT NOT NULL,
        PRIMARY KEY (tenant, key)
    )""",
    # A tenant's settings for ``stayer gateway``: its sessions' default cap (USD) and
    # where its cache-miss webhooks go.
    """CREATE TABLE IF NOT EXISTS stayer_gateway_tenants (
        tenant TEXT PRIMARY KEY,
        session_max_cost TEXT,
        webhook TEXT
    )""",
    "CREATE INDEX IF NOT EXISTS stayer_service_runs_queue ON stayer_service_runs (status, created_at)",
    "CREATE INDEX IF NOT EXISTS stayer_service_runs_tenant ON stayer_service_runs (tenant, created_at)",
    # The rows that still name a hold (``unsettled``): few, looked for by every idle worker.
    "CREATE INDEX IF NOT EXISTS stayer_service_runs_holds ON stayer_service_runs (budget_hold) "
    "WHERE budget_hold IS NOT NULL",
]

#: The largest journal event number (``seq`` is an INTEGER: 32 bits in PostgreSQL).
MAX_SEQ = 2**31 - 1

_COLUMNS = (
    "id, tenant, task, model, request, status, stop_reason, steps, cost_usd, reward, error, "
    "created_at, updated_at, worker, cancel_requested, budget_hold, run_cap, usage, paused_on, held"
)
_FIELDS = _COLUMNS.split(", ")  # ServiceRun's, in the same order
# What a worker may write to its run's row (never the tenant, the request or the id).
_WRITABLE = frozenset(
    {
        "status",
        "stop_reason",
        "steps",
        "cost_usd",
        "reward",
        "error",
        "budget_hold",
        "run_cap",
        "usage",
        "paused_on",
        "held",
    }
)


class IdempotencyClash(Exception):
    """An Idempotency-Key sent again with another request; args[0]: the key's run."""


def key_hash(api_key: str) -> str:
    return hashlib.sha256(api_key.encode()).hexdigest()


class RunRequest(Record, kw_only=True):
    """What a tenant asked for (``RunCreate``, as validated), stored as the run's
    ``request`` column, with ``max_cost_default`` (the server's cap then) for a run
    without a cap of its own. Fields in RunCreate's order: the column's JSON is
    ``json.dumps`` of its document. A row stored before a field existed reads it as its
    default."""

    task: str = ""
    model: str = ""
    max_cost: str | None = None  # Decimal USD as text
    max_steps: int = RunSettings.max_steps
    policy: str = RunSettings.policy
    sim_policy: str | None = None
    sim_latency: float = 0.0
    webhook: str | None = None
    metadata: dict[str, str] = msgspec.field(default_factory=dict)
    team: dict[str, Any] | None = None  # team.toml's contents: the user's config
    mcp_servers: dict[str, dict[str, Any]] | None = None  # [mcp.servers]: the user's config
    mcp_tools: str = RunSettings.mcp_tools
    confirm_tools: list[str] = msgspec.field(default_factory=list)
    max_cost_default: str | UnsetType = UNSET


@dataclass
class ServiceRun:
    id: str
    tenant: str
    task: str
    model: str
    request: RunRequest
    status: str
    stop_reason: str | None = None
    steps: int = 0
    cost_usd: str = "0"
    reward: float | None = None
    error: str | None = None
    created_at: str = ""
    updated_at: str = ""
    worker: str | None = None
    cancel_requested: bool = False
    budget_hold: int | None = None  # the tenant-budget reservation funding the run
    run_cap: str | None = None  # the run's own cap as held from the tenant's budget
    usage: TokenTotals = field(default_factory=TokenTotals)
    paused_on: str | None = (
        None  # "tenant": its budget could not hold the run's cap; "run": the run reached its cap
    )
    held: str | None = None  # the amount ``budget_hold`` holds

    @property
    def terminal(self) -> bool:
        return self.status in TERMINAL


@dataclass(frozen=True)
class GatewayKey:
    """What ``stayer gateway`` needs to know of a key, read in one query."""

    tenant: str
    key_hash: str
    webhook_secret: str
    session_max_cost: Decimal | None  # the tenant's default cap of a session
    webhook: str | None  # where the tenant's cache-miss webhooks go


_UNCHANGED: Any = object()


class ServiceDB:
    """The runtime's rows in the journal's database ``store``."""

    def __init__(self, store: SqlStore) -> None:
        self.store = store
        store.create_tables(_DDL)

    # --- tenants -------------------------------------------------------------------------

    def create_tenant(self, name: str) -> str:
        """Add tenant ``name``; returns its API key, which is shown once and never stored."""
        api_key = "sk-stayer-" + secrets.token_urlsafe(32)
        with self.store._tx() as cur:
            if cur.execute("SELECT 1 FROM stayer_tenants WHERE name = ?", (name,)).fetchone():
                raise ConfigError(
                    f"tenant {name!r}: already exists; `stayer tenants list` shows the tenants"
                )
            cur.execute(
                "INSERT INTO stayer_tenants (name, key_hash, webhook_secret, created_at) VALUES (?, ?, ?, ?)",
                (name, key_hash(api_key), secrets.token_hex(32), utc_now()),
            )
        return api_key

    def tenant_for_key(self, api_key: str) -> str | None:
        rows = self.store._read(
            "SELECT name FROM stayer_tenants WHERE key_hash = ?", (key_hash(api_key),)
        )
        return str(rows[0][0]) if rows else None

    def gateway_key(self, api_key: str) -> GatewayKey | None:
        rows = self.store._read(
            "SELECT t.name, t.key_hash, t.webhook_secret, g.session_max_cost, g.webhook "
            "FROM stayer_tenants t LEFT JOIN stayer_gateway_tenants g ON g.tenant = t.name "
            "WHERE t.key_hash = ?",
            (key_hash(api_key),),
        )
        if not rows:
            return None
        name, digest, secret, cap, webhook = rows[0]
        cap = None if cap is None else Decimal(cap)
        return GatewayKey(str(name), str(digest), str(secret), cap, webhook)

    def tenant_key_hash(self, name: str) -> str | None:
        rows = self.store._read("SELECT key_hash FROM stayer_tenants WHERE name = ?", (name,))
        return str(rows[0][0]) if rows else None

    def gateway_settings(self, name: str) -> tuple[Decimal | None, str | None]:
        """The tenant's (default session cap, cache-miss webhook) for ``stayer gateway``."""
        rows = self.store._read(
            "SELECT session_max_cost, webhook FROM stayer_gateway_tenants WHERE tenant = ?",
            (name,),
        )
        if not rows:
            return None, None
        cap, webhook = rows[0]
        return (None if cap is None else Decimal(cap)), webhook

    def set_gateway_settings(
        self, name: str, *, session_max_cost: Any = _UNCHANGED, webhook: Any = _UNCHANGED
    ) -> tuple[Decimal | None, str | None]:
        """Change what is given (None: unset); returns the settings as they are now."""
        cap, url = self.gateway_settings(name)
        cap = cap if session_max_cost is _UNCHANGED else session_max_cost
        url = url if webhook is _UNCHANGED else webhook
        with self.store._tx() as cur:
            cur.execute(
                "INSERT INTO stayer_gateway_tenants (tenant, session_max_cost, webhook) "
                "VALUES (?, ?, ?) ON CONFLICT (tenant) DO UPDATE SET "
                "session_max_cost = excluded.session_max_cost, webhook = excluded.webhook",
                (name, None if cap is None else str(cap), url),
            )
        return cap, url

    def tenant_exists(self, name: str) -> bool:
        return bool(self.store._read("SELECT 1 FROM stayer_tenants WHERE name = ?", (name,)))

    def tenants(self) -> list[tuple[str, str]]:
        """(name, created_at), by name."""
        return [
            (str(n), str(c))
            for n, c in self.store._read(
                "SELECT name, created_at FROM stayer_tenants ORDER BY name"
            )
        ]

    def webhook_secret(self, name: str) -> str | None:
        rows = self.store._read("SELECT webhook_secret FROM stayer_tenants WHERE name = ?", (name,))
        return str(rows[0][0]) if rows else None

    # --- runs ----------------------------------------------------------------------------

    def insert_run(
        self,
        run_id: str,
        tenant: str,
        task: str,
        model: str,
        request: RunRequest,
        idempotency: tuple[str, str] | None = None,
    ) -> tuple[ServiceRun, bool]:
        """Queue a run; (the run, True). With ``idempotency`` (the tenant's key, the
        request's digest), a key the tenant used before gives (that run, False) instead,
        in the same transaction, so concurrent duplicates create one run; IdempotencyClash
        when its request had another digest."""
        created = True
        now = utc_now()
        with self.store._tx() as cur:
            if idempotency is not None:
                key, request_digest = idempotency
                cur.execute(
                    "INSERT INTO stayer_idempotency (tenant, key, digest, run_id, created_at) "
                    "VALUES (?, ?, ?, ?, ?) ON CONFLICT (tenant, key) DO NOTHING",
                    (tenant, key, request_digest, run_id, now),
                )
                if cur.rowcount != 1:
                    # The key of an earlier request, committed with its run (a concurrent
                    # duplicate waits on the key's row until that request's transaction ends).
                    first = cur.execute(
                        "SELECT digest, run_id FROM stayer_idempotency WHERE tenant = ? AND key = ?",
                        (tenant, key),
                    ).fetchone()
                    if first[0] != request_digest:
                        raise IdempotencyClash(str(first[1]))
                    run_id, created = str(first[1]), False
            if created:
                if cur.execute(
                    "SELECT 1 FROM stayer_service_runs WHERE id = ?", (run_id,)
                ).fetchone():
                    raise ConfigError(f"run {run_id}: already exists")
                cur.execute(
                    "INSERT INTO stayer_service_runs (id, tenant, task, model, request, status, created_at, updated_at) "
                    "VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                    (run_id, tenant, task, model, json.dumps(to_json(request)), QUEUED, now, now),
                )
        run = self.run(run_id)
        assert run is not None
        return run, created

    def idempotent(self, tenant: str, key: str) -> tuple[str, str] | None:
        """The (request digest, run id) of the tenant's Idempotency-Key, if it was used."""
        rows = self.store._read(
            "SELECT digest, run_id FROM stayer_idempotency WHERE tenant = ? AND key = ?",
            (tenant, key),
        )
        return (str(rows[0][0]), str(rows[0][1])) if rows else None

    def _rows(self, where: str, params: tuple[Any, ...]) -> list[ServiceRun]:
        rows = self.store._read(f"SELECT {_COLUMNS} FROM stayer_service_runs {where}", params)
        return [
            record_of(
                ServiceRun,
                _FIELDS,
                r,
                request=lambda v: decode(v, RunRequest),
                steps=int,
                cancel_requested=bool,
                budget_hold=lambda v: None if v is None else int(v),
                usage=lambda v: decode(v, TokenTotals) if v else TokenTotals(),
            )
            for r in rows
        ]

    def run(self, run_id: str, tenant: str | None = None) -> ServiceRun | None:
        """The run, or None; with ``tenant``, None also when it belongs to another tenant
        (the API answers 404 either way, so ids of other tenants' runs leak nothing)."""
        found = self._rows("WHERE id = ?", (run_id,))
        if not found or (tenant is not None and found[0].tenant != tenant):
            return None
        return found[0]

    def runs(
        self, tenant: str, status: str | None = None, limit: int = 50, after: str | None = None
    ) -> list[ServiceRun]:
        """The tenant's runs, newest first; ``after`` (a run id, the cursor) continues a page."""
        where, params = ["tenant = ?"], [tenant]
        if status is not None:
            where.append("status = ?")
            params.append(status)
        if after is not None:
            # The cursor is one of the tenant's own runs: another's id pages like a made-up
            # one (nothing), so a cursor cannot tell whether another tenant's run exists.
            mark = "(SELECT created_at FROM stayer_service_runs WHERE id = ? AND tenant = ?)"
            where.append(f"(created_at < {mark} OR (created_at = {mark} AND id < ?))")
            params += [after, tenant, after, tenant, after]
        return self._rows(
            f"WHERE {' AND '.join(where)} ORDER BY created_at DESC, id DESC LIMIT ?",
            (*params, limit),
        )

    def all_runs(self) -> list[ServiceRun]:
        """Every run (the metrics' totals)."""
        return self._rows("ORDER BY created_at", ())

    def active_runs(self) -> list[ServiceRun]:
        return self._rows(
            f"WHERE status IN ('queued', 'running', 'paused', '{REQUIRES_ACTION}')", ()
        )

    def seconds_since(self, iso: str) -> float:
        from datetime import UTC, datetime

        return max((datetime.now(UTC) - datetime.fromisoformat(iso)).total_seconds(), 0.0)

    def request_cancel(self, run_id: str) -> tuple[str, str]:
        """Cancel: a run no worker holds (queued, paused, awaiting a person) ends at once;
        a running one is told to stop (its worker sees the flag within a step). Returns
        (status before, status after)."""
        with self.store._tx() as cur:
            row = cur.execute(
                f"SELECT status FROM stayer_service_runs WHERE id = ?{self.store.LOCK_ROW}",
                (run_id,),
            ).fetchone()
            if row is None:
                raise KeyError(run_id)
            status = str(row[0])
            if status in TERMINAL:
                return status, status
            if status in (QUEUED, PAUSED, REQUIRES_ACTION):
                cur.execute(
                    "UPDATE stayer_service_runs SET status = ?, stop_reason = 'cancelled', updated_at = ? WHERE id = ?",
                    (CANCELLED, utc_now(), run_id),
                )
                return status, CANCELLED
            cur.execute(
                "UPDATE stayer_service_runs SET cancel_requested = 1, updated_at = ? WHERE id = ?",
                (utc_now(), run_id),
            )
            return status, status

    def record_result(self, run_id: str, **values: Any) -> None:
        """Totals of a run that ended while no worker held it (the API cancelled it)."""
        bad = set(values) - _WRITABLE
        if bad:
            raise ValueError(f"not writable: {sorted(bad)}")
        sets = ", ".join(f"{k} = ?" for k in values)
        with self.store._tx() as cur:
            cur.execute(
                f"UPDATE stayer_service_runs SET {sets} WHERE id = ?", (*values.values(), run_id)
            )

    def raise_run_cap(self, run_id: str, cap: str) -> bool:
        """A larger cap for a run no worker holds (the worker that next takes it grows the
        tenant-budget hold to it); a run paused at its cap is queued again."""
        with self.store._tx() as cur:
            cur.execute(
                "UPDATE stayer_service_runs SET run_cap = ?, updated_at = ?, "
                "status = CASE WHEN status = 'paused' THEN 'queued' ELSE status END "
                "WHERE id = ? AND status IN ('queued', 'paused', 'requires_action')",
                (cap, utc_now(), run_id),
            )
            return cur.rowcount == 1

    def resume_after_decision(self, run_id: str) -> bool:
        """A run that waited for a person goes back to the queue."""
        return self._requeue("id = ? AND status = 'requires_action'", run_id) == 1

    def paused_on_tenant(self) -> list[ServiceRun]:
        """Runs waiting for room in their tenant's budget, oldest first."""
        return self._rows(
            "WHERE status = 'paused' AND paused_on = 'tenant' ORDER BY created_at, id", ()
        )

    def requeue_run(self, run_id: str) -> int:
        """A run paused on its tenant's budget goes back to the queue (1; 0 if it was not
        waiting so any more)."""
        return self._requeue("id = ? AND status = 'paused' AND paused_on = 'tenant'", run_id)

    def unsettled(self) -> list[ServiceRun]:
        """Ended runs whose tenant-budget hold the row still names (``clear_hold`` not
        called yet: settled, or left open by a process that died before settling it)."""
        ended = ", ".join(f"'{s}'" for s in sorted(TERMINAL))
        return self._rows(f"WHERE budget_hold IS NOT NULL AND status IN ({ended})", ())

    def clear_hold(self, run_id: str, hold_id: int) -> None:
        """The ended run's hold is settled: the row stops naming it."""
        with self.store._tx() as cur:
            cur.execute(
                "UPDATE stayer_service_runs SET budget_hold = NULL WHERE id = ? AND budget_hold = ?",
                (run_id, hold_id),
            )

    def requeue_paused(self, tenant: str) -> int:
        """Runs paused on the tenant's budget go back to the queue (its cap was raised)."""
        return self._requeue("tenant = ? AND status = 'paused' AND paused_on = 'tenant'", tenant)

    def _requeue(self, where: str, key: str) -> int:
        """The runs that match ``where`` (one ``?``: ``key``) back to the queue; how many."""
        with self.store._tx() as cur:
            cur.execute(
                "UPDATE stayer_service_runs SET status = 'queued', stop_reason = NULL, updated_at = ? "
                f"WHERE {where}",
                (utc_now(), key),
            )
            return int(cur.rowcount)

    # --- what people say to a run -------------------------------------------------------

    def add_message(self, run_id: str, content: str) -> int:
        """Queue a person's message for the run's next step; its number (from 1)."""
        with self.store._tx() as cur:
            row = cur.execute(
                f"SELECT status FROM stayer_service_runs WHERE id = ?{self.store.LOCK_ROW}",
                (run_id,),
            ).fetchone()
            if row is None or row[0] in TERMINAL:
                raise ValueError(f"run {run_id} has ended; it takes no more messages")
            top = cur.execute(
                "SELECT MAX(n) FROM stayer_messages WHERE run_id = ?", (run_id,)
            ).fetchone()
            n = 1 + (int(top[0]) if top and top[0] is not None else 0)
            cur.execute(
                "INSERT INTO stayer_messages (run_id, n, content, created_at) VALUES (?, ?, ?, ?)",
                (run_id, n, content, utc_now()),
            )
            return n

    def messages_after(self, run_id: str, after: int) -> list[InboxMessage]:
        from stayer.run import InboxMessage  # (the loop's side: loaded by a worker only)

        rows = self.store._read(
            "SELECT n, content, created_at FROM stayer_messages WHERE run_id = ? AND n > ? ORDER BY n",
            (run_id, after),
        )
        return [InboxMessage(n=int(n), content=c, created_at=at) for n, c, at in rows]

    # --- the queue (workers) -------------------------------------------------------------

    def claim_next(self, owner: str, ttl_s: float) -> ServiceRun | None:
        """Lease the oldest queued run, or a running one whose worker stopped renewing (or
        handed it back), to ``owner``. One lease: in the same transaction the run's journal
        lease passes to ``owner`` too (from the worker whose lease expired), so the journal
        reopens it at once, on any host, instead of refusing it as another's."""
        now = self.store.NOW
        with self.store._tx() as cur:
            row = cur.execute(
                "SELECT id, worker FROM stayer_service_runs WHERE status = 'queued' "
                f"OR (status = 'running' AND (lease_expires IS NULL OR lease_expires <= {now})) "
                f"ORDER BY created_at, id LIMIT 1{self.store.LOCK_ROW_SKIP}",
                (),
            ).fetchone()
            if row is None:
                return None
            run_id, previous = str(row[0]), row[1]
            cur.execute(
                f"UPDATE stayer_service_runs SET status = 'running', worker = ?, "
                f"lease_expires = {now} + ?, updated_at = ? WHERE id = ?",
                (owner, ttl_s, utc_now(), run_id),
            )
            cur.execute(
                f"UPDATE stayer_runs SET lease_owner = ?, lease_expires = {now} + ? WHERE id = ? "
                f"AND (lease_owner IS NULL OR lease_owner = ? OR lease_expires <= {now})",
                (owner, ttl_s, run_id, previous),
            )
        return self.run(run_id)

    def renew(self, run_id: str, worker: str, ttl_s: float) -> tuple[bool, bool]:
        """Extend the lease (the run's and its journal's, one lease). Returns (still ours,
        cancel requested)."""
        with self.store._tx() as cur:
            cur.execute(
                f"UPDATE stayer_service_runs SET lease_expires = {self.store.NOW} + ? WHERE id = ? AND worker = ?",
                (ttl_s, run_id, worker),
            )
            ours = cur.rowcount == 1
            if ours:
                cur.execute(
                    f"UPDATE stayer_runs SET lease_expires = {self.store.NOW} + ? "
                    "WHERE id = ? AND lease_owner = ?",
                    (ttl_s, run_id, worker),
                )
            row = cur.execute(
                "SELECT cancel_requested FROM stayer_service_runs WHERE id = ?", (run_id,)
            ).fetchone()
        return ours, bool(row and row[0])

    def hand_back(self, run_id: str, worker: str, *, after_journal_lease: bool = False) -> bool:
        """Give a running run up unfinished (a draining worker, a database that was away):
        its lease and its journal's are released, so another worker resumes it from its
        journal at once. ``after_journal_lease``: not before the journal's lease, held by
        another process, expires. False if ``worker`` no longer held it."""
        now = self.store.NOW
        until = (
            f"(SELECT lease_expires FROM stayer_runs WHERE id = ? AND lease_expires > {now})"
            if after_journal_lease
            else "NULL"
        )
        with self.store._tx() as cur:
            cur.execute(
                f"UPDATE stayer_service_runs SET worker = NULL, lease_expires = {until}, "
                "updated_at = ? WHERE id = ? AND worker = ? AND status = 'running'",
                ((run_id,) if after_journal_lease else ()) + (utc_now(), run_id, worker),
            )
            ours = cur.rowcount == 1
            cur.execute(
                "UPDATE stayer_runs SET lease_owner = NULL, lease_expires = NULL "
                "WHERE id = ? AND lease_owner = ?",
                (run_id, worker),
            )
            return ours

    def update(self, run_id: str, worker: str, *, release: bool = False, **values: Any) -> bool:
        """Write the run's status and totals, only while ``worker`` holds it; ``release``
        gives the lease up (a finished or paused run). False if another worker took over."""
        bad = set(values) - _WRITABLE
        if bad:
            raise ValueError(f"not writable by a worker: {sorted(bad)}")
        sets = [f"{k} = ?" for k in values] + ["updated_at = ?"]
        params: list[Any] = [*values.values(), utc_now()]
        if release:
            sets += ["worker = NULL", "lease_expires = NULL"]
        with self.store._tx() as cur:
            cur.execute(
                f"UPDATE stayer_service_runs SET {', '.join(sets)} WHERE id = ? AND worker = ?",
                (*params, run_id, worker),
            )
            return cur.rowcount == 1

    # --- the journal, read for the event stream -------------------------------------------

    def journal_tail(self, run_id: str) -> tuple[int, bool]:
        """The public id of the run's newest journal event (0: none yet, see ``events``),
        and whether the journal holds the run's final status."""
        rows = self.store._read(
            "SELECT MAX(seq), SUM(CASE WHEN kind = 'run_finished' THEN 1 ELSE 0 END) FROM stayer_events WHERE run_id = ?",
            (run_id,),
        )
        top, finished = rows[0] if rows else (None, None)
        return (0 if top is None else int(top) + 1), bool(finished)

    def events_after(self, run_id: str, after_seq: int, limit: int = 500) -> list[JournalEvent]:
        """Journal events of ``run_id`` numbered above ``after_seq``, oldest first."""
        after_seq = max(min(after_seq, MAX_SEQ), -1)  # a number both databases can compare
        rows = self.store._read(
            "SELECT seq, kind, data, at FROM stayer_events WHERE run_id = ? AND seq > ? ORDER BY seq LIMIT ?",
            (run_id, after_seq, limit),
        )
        out = []
        for seq, kind, data, at in rows:
            try:
                parsed = json.loads(data)
            except ValueError:
                break  # a damaged record: the stream stops before it, like the journal's reader
            out.append(JournalEvent(int(seq), str(kind), parsed, str(at)))
        return out

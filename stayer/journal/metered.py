"""A metered session's ledger in the journal (calls through ``stayer gateway`` or a client
wrapped by ``stayer.meter``): one journal run per session, one ``step`` event per call, in
the ledger entry shape of a run's step, so that ``stayer report ID``, ``stayer runs`` and
the dashboard read a session as they read a run.

A session's row has status ``open`` (never ``running``: no worker may claim it) and is
written by every gateway process under one owner name; an append that loses a race for a
sequence number reads the tail again and retries. A session belongs to the tenant that
opened it: another tenant's call naming it is refused.
"""

from __future__ import annotations

import hashlib
import re
import threading
from decimal import Decimal

import msgspec

from stayer.journal.steps import StepEntryRecord
from stayer.journal.store import JournalError, RunRow, RunUpdate, Store
from stayer.ledger import LedgerEntry
from stayer.money import Usd

OWNER = "stayer-gateway"
STATUS = "open"
TRIPPED = "tripped"  # a breaker stopped the session: its calls are refused
_LEASE_S = 100 * 365 * 86400.0  # a session stays open; nothing claims it
_SAFE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:-]{0,127}")


class SessionRefused(Exception):
    """The session named is not this tenant's."""


def session_id(raw: str) -> str:
    """A client's session signal as a run id: kept when it is a plain id, else hashed."""
    if _SAFE.fullmatch(raw):
        return raw
    return "gw-" + hashlib.sha256(raw.encode()).hexdigest()[:32]


class SessionLedger:
    def __init__(self, store: Store) -> None:
        self.store = store
        self._lock = threading.Lock()
        self._next: dict[str, int] = {}

    def open(self, tenant: str, session: str, model: str, now: str) -> RunRow:
        row = self.store.run(session)
        if row is None:
            row = RunRow(
                session, f"gateway:{tenant}", model, STATUS, 0, "0", now, now,
                header={"kind": "gateway_session", "tenant": tenant},
            )  # fmt: skip
            try:
                self.store.create_run(row, OWNER, _LEASE_S)
            except JournalError:  # opened by another process meanwhile
                row = self.store.run(session) or row
        if row.header.get("kind") != "gateway_session" or row.header.get("tenant") != tenant:
            raise SessionRefused(f"session {session!r} is not available to this key")
        return row

    def record(
        self, tenant: str, session: str, entry: LedgerEntry, now: str, status: str | None = None
    ) -> int:
        """Append ``entry`` as the session's next step; returns its step number."""
        with self._lock:
            for _ in range(50):  # a race per try at most: another process took the number
                seq = self._next.get(session)
                if seq is None:
                    seq = self._next[session] = len(self.store.events(session))
                step = seq + 1
                row = self.store.run(session)
                total = Usd.parse(row.cost_usd) if row else Usd(Decimal(0))
                cost = Usd(entry.cost.total)
                done = StepEntryRecord(step, msgspec.structs.replace(entry, step=step))
                try:  # the lease, taken for a century at open, is never renewed
                    self.store.append(
                        session,
                        OWNER,
                        seq,
                        [("step", done)],
                        update=RunUpdate(
                            steps=step,
                            cost=(total + cost).to_json(),
                            status=status or (row.status if row else STATUS),
                        ),
                    )
                except Exception:  # noqa: BLE001 - the number was taken: read the tail again
                    self._next.pop(session, None)
                    continue
                self._next[session] = seq + 1
                return step
        raise JournalError(f"session {session}: could not append its ledger entry")

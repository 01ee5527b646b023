"""Side effects that happen once: a side-effecting tool call's intent is committed before
it is sent and its result after, in the table ``stayer_effects`` beside the journal, both
synchronously (fsync on SQLite, a synchronous commit on PostgreSQL).

Rows are keyed by run and idempotency key (``stayer.tools.effects.CallRef``), which every
resume and every worker derives alike. :func:`call_once` is what ``JournaledTool`` runs for
a side-effecting call that the event journal holds no result for:

* a row with a result (``done`` or ``unknown``): that result, the call is not sent again;
* a row with only the intent (``sent``: the process died with the call in flight): sent
  again with the same key if the tool is ``idempotent``; otherwise not sent, and the agent
  gets a tool error saying the outcome is unknown and must be checked (kept as the result),
  and the journal an ``outcome_unknown`` record (``stayer.ledger.OutcomeUnknown``, once);
* no row: the intent is committed (fenced by the run's lease: a worker that lost the run
  sends nothing), the call is sent, and its result committed before the agent sees it.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from stayer.journal.codec import canonical
from stayer.journal.sql import SqlStore, utc_now
from stayer.ledger import OutcomeUnknown
from stayer.messages import Effects
from stayer.records import decode, to_json
from stayer.tools.base import ResultFields, ToolContext, ToolResult
from stayer.tools.effects import CallRef

if TYPE_CHECKING:
    from stayer.journal.session import RunJournal

#: Where a call stands: ``sent`` (intent committed, no result yet), ``done`` (its result
#: is in), ``unknown`` (the result was lost and the call could not be sent again).
STATES = ("sent", "done", "unknown")

_COLUMNS = "run_id, key, tool, args_hash, effects, state, sends, output, result, sent_at, done_at"


@dataclass(frozen=True)
class Effect:
    """One row of ``stayer_effects``."""

    run_id: str
    key: str
    tool: str
    args_hash: str
    effects: str
    state: str
    sends: int
    output: bytes | None  # the ToolResult's text, UTF-8
    result: str | None  # the ToolResult's other fields, JSON
    sent_at: str
    done_at: str | None

    def tool_result(self) -> ToolResult:
        kept = decode(self.result or "{}", ResultFields)
        return ToolResult.of(ToolResult.text(bytes(self.output or b"")), kept)


class EffectLog:
    """The ``stayer_effects`` rows of one journal store (SQLite or PostgreSQL; the table
    is created with the journal's, ``stayer.journal.sql.schema``)."""

    def __init__(self, store: SqlStore) -> None:
        self.store = store

    def get(self, run_id: str, key: str) -> Effect | None:
        rows = self.store._read(
            f"SELECT {_COLUMNS} FROM stayer_effects WHERE run_id = ? AND key = ?", (run_id, key)
        )
        return Effect(*rows[0]) if rows else None

    def of_run(self, run_id: str) -> list[Effect]:
        rows = self.store._read(
            f"SELECT {_COLUMNS} FROM stayer_effects WHERE run_id = ? ORDER BY sent_at, key",
            (run_id,),
        )
        return [Effect(*r) for r in rows]

    def intend(
        self, run_id: str, owner: str, key: str, tool: str, args_hash: str, effects: str
    ) -> None:
        """Commit that the call is about to be sent (again: ``sends`` counts), as ``owner``
        of the run's lease; LeaseLost, with nothing written, if it no longer holds it."""
        with self.store._tx() as cur:
            self.store._fence(cur, run_id, owner, None)
            cur.execute(
                f"INSERT INTO stayer_effects ({_COLUMNS}) "
                "VALUES (?, ?, ?, ?, ?, 'sent', 1, NULL, NULL, ?, NULL) "
                "ON CONFLICT (run_id, key) DO UPDATE SET sends = stayer_effects.sends + 1",
                (run_id, key, tool, args_hash, effects, utc_now()),
            )

    def settle(self, run_id: str, key: str, state: str, result: ToolResult) -> None:
        """Commit the call's result (``done``) or that it is ``unknown``. Not fenced: what
        a call did is true whoever holds the run now; a row already settled is kept."""
        fields = json.dumps(to_json(result.fields()))
        with self.store._tx() as cur:
            cur.execute(
                "UPDATE stayer_effects SET state = ?, output = ?, result = ?, done_at = ? "
                "WHERE run_id = ? AND key = ? AND state = 'sent'",
                (state, result.raw(), fields, utc_now(), run_id, key),
            )


def effect_log(store: Any) -> EffectLog:
    """The effect log of a journal store."""
    if not isinstance(store, SqlStore):
        raise TypeError(f"{type(store).__name__}: side-effecting tools need a SQL journal store")
    return EffectLog(store)


def args_hash(args: dict[str, Any]) -> str:
    return hashlib.sha256(canonical(args)).hexdigest()


def unknown_outcome(tool: str, key: str, sent_at: str) -> ToolResult:
    return ToolResult(
        f"{tool}: the outcome of this call is unknown. It was sent at {sent_at} (idempotency "
        f"key {key}), then the run was interrupted and its result was lost. The tool is not "
        "idempotent, so it was not sent again: check whether it took effect before calling "
        "it again.",
        is_error=True,
        outcome="unknown",
    )


def _record(ref: CallRef, tool: str, key: str, sent_at: str) -> OutcomeUnknown:
    return OutcomeUnknown(
        agent=ref.agent,
        step=ref.step,
        tool=tool,
        call_id=ref.call_id,
        idempotency_key=key,
        sent_at=sent_at,
    )


async def call_once(
    journal: RunJournal,
    name: str,
    effects: Effects,
    args: dict[str, Any],
    ctx: ToolContext,
    t: int,
    send: Callable[[ToolContext], Awaitable[ToolResult]],
) -> ToolResult:
    """Make side-effecting call number ``t`` of the run at most once (see the module's
    docstring); ``send`` makes it with the context given (which names the call)."""
    log = effect_log(journal.store)
    ref = ctx.call or CallRef(journal.run_id, journal.agent, -1, f"t{t}")
    if ctx.call is None:
        ctx = dataclasses.replace(ctx, call=ref)
    key, digest = ref.idempotency_key, args_hash(args)
    row = log.get(journal.run_id, key)
    if row is not None and row.state != "sent":
        if row.state == "unknown":  # its record, if a crash came between the two commits
            journal.outcome_unknown(_record(ref, name, key, row.sent_at))
        return row.tool_result()  # the recorded result: never sent again
    if row is not None and (effects != "idempotent" or row.args_hash != digest):
        lost = unknown_outcome(name, key, row.sent_at)
        journal.outcome_unknown(_record(ref, name, key, row.sent_at))
        log.settle(journal.run_id, key, "unknown", lost)
        journal.warn(
            f"run {journal.run_id}: {name} call #{t + 1} was in flight at the crash and is not "
            "idempotent; not sent again, the agent is told its outcome is unknown"
        )
        return lost
    if row is not None:
        journal.warn(
            f"run {journal.run_id}: {name} call #{t + 1} was in flight at the crash; sent again "
            f"with the same idempotency key ({key})"
        )
    log.intend(journal.run_id, journal.owner, key, name, digest, effects)
    result = await send(ctx)
    log.settle(journal.run_id, key, "done", result)
    return result

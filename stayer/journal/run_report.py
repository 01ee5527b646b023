"""A run's ledger and totals, read from its journal (finished or not)."""

from __future__ import annotations

import json
from typing import Any

from stayer.journal.lease import run_status
from stayer.journal.log import RunLog, load_log
from stayer.journal.session import lost_ledger_entries
from stayer.journal.store import RunRow, Store
from stayer.ledger import LedgerEntry, OutcomeUnknown, ledger_order
from stayer.money import Usd, usd_sum
from stayer.records import to_json
from stayer.usage import Usage


def run_report(store: Store, row: RunRow) -> dict[str, Any]:
    """Per-step ledger (``lost_in_flight`` entries included) and totals for ``row``, and
    the calls whose outcome a crash lost (``outcome_unknown``)."""
    log = load_log(store, row.id)
    steps = [*log.steps.values(), *(e for t in log.threads.values() for e in t.steps.values())]
    ledger = journal_ledger(log)
    usage = sum((e.usage for e in ledger), Usage())
    cost = ledger_cost(ledger)
    lost = [e for e in ledger if e.lost]
    unknown = journal_unknown(log)
    result = json.loads(log.blobs[log.finished["result"]]) if log.finished else None
    return {
        "run_id": row.id,
        "task": row.task,
        "model": row.model,
        "status": run_status(row),
        "reward": result.get("reward") if result else None,
        "started": row.started,
        "updated": row.updated,
        "steps": len(steps),
        "ledger": to_json(ledger),
        "totals": {
            "usage": usage.to_dict(),
            "cost_usd": str(cost),
            "model_calls": sum(
                1 for t in (log, *log.threads.values()) for c in t.calls.values() if c.finished
            )
            + len(lost),
            "lost_in_flight": len(lost),
            "lost_in_flight_cost_usd": str(usd_sum(e.cost.total for e in lost)),
            "tool_calls": len(log.tools) + sum(len(t.tools) for t in log.threads.values()),
            "outcome_unknown": len(unknown),
        },
        "outcome_unknown": to_json(unknown),
        "messages": messages(log),
        "journal": {
            "store": store.location,
            "events": len(log.events),
            "torn_events": log.torn,
            "resumes": log.resumes,
            "snapshots": len(log.snapshots),
            "blobs": len(log.blobs),
            "blob_bytes": store.blob_bytes(log.blobs),
        },
    }


def journal_ledger(log: RunLog) -> list[LedgerEntry]:
    """Every billed call the journal holds, finished run or not: each step of each agent
    (a team's threads too) and each attempt lost in flight (``lost_in_flight``), by step."""
    steps = [*log.steps.values(), *(e for t in log.threads.values() for e in t.steps.values())]
    return sorted(
        [
            *steps,
            *lost_ledger_entries(log.lost),
            *(lost for t in log.threads.values() for lost in lost_ledger_entries(t.lost)),
        ],
        key=ledger_order,
    )


def journal_unknown(log: RunLog) -> list[OutcomeUnknown]:
    """The run's ``outcome_unknown`` records (a team's threads' too), by step."""
    found = [*log.unknown, *(u for t in log.threads.values() for u in t.unknown)]
    return sorted(found, key=lambda u: u.step)


def ledger_cost(ledger: list[LedgerEntry]) -> Usd:
    """What a ledger adds up to (unknown if any entry's price is)."""
    cost = Usd()
    for e in ledger:
        cost += e.cost.total
        if e.compaction:
            cost += e.compaction.spent  # a summarising compaction is billed too
    return cost


def journal_spend(store: Store, run_id: str) -> Usd:
    """What the run has spent as its journal holds it (``journal_ledger``'s total);
    nothing for a run with no journal (it never started)."""
    if store.run(run_id) is None:
        return Usd()
    return ledger_cost(journal_ledger(load_log(store, run_id)))


def messages(log: RunLog) -> list[dict[str, Any]]:
    """A team run's messages (``message.sent`` events), in the order sent, each with what
    reading it cost its receiver (from its ``message.received``; None while unread)."""

    def events(kind: str) -> list[dict[str, Any]]:
        found = []
        for t in log.threads.values():
            for i in sorted(t.agent_events):
                k, address = t.agent_events[i]
                if k == kind:
                    found.append(json.loads(log.blobs[address]))
        return found

    read = {m["id"]: m for m in events("message.received")}
    out = []
    for m in events("message.sent"):
        r = read.get(m["id"])
        out.append(
            {
                "id": m["id"],
                "sender": m["sender"],
                "to": m["to"],
                "kind": m["kind"],
                "tokens": m["tokens"],
                "read_cost_usd": None if r is None else r["read_cost_usd"],
                "content": m["content"],
            }
        )
    return out

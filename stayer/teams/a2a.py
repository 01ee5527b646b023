"""A run's threads as Google A2A v0.3 ``Task`` objects (``stayer export a2a RUN_ID``).

One task per thread (a single-agent run is one thread, ``main``): ``id`` is
``RUN_ID/AGENT``, ``contextId`` the run id, so a team's tasks share one context. The
``history`` is the messages the thread received (role ``user``) and sent (role
``agent``), in journal order; the ``status`` is the run's outcome for the entry thread and
the thread's own for the others (``completed`` once it reported back); the ``artifacts``
hold the thread's final summary. stayer's figures (steps, cost) are in ``metadata``.
"""

from __future__ import annotations

import json
from decimal import Decimal
from typing import Any

from stayer.journal.log import RunLog

#: stayer run statuses as A2A task states.
STATES = {
    "succeeded": "completed",
    "failed": "failed",
    "error": "failed",
    "budget_exhausted": "failed",
    "running": "working",
    "suspended": "input-required",
}


def a2a_tasks(log: RunLog, run_status: str) -> list[dict[str, Any]]:
    result = json.loads(log.blobs[log.finished["result"]]) if log.finished else {}
    threads = log.threads or {"main": log}
    last_at = log.events[-1].at if log.events else None
    tasks = []
    for name, thread in threads.items():
        task_id = f"{log.run_id}/{name}"
        history: list[dict[str, Any]] = []
        report: dict[str, Any] | None = None
        for i in sorted(thread.agent_events):
            kind, address = thread.agent_events[i]
            if kind not in ("message.sent", "message.received"):
                continue
            m = json.loads(log.blobs[address])
            history.append(
                _message(m, "agent" if kind == "message.sent" else "user", task_id, log.run_id)
            )
            if kind == "message.sent" and m["kind"] == "report":
                report = m
        started_by_message = name in log.thread_starts
        steps = list(thread.steps.values())
        cost = sum(
            (Decimal(e["cost_usd"]) for e in steps if e["cost_usd"] != "unknown"), Decimal(0)
        )
        if not started_by_message:  # the entry thread: the run's outcome
            state = STATES.get(result.get("status", run_status), "working")
            summary = result.get("summary", "")
        else:
            state = "completed" if report is not None else STATES.get(run_status, "working")
            summary = report["content"] if report else ""
        status: dict[str, Any] = {"state": state, "timestamp": last_at}
        if summary:
            status["message"] = _text_message(summary, task_id, log.run_id, f"{task_id}#status")
        tasks.append(
            {
                "kind": "task",
                "id": task_id,
                "contextId": log.run_id,
                "status": status,
                "artifacts": [
                    {
                        "artifactId": f"{task_id}#summary",
                        "name": "summary",
                        "parts": [{"kind": "text", "text": summary}],
                    }
                ]
                if summary
                else [],
                "history": history,
                "metadata": {
                    "stayer": {
                        "agent": name,
                        "steps": len(steps),
                        "cost_usd": str(cost),
                        "run_status": run_status,
                    }
                },
            }
        )
    return tasks


def _message(m: dict[str, Any], role: str, task_id: str, context_id: str) -> dict[str, Any]:
    out = _text_message(m["content"], task_id, context_id, m["id"], role)
    out["metadata"] = {
        "stayer": {"from": m["sender"], "to": m["to"], "kind": m["kind"], "tokens": m.get("tokens")}
    }
    return out


def _text_message(
    text: str, task_id: str, context_id: str, message_id: str, role: str = "agent"
) -> dict[str, Any]:
    return {
        "kind": "message",
        "messageId": message_id,
        "role": role,
        "parts": [{"kind": "text", "text": text}],
        "taskId": task_id,
        "contextId": context_id,
    }

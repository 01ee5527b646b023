"""A run's threads as Google A2A v0.3 ``Task`` objects (``stayer export a2a RUN_ID``).

One task per thread (a single-agent run is one thread, ``main``): ``id`` is
``RUN_ID/AGENT``, ``contextId`` the run id, so a team's tasks share one context. The
``history`` is the messages the thread received (role ``user``) and sent (role
``agent``), in journal order; the ``status`` is the run's outcome for the entry thread and
the thread's own for the others (``completed`` once it reported back); the ``artifacts``
hold the thread's final summary. stayer's figures (steps, cost) are in ``metadata``.
"""

from __future__ import annotations

from decimal import Decimal

import msgspec
from msgspec import UNSET, UnsetType

from stayer.journal.log import RunLog
from stayer.records import Record, decode
from stayer.teams.bus import TeamMessage

#: stayer run statuses as A2A task states.
STATES = {
    "succeeded": "completed",
    "failed": "failed",
    "error": "failed",
    "budget_exhausted": "failed",
    "running": "working",
    "suspended": "input-required",
}


class Part(Record, kw_only=True):
    kind: str = "text"
    text: str


class MessageMeta(Record):
    """stayer's view of a message: who sent it to whom, its kind and tokens."""

    sender: str = msgspec.field(name="from")
    to: str
    kind: str
    tokens: int | None


class Meta(Record):
    stayer: MessageMeta


class A2aMessage(Record, kw_only=True):
    kind: str = "message"
    message_id: str = msgspec.field(name="messageId")
    role: str
    parts: list[Part]
    task_id: str = msgspec.field(name="taskId")
    context_id: str = msgspec.field(name="contextId")
    metadata: Meta | UnsetType = UNSET


class TaskStatus(Record, kw_only=True):
    state: str
    timestamp: str | None
    message: A2aMessage | UnsetType = UNSET


class Artifact(Record, kw_only=True):
    artifact_id: str = msgspec.field(name="artifactId")
    name: str
    parts: list[Part]


class ThreadFigures(Record, kw_only=True):
    """stayer's figures of a thread: its steps and their cost (priced ones)."""

    agent: str
    steps: int
    cost: str = msgspec.field(name="cost_usd")
    run_status: str


class TaskMeta(Record):
    stayer: ThreadFigures


class A2aTask(Record, kw_only=True):
    kind: str = "task"
    id: str
    context_id: str = msgspec.field(name="contextId")
    status: TaskStatus
    artifacts: list[Artifact]
    history: list[A2aMessage]
    metadata: TaskMeta


class _Posted(TeamMessage, kw_only=True):
    """A team message as its event's payload has it."""

    tokens: int | None = None


class _Outcome(Record):
    """What the tasks read of the run's result."""

    status: str | None = None
    summary: str | None = ""


def a2a_tasks(log: RunLog, run_status: str) -> list[A2aTask]:
    """The run's threads as A2A tasks (``export a2a`` writes them as JSON)."""
    result = decode(log.blobs[log.finished.result], _Outcome) if log.finished else None
    threads = log.threads or {"main": log}
    last_at = log.events[-1].at if log.events else None
    tasks: list[A2aTask] = []
    for name, thread in threads.items():
        task_id = f"{log.run_id}/{name}"
        history: list[A2aMessage] = []
        report: TeamMessage | None = None
        for i in sorted(thread.agent_events):
            kind, address = thread.agent_events[i]
            if kind not in ("message.sent", "message.received"):
                continue
            m = decode(log.blobs[address], _Posted)
            role = "agent" if kind == "message.sent" else "user"
            message = _text_message(m.content, task_id, log.run_id, m.id, role)
            message.metadata = Meta(MessageMeta(m.sender, m.to, m.kind, m.tokens))
            history.append(message)
            if kind == "message.sent" and m.kind == "report":
                report = m
        started_by_message = name in log.thread_starts
        steps = list(thread.steps.values())
        cost = sum((e.cost.total for e in steps if e.cost.total is not None), Decimal(0))
        if not started_by_message:  # the entry thread: the run's outcome
            status = (result.status if result else None) or run_status
            state = STATES.get(status, "working")
            summary = result.summary if result else ""
        else:
            state = "completed" if report is not None else STATES.get(run_status, "working")
            summary = report.content if report else ""
        status_ = TaskStatus(state=state, timestamp=last_at)
        if summary:
            status_.message = _text_message(summary, task_id, log.run_id, f"{task_id}#status")
        tasks.append(
            A2aTask(
                id=task_id,
                context_id=log.run_id,
                status=status_,
                artifacts=[
                    Artifact(
                        artifact_id=f"{task_id}#summary", name="summary", parts=[Part(text=summary)]
                    )
                ]
                if summary
                else [],
                history=history,
                metadata=TaskMeta(
                    ThreadFigures(
                        agent=name, steps=len(steps), cost=str(cost), run_status=run_status
                    )
                ),
            )
        )
    return tasks


def _text_message(
    text: str, task_id: str, context_id: str, message_id: str, role: str = "agent"
) -> A2aMessage:
    return A2aMessage(
        message_id=message_id,
        role=role,
        parts=[Part(text=text)],
        task_id=task_id,
        context_id=context_id,
    )

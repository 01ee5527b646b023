"""A small Python client for the runtime's HTTP API (httpx), used by the benchmark and the
tests, and meant for scripts:

    client = Client("http://127.0.0.1:8080", api_key)
    run = client.create_run(task="fix-median", model="sim:claude-sonnet-4-5")
    for event in client.events(run.id):        # follows the run live
        print(event.id, event.event, event.data.get("status"))

Answers are typed records read by attribute (``RunView``, ``RunPage``, ``LedgerEntry``,
``SseEvent``); ``iter_sse`` parses a stream's lines into plain documents.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any, TypeVar

import httpx
import msgspec

from stayer.journal.store import FINAL_STATUSES
from stayer.ledger import LedgerEntry, OutcomeUnknown, TokenTotals
from stayer.records import Record, decode, from_json
from stayer.runtime.actions import ActionView

T = TypeVar("T")

TERMINAL = frozenset(FINAL_STATUSES)


def iter_sse(lines: Iterable[str]) -> Iterator[dict[str, Any]]:
    """Server-Sent Events from a stream's lines: ``{"id", "event", "data"}`` with ``data``
    parsed as JSON; comments (keep-alive pings) skipped."""
    fields: dict[str, str] = {}
    for line in lines:
        if not line:
            if "data" in fields:
                yield {**fields, "data": json.loads(fields["data"])}
            fields = {}
        elif not line.startswith(":"):
            field, _, value = line.partition(":")
            fields[field] = value[1:] if value.startswith(" ") else value


class RunView(Record, kw_only=True):
    """A run as the API answers it (``RunOut``: ``GET /v1/runs/{id}`` and the others)."""

    id: str
    tenant: str
    task: str
    model: str
    status: str
    stop_reason: str | None
    steps: int
    usage: TokenTotals  # the API gives five counts: the 5m/1h split of writes reads 0
    cost_usd: str  # Decimal USD as text, or "unknown"
    reward: float | None
    error: str | None
    cancel_requested: bool
    pending_action: ActionView | None = None
    metadata: dict[str, str]
    created_at: str
    updated_at: str


class RunPage(Record, kw_only=True):
    """A page of ``GET /v1/runs``; ``next_cursor`` None on the last."""

    data: list[RunView]
    next_cursor: str | None


class RunLedger(Record, kw_only=True):
    """``GET /v1/runs/{id}/ledger``."""

    run_id: str
    ledger: list[LedgerEntry]
    outcome_unknown: list[OutcomeUnknown] = msgspec.field(default_factory=list)


class MessageReceipt(Record, kw_only=True):
    """``POST /v1/runs/{id}/messages``: the message's number in the run, from 1."""

    run_id: str
    n: int


class SseEvent(Record, kw_only=True):
    """One event of a run's stream; ``data``: its payload, whose fields depend on ``event``
    (``stayer.runtime.events``)."""

    id: str
    event: str = "message"  # SSE's default type
    data: dict[str, Any]


class ApiError(Exception):
    def __init__(self, status: int, detail: Any) -> None:
        super().__init__(f"HTTP {status}: {detail}")
        self.status = status
        self.detail = detail


def _check(response: httpx.Response) -> None:
    if response.status_code >= 400:
        try:
            detail = response.json().get("detail")
        except ValueError:
            detail = response.text
        raise ApiError(response.status_code, detail)


class Client:
    def __init__(self, base_url: str, api_key: str, *, timeout: float = 60.0) -> None:
        self.http = httpx.Client(
            base_url=base_url, headers={"Authorization": f"Bearer {api_key}"}, timeout=timeout
        )

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self.http.close()

    def _read(self, response: httpx.Response, type_: type[T]) -> T:
        """The answer as a ``type_``; ApiError for an error status."""
        _check(response)
        return decode(response.content, type_)

    def create_run(self, **body: Any) -> RunView:
        return self._read(self.http.post("/v1/runs", json=body), RunView)

    def run(self, run_id: str) -> RunView:
        return self._read(self.http.get(f"/v1/runs/{run_id}"), RunView)

    def runs(
        self, status: str | None = None, limit: int = 50, cursor: str | None = None
    ) -> RunPage:
        params = {
            k: v
            for k, v in {"status": status, "limit": limit, "cursor": cursor}.items()
            if v is not None
        }
        return self._read(self.http.get("/v1/runs", params=params), RunPage)

    def cancel(self, run_id: str) -> RunView:
        return self._read(self.http.post(f"/v1/runs/{run_id}/cancel"), RunView)

    def ledger(self, run_id: str) -> list[LedgerEntry]:
        return self._read(self.http.get(f"/v1/runs/{run_id}/ledger"), RunLedger).ledger

    def message(self, run_id: str, content: str) -> MessageReceipt:
        sent = self.http.post(f"/v1/runs/{run_id}/messages", json={"content": content})
        return self._read(sent, MessageReceipt)

    def decide(
        self, run_id: str, call_id: str, decision: str, message: str | None = None
    ) -> RunView:
        body = {"call_id": call_id, "decision": decision, "message": message}
        return self._read(self.http.post(f"/v1/runs/{run_id}/actions", json=body), RunView)

    def events(self, run_id: str, last_event_id: str | int | None = None) -> Iterator[SseEvent]:
        """The run's events from after ``last_event_id`` (all of them by default), live
        until its final status."""
        headers = {"Last-Event-ID": str(last_event_id)} if last_event_id is not None else {}
        with self.http.stream(
            "GET", f"/v1/runs/{run_id}/events", headers=headers, timeout=None
        ) as response:
            if response.status_code >= 400:
                response.read()
                _check(response)
            for event in iter_sse(response.iter_lines()):
                yield from_json(event, SseEvent)

    def wait(
        self,
        run_id: str,
        until: Callable[[RunView], bool] | None = None,
        *,
        poll_s: float = 0.2,
        timeout_s: float | None = None,
    ) -> RunView:
        """Poll the run until ``until(run)`` (default: a final status); its last state."""
        until = until or (lambda r: r.status in TERMINAL)
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while True:
            run = self.run(run_id)
            if until(run):
                return run
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError(f"run {run_id}: still {run.status} after {timeout_s} s")
            time.sleep(poll_s)

"""A small Python client for the runtime's HTTP API (httpx), used by the benchmark and the
tests, and meant for scripts:

    client = Client("http://127.0.0.1:8080", api_key)
    run = client.create_run(task="fix-median", model="sim:claude-sonnet-4-5")
    for event in client.events(run["id"]):        # follows the run live
        print(event["id"], event["event"], event["data"].get("status"))
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import httpx

from stayer.journal.store import FINAL_STATUSES

TERMINAL = frozenset(FINAL_STATUSES)


def iter_sse(lines: Iterable[str]) -> Iterator[dict[str, Any]]:
    """Server-Sent Events from a stream's lines: ``{"id", "event", "data"}`` with ``data``
    parsed as JSON; comments (keep-alive pings) skipped."""
    event: dict[str, Any] = {}
    for line in lines:
        if not line:
            if "data" in event:
                event["data"] = json.loads(event["data"])
                yield event
            event = {}
        elif not line.startswith(":"):
            field, _, value = line.partition(":")
            event[field] = value[1:] if value.startswith(" ") else value


class ApiError(Exception):
    def __init__(self, status: int, detail: Any) -> None:
        super().__init__(f"HTTP {status}: {detail}")
        self.status = status
        self.detail = detail


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

    def _json(self, response: httpx.Response) -> Any:
        if response.status_code >= 400:
            try:
                detail = response.json().get("detail")
            except ValueError:
                detail = response.text
            raise ApiError(response.status_code, detail)
        return response.json()

    def create_run(self, **body: Any) -> dict[str, Any]:
        return self._json(self.http.post("/v1/runs", json=body))  # type: ignore[no-any-return]

    def run(self, run_id: str) -> dict[str, Any]:
        return self._json(self.http.get(f"/v1/runs/{run_id}"))  # type: ignore[no-any-return]

    def runs(
        self, status: str | None = None, limit: int = 50, cursor: str | None = None
    ) -> dict[str, Any]:
        params = {
            k: v
            for k, v in {"status": status, "limit": limit, "cursor": cursor}.items()
            if v is not None
        }
        return self._json(self.http.get("/v1/runs", params=params))  # type: ignore[no-any-return]

    def cancel(self, run_id: str) -> dict[str, Any]:
        return self._json(self.http.post(f"/v1/runs/{run_id}/cancel"))  # type: ignore[no-any-return]

    def ledger(self, run_id: str) -> list[dict[str, Any]]:
        return self._json(self.http.get(f"/v1/runs/{run_id}/ledger"))["ledger"]  # type: ignore[no-any-return]

    def message(self, run_id: str, content: str) -> dict[str, Any]:
        return self._json(self.http.post(f"/v1/runs/{run_id}/messages", json={"content": content}))  # type: ignore[no-any-return]

    def decide(
        self, run_id: str, call_id: str, decision: str, message: str | None = None
    ) -> dict[str, Any]:
        body = {"call_id": call_id, "decision": decision, "message": message}
        return self._json(self.http.post(f"/v1/runs/{run_id}/actions", json=body))  # type: ignore[no-any-return]

    def events(
        self, run_id: str, last_event_id: str | int | None = None
    ) -> Iterator[dict[str, Any]]:
        """The run's events from after ``last_event_id`` (all of them by default), live
        until its final status."""
        headers = {"Last-Event-ID": str(last_event_id)} if last_event_id is not None else {}
        with self.http.stream(
            "GET", f"/v1/runs/{run_id}/events", headers=headers, timeout=None
        ) as response:
            if response.status_code >= 400:
                response.read()
                self._json(response)
            yield from iter_sse(response.iter_lines())

    def wait(
        self,
        run_id: str,
        until: Callable[[dict[str, Any]], bool] | None = None,
        *,
        poll_s: float = 0.2,
        timeout_s: float | None = None,
    ) -> dict[str, Any]:
        """Poll the run until ``until(run)`` (default: a final status); its last state."""
        until = until or (lambda r: r["status"] in TERMINAL)
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while True:
            run = self.run(run_id)
            if until(run):
                return run
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError(f"run {run_id}: still {run['status']} after {timeout_s} s")
            time.sleep(poll_s)

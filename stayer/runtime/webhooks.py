"""Signed webhooks for run status changes, delivered without ever blocking a worker.

The body is ``{"type": "run.status", "run_id", "status", "stop_reason"}``. Each delivery
has an id (``X-Stayer-Webhook-Id``, the same on every retry of it) and a time
(``X-Stayer-Timestamp``, Unix seconds); ``X-Stayer-Signature: sha256=<hex>`` is the
HMAC-SHA256, under the tenant's webhook secret, of ``<id>.<timestamp>.<body>``. A receiver
checks it with ``verify`` (or ``hmac.compare_digest``), refuses a timestamp older than a
few minutes and remembers ids it has seen: a captured delivery cannot be replayed later or
passed off as another. Deliveries are retried with exponential backoff.

Details and rationale: docs/notes.md, ``stayer/runtime/webhooks.py``.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import json
import sys
import time
import uuid
from collections.abc import Mapping

import httpx

from stayer import addresses as _addresses
from stayer.addresses import Address, is_public
from stayer.records import Record, to_json

SIGNATURE_HEADER = "X-Stayer-Signature"
ID_HEADER = "X-Stayer-Webhook-Id"
TIMESTAMP_HEADER = "X-Stayer-Timestamp"
#: How old a delivery ``verify`` accepts, in seconds (either way: clocks differ).
TOLERANCE_S = 300


class RunStatusHook(Record, kw_only=True):
    """The body of a run's status change."""

    type: str = "run.status"
    run_id: str
    status: str
    stop_reason: str | None


def sign(secret: str, body: bytes, *, delivery_id: str, timestamp: int) -> str:
    message = f"{delivery_id}.{timestamp}.".encode() + body
    return "sha256=" + hmac.new(secret.encode(), message, hashlib.sha256).hexdigest()


def signed_headers(secret: str, body: bytes, *, delivery_id: str, timestamp: int) -> dict[str, str]:
    """The headers that sign ``body`` as delivery ``delivery_id`` at ``timestamp``."""
    return {
        ID_HEADER: delivery_id,
        TIMESTAMP_HEADER: str(timestamp),
        SIGNATURE_HEADER: sign(secret, body, delivery_id=delivery_id, timestamp=timestamp),
    }


def verify(
    secret: str,
    body: bytes,
    headers: Mapping[str, str],
    *,
    now: float | None = None,
    tolerance_s: float = TOLERANCE_S,
) -> bool:
    """Whether ``headers`` sign ``body`` under ``secret`` and were made within
    ``tolerance_s`` of ``now``. (Remembering the ids already seen is the receiver's.)"""
    lower = {k.lower(): v for k, v in headers.items()}
    delivery_id = lower.get(ID_HEADER.lower(), "")
    try:
        timestamp = int(lower.get(TIMESTAMP_HEADER.lower(), ""))
    except ValueError:
        return False
    now = time.time() if now is None else now
    if not delivery_id or abs(now - timestamp) > tolerance_s:
        return False
    expected = sign(secret, body, delivery_id=delivery_id, timestamp=timestamp)
    return hmac.compare_digest(lower.get(SIGNATURE_HEADER.lower(), "").encode(), expected.encode())


def _allowed(address: Address) -> bool:
    return is_public(address)


def resolve(url: str, *, allow_private: bool) -> tuple[list[str], str | None]:
    """The addresses ``url``'s host resolves to, all of them allowed; or why not."""
    return _addresses.resolve(
        url,
        allow_private=allow_private,
        allowed=_allowed,
        refused="the server does not send webhooks there",
    )


def url_problem(url: str, *, allow_private: bool) -> str | None:
    """Why ``url`` may not receive webhooks, or None if it may."""
    return resolve(url, allow_private=allow_private)[1]


class Webhooks:
    """Fire-and-forget delivery: each ``send`` is a background task with its own retries."""

    def __init__(
        self, *, allow_private: bool = False, attempts: int = 5, backoff_s: float = 0.5
    ) -> None:
        self.allow_private = allow_private
        self.attempts = attempts
        self.backoff_s = backoff_s
        self._tasks: set[asyncio.Task[None]] = set()
        self._client: httpx.AsyncClient | None = None

    def send(self, url: str, secret: str, payload: Record) -> None:
        """Deliver ``payload`` (its JSON document, compact and ASCII) to ``url``."""
        doc = to_json(payload)
        body = json.dumps(doc, separators=(",", ":")).encode()
        delivery = self._deliver(url, secret, body, doc.get("run_id"))
        task = asyncio.get_running_loop().create_task(delivery)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _deliver(self, url: str, secret: str, body: bytes, run_id: str | None) -> None:
        delivery_id = uuid.uuid4().hex
        if self._client is None:
            # No redirects: a 30x to an internal address would undo the URL check. No
            # kept connections: one made for another name at the same address would carry
            # that name's TLS identity.
            self._client = httpx.AsyncClient(
                timeout=10.0,
                follow_redirects=False,
                limits=httpx.Limits(max_keepalive_connections=0),
            )
        for attempt in range(self.attempts):
            addresses, problem = await asyncio.to_thread(
                resolve, url, allow_private=self.allow_private
            )
            if problem is not None:
                print(
                    f"stayer: webhook for run {run_id} not sent: {problem}",
                    file=sys.stderr,
                )
                return
            headers = {
                "Content-Type": "application/json",
                **signed_headers(secret, body, delivery_id=delivery_id, timestamp=int(time.time())),
            }
            for address in addresses:  # the addresses checked, never a second lookup's
                target, host, extensions = _addresses.pinned(url, address)
                try:
                    response = await self._client.post(
                        target, content=body, headers={**headers, **host}, extensions=extensions
                    )
                except httpx.HTTPError:
                    continue
                if response.status_code < 500 and response.status_code != 429:
                    return
                break
            await asyncio.sleep(self.backoff_s * 2**attempt)
        print(
            f"stayer: webhook for run {run_id} failed after {self.attempts} attempts",
            file=sys.stderr,
        )

    async def aclose(self, timeout_s: float = 5.0) -> None:
        """Give pending deliveries a moment to finish, then drop them."""
        if self._tasks:
            await asyncio.wait(set(self._tasks), timeout=timeout_s)
        for task in set(self._tasks):
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if self._client is not None:
            await self._client.aclose()

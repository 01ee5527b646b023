"""Signed webhooks for run status changes, delivered without ever blocking a worker.

The body is ``{"type": "run.status", "run_id", "status", "stop_reason"}``; the header
``X-Stayer-Signature: sha256=<hex>`` is the HMAC-SHA256 of the exact body bytes under the
tenant's webhook secret (shown once by ``stayer tenants create``), so a receiver verifies
it with ``hmac.compare_digest``. Deliveries are retried with exponential backoff.

A multi-tenant server must not become a tenant's proxy into its own network: a webhook URL
must be http(s) and, unless the operator allows it (``stayer serve
--allow-private-webhooks``), must not resolve to a loopback, private, link-local or
otherwise non-public address. The check runs when the run is created and again before
each delivery (the name may have been re-pointed since).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import ipaddress
import json
import socket
import sys
from typing import Any
from urllib.parse import urlsplit

import httpx

SIGNATURE_HEADER = "X-Stayer-Signature"


def sign(secret: str, body: bytes) -> str:
    return "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


def url_problem(url: str, *, allow_private: bool) -> str | None:
    """Why ``url`` may not receive webhooks, or None if it may."""
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as e:
        return f"not a URL ({e})"
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return "must be an http:// or https:// URL with a host"
    if parts.username or parts.password:
        return "must not carry credentials"
    if allow_private:
        return None
    try:
        infos = socket.getaddrinfo(parts.hostname, port or (443 if parts.scheme == "https" else 80))
    except OSError:
        return f"host {parts.hostname!r} does not resolve"
    for info in infos:
        address = ipaddress.ip_address(str(info[4][0]).split("%", 1)[0])
        if not address.is_global:
            return f"resolves to a non-public address ({address}); the server does not send webhooks there"
    return None


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

    def send(self, url: str, secret: str, payload: dict[str, Any]) -> None:
        task = asyncio.get_running_loop().create_task(self._deliver(url, secret, payload))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _deliver(self, url: str, secret: str, payload: dict[str, Any]) -> None:
        problem = await asyncio.to_thread(url_problem, url, allow_private=self.allow_private)
        if problem is not None:
            print(
                f"stayer: webhook for run {payload.get('run_id')} not sent: {problem}",
                file=sys.stderr,
            )
            return
        body = json.dumps(payload, separators=(",", ":")).encode()
        headers = {"Content-Type": "application/json", SIGNATURE_HEADER: sign(secret, body)}
        if self._client is None:
            # No redirects: a 30x to an internal address would undo the URL check.
            self._client = httpx.AsyncClient(timeout=10.0, follow_redirects=False)
        for attempt in range(self.attempts):
            try:
                response = await self._client.post(url, content=body, headers=headers)
                if response.status_code < 500 and response.status_code != 429:
                    return
            except httpx.HTTPError:
                pass
            await asyncio.sleep(self.backoff_s * 2**attempt)
        print(
            f"stayer: webhook for run {payload.get('run_id')} failed after {self.attempts} attempts",
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

"""Retries for model calls: one policy shared by every adapter.

Why our own loop rather than the SDKs' built-in retries: theirs are invisible to the
caller (no log line, no injectable clock, different defaults per SDK), so a 6-attempt
budget could silently become 6 x 3 HTTP requests. Adapters therefore build their SDK
clients with ``max_retries=0`` and wrap every call in :func:`call_with_retries`, which

* retries rate limits (429), request timeouts (408), server errors (5xx, including
  Anthropic's 529 "overloaded"), connection errors and client-side timeouts;
* honours ``retry-after-ms`` / ``retry-after`` (capped), else backs off exponentially
  with jitter so that thousands of concurrent episodes do not retry in lockstep;
* never retries what cannot succeed (400, 401, 403, 404, 422, OpenAI's
  ``insufficient_quota`` 429, or a server that says ``x-should-retry: false``);
* raises :class:`ModelCallError` (a :class:`~stayer.models.base.ModelError`) with a
  one-line message, so the CLI can print it as is.
"""

from __future__ import annotations

import asyncio
import email.utils
import logging
import random
import re
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

from stayer.models.base import ModelError

T = TypeVar("T")

log = logging.getLogger("stayer.models")

# Status codes worth another attempt. Everything else in 4xx is the caller's fault.
RETRYABLE_STATUS = frozenset({408, 409, 429})
# Error codes that come with a retryable status but never go away by waiting.
_NEVER_RETRY_CODES = frozenset({"insufficient_quota", "billing_hard_limit_reached"})
_MAX_MESSAGE = 400


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """How hard to try. ``sleep`` and ``random`` are injectable so tests never wait."""

    max_attempts: int = 6
    base_delay_s: float = 1.0
    max_delay_s: float = 60.0
    # A provider may ask for a long pause (quota windows); waiting longer than this in one
    # go is worse than failing over, so the wait is capped.
    max_retry_after_s: float = 120.0
    sleep: Callable[[float], Awaitable[Any]] = field(default=asyncio.sleep, repr=False)
    random: Callable[[], float] = field(default=random.random, repr=False)

    def backoff_s(self, attempt: int) -> float:
        """Delay after failed attempt ``attempt`` (1-based): equal jitter on 2^n growth."""
        ceiling = min(self.max_delay_s, self.base_delay_s * 2 ** (attempt - 1))
        return ceiling / 2 + self.random() * ceiling / 2


DEFAULT_RETRY = RetryPolicy()


class ModelCallError(ModelError):
    """A failed model call, with what the router needs to decide on failover."""

    def __init__(
        self, message: str, *, status_code: int | None, attempts: int, retryable: bool
    ) -> None:
        super().__init__(message)
        self.status_code = status_code
        self.attempts = attempts
        self.retryable = retryable  # True when we gave up on a transient failure


@dataclass(frozen=True, slots=True)
class SdkErrors:
    """The exception classes of one SDK; keeps this module free of SDK imports.

    ``status`` must carry ``status_code``, ``response`` (with ``headers``) and ``body``,
    as both the Anthropic and OpenAI SDKs' ``APIStatusError`` do.
    """

    status: type[BaseException]
    connection: type[BaseException]  # includes the SDK's timeout error (a subclass)
    base: type[BaseException]  # any other SDK error: reported, not retried


async def call_with_retries(
    fn: Callable[[], Awaitable[T]],
    *,
    what: str,
    errors: SdkErrors,
    policy: RetryPolicy = DEFAULT_RETRY,
) -> T:
    """Await ``fn()`` until it succeeds, a non-retryable error occurs, or attempts run out.

    ``what`` names the call in messages (``"anthropic claude-sonnet-4-5"``).
    """
    attempts = max(1, policy.max_attempts)
    for attempt in range(1, attempts + 1):
        delay: float | None = None
        status: int | None = None
        try:
            return await fn()
        except errors.connection as exc:
            last: BaseException = exc
            kind = "timed out" if _is_timeout(exc) else "connection error"
            detail = _one_line(str(exc))
        except TimeoutError as exc:  # an asyncio.wait_for around the call, if any
            last, kind, detail = exc, "timed out", ""
        except errors.status as exc:
            last = exc
            status = int(getattr(exc, "status_code", 0) or 0)
            headers = _headers(exc)
            kind, detail = f"HTTP {status}", _provider_message(exc)
            if not _status_retryable(status, headers, getattr(exc, "body", None)):
                raise ModelCallError(
                    f"{what}: {kind}: {detail}",
                    status_code=status,
                    attempts=attempt,
                    retryable=False,
                ) from exc
            delay = _retry_after_s(headers)
        except errors.base as exc:
            raise ModelCallError(
                f"{what}: {type(exc).__name__}: {_provider_message(exc)}",
                status_code=getattr(exc, "status_code", None),
                attempts=attempt,
                retryable=False,
            ) from exc

        if attempt >= attempts:
            suffix = f" (gave up after {attempts} attempts)" if attempts > 1 else ""
            message = f"{what}: {kind}: {detail}" if detail else f"{what}: {kind}"
            raise ModelCallError(
                message + suffix, status_code=status, attempts=attempt, retryable=True
            ) from last
        if delay is not None:
            wait = min(max(0.0, delay), policy.max_retry_after_s)
        else:
            wait = policy.backoff_s(attempt)
        log.warning("%s: %s; retry %d/%d in %.2fs", what, kind, attempt, attempts - 1, wait)
        await policy.sleep(wait)
    raise AssertionError("unreachable")  # pragma: no cover


def _status_retryable(status: int, headers: Mapping[str, str], body: object) -> bool:
    if status in (400, 401, 403, 404, 422):
        return False  # never worth repeating, whatever the headers say
    if headers.get("x-should-retry") == "false":
        return False
    if (
        _error_field(body, "code") in _NEVER_RETRY_CODES
        or _error_field(body, "type") in _NEVER_RETRY_CODES
    ):
        return False
    if headers.get("x-should-retry") == "true":
        return True
    return status in RETRYABLE_STATUS or status >= 500


def _retry_after_s(headers: Mapping[str, str]) -> float | None:
    """Seconds the server asked us to wait: ``retry-after-ms``, then ``retry-after``
    (seconds or an HTTP date). None when absent or unparseable."""
    ms = headers.get("retry-after-ms")
    if ms is not None:
        try:
            return float(ms) / 1000.0
        except ValueError:
            pass
    value = headers.get("retry-after")
    if value is None:
        return None
    try:
        return float(value)
    except ValueError:
        pass
    parsed = email.utils.parsedate_tz(value)
    if parsed is None:
        return None
    return float(email.utils.mktime_tz(parsed) - time.time())


def _headers(exc: BaseException) -> Mapping[str, str]:
    response = getattr(exc, "response", None)
    headers = getattr(response, "headers", None)
    return headers if headers is not None else {}


def _error_field(body: object, key: str) -> str | None:
    """``error.<key>`` from either SDK's body (Anthropic keeps the envelope, OpenAI
    unwraps it)."""
    if not isinstance(body, Mapping):
        return None
    err = body.get("error", body)
    if isinstance(err, Mapping):
        value = err.get(key)
        return str(value) if value is not None else None
    return None


def _provider_message(exc: BaseException) -> str:
    """The provider's own explanation, on one line; the SDK's text as a fallback."""
    message = _error_field(getattr(exc, "body", None), "message")
    if not message:
        message = getattr(exc, "message", None) or str(exc) or type(exc).__name__
    return _one_line(message)


def _one_line(text: str) -> str:
    text = re.sub(r"\s+", " ", text).strip()
    return text if len(text) <= _MAX_MESSAGE else text[: _MAX_MESSAGE - 1] + "…"


def _is_timeout(exc: BaseException) -> bool:
    return "timeout" in type(exc).__name__.lower() or isinstance(exc, TimeoutError)

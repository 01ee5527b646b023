"""The shared retry policy, driven through the real SDK clients against a local fake.
Sleeping is injected, so no test waits."""

from __future__ import annotations

import socket

import anthropic
import pytest
from http_fake import (
    ANTHROPIC_MESSAGE,
    OPENAI_CHAT_COMPLETION,
    OPENAI_RESPONSE,
    FakeServer,
    complete,
)

from stayer.models.anthropic import AnthropicModel
from stayer.models.base import Message, ModelError, ModelRequest
from stayer.models.openai import OpenAIChatModel, OpenAIResponsesModel
from stayer.models.retry import ModelCallError, RetryPolicy

REQ = ModelRequest(system="S", tools=[], messages=[Message("user", "hi")])

ANTHROPIC_429 = {
    "type": "error",
    "error": {
        "type": "rate_limit_error",
        "message": "Number of request tokens has exceeded your per-minute rate limit",
    },
}
ANTHROPIC_500 = {
    "type": "error",
    "error": {"type": "api_error", "message": "Internal server error"},
}
ANTHROPIC_401 = {
    "type": "error",
    "error": {"type": "authentication_error", "message": "invalid x-api-key"},
}
OPENAI_500 = {
    "error": {
        "message": "The server had an error.",
        "type": "server_error",
        "param": None,
        "code": None,
    }
}


class Sleeps(list[float]):
    """Records requested sleeps instead of sleeping."""

    async def __call__(self, seconds: float) -> None:
        self.append(seconds)


def _policy(sleeps: Sleeps, attempts: int = 6) -> RetryPolicy:
    # random() == 0.5 makes the jittered backoff deterministic: 0.75 * 2^(n-1) s.
    return RetryPolicy(max_attempts=attempts, sleep=sleeps, random=lambda: 0.5)


def _anthropic(srv: FakeServer, policy: RetryPolicy) -> AnthropicModel:
    return AnthropicModel("claude-test-1", api_key="k", base_url=srv.url, retry=policy)


def test_429_honours_retry_after_then_succeeds() -> None:
    sleeps = Sleeps()
    with FakeServer() as srv:
        srv.reply(429, ANTHROPIC_429, headers={"retry-after": "7"})
        srv.reply(200, ANTHROPIC_MESSAGE)
        resp = complete(_anthropic(srv, _policy(sleeps)), REQ)
        assert len(srv.requests) == 2
        # The SDK's own retries are off: it reports attempt 0 each time.
        assert {r.headers["x-stainless-retry-count"] for r in srv.requests} == {"0"}
    assert sleeps == [7.0]
    assert resp.stop_reason == "tool_use"


def test_retry_after_ms_wins_and_long_waits_are_capped() -> None:
    sleeps = Sleeps()
    policy = RetryPolicy(max_attempts=3, sleep=sleeps, max_retry_after_s=30.0)
    with FakeServer() as srv:
        srv.reply(429, ANTHROPIC_429, headers={"retry-after-ms": "1500", "retry-after": "2"})
        srv.reply(429, ANTHROPIC_429, headers={"retry-after": "3600"})
        srv.reply(200, ANTHROPIC_MESSAGE)
        complete(_anthropic(srv, policy), REQ)
    assert sleeps == [1.5, 30.0]


def test_500_twice_then_success_with_exponential_backoff() -> None:
    sleeps = Sleeps()
    with FakeServer() as srv:
        srv.reply(500, OPENAI_500)
        srv.reply(503, OPENAI_500)
        srv.reply(200, OPENAI_CHAT_COMPLETION)
        model = OpenAIChatModel("m", base_url=srv.url, retry=_policy(sleeps))
        resp = complete(model, REQ)
        assert len(srv.requests) == 3
    assert sleeps == [0.75, 1.5]
    assert resp.stop_reason == "tool_calls"


def test_401_is_not_retried() -> None:
    sleeps = Sleeps()
    with FakeServer() as srv:
        srv.reply(401, ANTHROPIC_401)
        srv.reply(200, ANTHROPIC_MESSAGE)
        with pytest.raises(ModelError) as e:
            complete(_anthropic(srv, _policy(sleeps)), REQ)
        assert len(srv.requests) == 1
    assert sleeps == []
    msg = str(e.value)
    assert msg == "anthropic claude-test-1: HTTP 401: invalid x-api-key"
    assert (
        isinstance(e.value, ModelCallError) and e.value.status_code == 401 and not e.value.retryable
    )


@pytest.mark.parametrize(
    ("status", "body"),
    [
        (
            400,
            {
                "error": {
                    "message": "Invalid 'input[0]':\n  bad value",
                    "type": "invalid_request_error",
                    "code": None,
                }
            },
        ),
        (
            403,
            {
                "error": {
                    "message": "Project does not have access",
                    "type": "invalid_request_error",
                    "code": None,
                }
            },
        ),
        (
            429,
            {
                "error": {
                    "message": "You exceeded your current quota",
                    "type": "insufficient_quota",
                    "code": "insufficient_quota",
                }
            },
        ),
    ],
)
def test_unrecoverable_openai_errors_fail_at_once(status: int, body: dict) -> None:
    sleeps = Sleeps()
    with FakeServer() as srv:
        srv.reply(status, body)
        model = OpenAIResponsesModel("gpt-5", api_key="k", base_url=srv.url, retry=_policy(sleeps))
        with pytest.raises(ModelCallError) as e:
            complete(model, REQ)
        assert len(srv.requests) == 1
    assert sleeps == []
    assert e.value.status_code == status
    assert "\n" not in str(e.value) and body["error"]["message"].split("\n")[0] in str(e.value)


def test_exhausting_retries_raises_one_line_model_error() -> None:
    sleeps = Sleeps()
    with FakeServer() as srv:
        for _ in range(3):
            srv.reply(
                529,
                {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}},
            )
        with pytest.raises(ModelError) as e:
            complete(_anthropic(srv, _policy(sleeps, attempts=3)), REQ)
        assert len(srv.requests) == 3
    assert sleeps == [0.75, 1.5]
    assert (
        str(e.value) == "anthropic claude-test-1: HTTP 529: Overloaded (gave up after 3 attempts)"
    )
    assert e.value.retryable and e.value.attempts == 3


def test_connection_errors_are_retried() -> None:
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    sleeps = Sleeps()
    model = OpenAIChatModel(
        "m", base_url=f"http://127.0.0.1:{port}/v1", retry=_policy(sleeps, attempts=2)
    )
    with pytest.raises(ModelCallError, match=r"connection error.*gave up after 2 attempts") as e:
        complete(model, REQ)
    assert sleeps == [0.75]
    assert e.value.status_code is None


def test_supplied_client_has_sdk_retries_disabled() -> None:
    sleeps = Sleeps()
    with FakeServer() as srv:
        srv.reply(500, ANTHROPIC_500)
        srv.reply(500, ANTHROPIC_500)
        client = anthropic.AsyncAnthropic(api_key="k", base_url=srv.url, max_retries=5)
        model = AnthropicModel("claude-test-1", client=client, retry=_policy(sleeps, attempts=2))
        with pytest.raises(ModelError):
            complete(model, REQ, close=client)
        assert len(srv.requests) == 2  # ours only: 2 attempts, not 2 x 6


def test_server_may_veto_a_retry() -> None:
    sleeps = Sleeps()
    with FakeServer() as srv:
        srv.reply(500, ANTHROPIC_500, headers={"x-should-retry": "false"})
        with pytest.raises(ModelCallError):
            complete(_anthropic(srv, _policy(sleeps)), REQ)
        assert len(srv.requests) == 1
    assert sleeps == []


def test_backoff_is_capped_and_jittered() -> None:
    p = RetryPolicy(base_delay_s=1.0, max_delay_s=8.0, random=lambda: 1.0)
    assert [p.backoff_s(n) for n in range(1, 7)] == [1.0, 2.0, 4.0, 8.0, 8.0, 8.0]
    low = RetryPolicy(random=lambda: 0.0)
    assert low.backoff_s(3) == 2.0  # never below half the exponential step


def test_responses_adapter_retries_too() -> None:
    sleeps = Sleeps()
    with FakeServer() as srv:
        srv.reply(429, OPENAI_500, headers={"retry-after-ms": "250"})
        srv.reply(200, OPENAI_RESPONSE)
        model = OpenAIResponsesModel("gpt-5", api_key="k", base_url=srv.url, retry=_policy(sleeps))
        resp = complete(model, REQ)
    assert sleeps == [0.25]
    assert resp.usage.cache_read_tokens == 2048

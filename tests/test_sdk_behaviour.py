"""A metered client behaves as the SDK's own for every call it wraps: the same return
types and values, the same streamed events in the same order, the same exception classes
(status, message) for provider errors, and the SDK's retries left to the SDK. Against
``stayer sim serve`` and the recorded-HTTP fake (tests/http_fake.py)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import anthropic
import openai
import pytest
from http_fake import FakeServer
from service_helpers import listening

import stayer

ASK = [{"role": "user", "content": "same answer please"}]


@pytest.fixture(scope="module")
def sim() -> Iterator[str]:
    with listening(["sim", "serve", "--port", "0"]) as url:
        yield url


def _without_ids(value: Any) -> Any:
    """A response's data less what differs per call (ids, creation times)."""
    if isinstance(value, dict):
        return {
            k: _without_ids(v)
            for k, v in value.items()
            if k not in ("id", "item_id", "created", "created_at")
        }
    if isinstance(value, list):
        return [_without_ids(v) for v in value]
    return value


def _pair(make: Callable[[], Any], tmp_path: Path) -> tuple[Any, Any, stayer.Session]:
    session = stayer.Session(home=tmp_path)
    return make(), stayer.meter(make(), session=session), session


CALLS: dict[str, Callable[[Any], Any]] = {
    "anthropic": lambda c: c.messages.create(
        model="claude-sonnet-4-5", max_tokens=64, messages=ASK
    ),
    "chat": lambda c: c.chat.completions.create(model="gpt-5", messages=ASK),
    "responses": lambda c: c.responses.create(model="gpt-5", input="same answer please"),
}
STREAMS: dict[str, Callable[[Any], Any]] = {
    "anthropic": lambda c: c.messages.create(
        model="claude-sonnet-4-5", max_tokens=64, messages=ASK, stream=True
    ),
    "chat": lambda c: c.chat.completions.create(
        model="gpt-5", messages=ASK, stream=True, stream_options={"include_usage": True}
    ),
    "responses": lambda c: c.responses.create(
        model="gpt-5", input="same answer please", stream=True
    ),
}


def _client(api: str, url: str, **kw: Any) -> Callable[[], Any]:
    if api == "anthropic":
        return lambda: anthropic.Anthropic(base_url=url, api_key="sk-x", **kw)
    return lambda: openai.OpenAI(base_url=f"{url}/v1", api_key="sk-x", **kw)


@pytest.mark.parametrize("api", CALLS)
def test_same_return_type_and_value(api: str, sim: str, tmp_path: Path) -> None:
    raw, metered, session = _pair(_client(api, sim), tmp_path)
    mine, theirs = CALLS[api](metered), CALLS[api](raw)
    assert type(mine) is type(theirs)
    assert _without_ids(mine.model_dump()) == _without_ids(theirs.model_dump())
    # the raw-response door too: the same wrapper, status, headers and parsed type
    mine_raw, theirs_raw = CALLS[api](metered.with_raw_response), CALLS[api](raw.with_raw_response)
    assert type(mine_raw) is type(theirs_raw) and mine_raw.status_code == theirs_raw.status_code
    assert mine_raw.headers["content-type"] == theirs_raw.headers["content-type"]
    assert type(mine_raw.parse()) is type(theirs_raw.parse())
    assert len(session.ledger) == 2


@pytest.mark.parametrize("api", STREAMS)
def test_same_stream_events_in_the_same_order(api: str, sim: str, tmp_path: Path) -> None:
    raw, metered, session = _pair(_client(api, sim), tmp_path)
    mine, theirs = list(STREAMS[api](metered)), list(STREAMS[api](raw))
    assert [type(e) for e in mine] == [type(e) for e in theirs]
    assert [getattr(e, "type", None) for e in mine] == [getattr(e, "type", None) for e in theirs]
    assert [_without_ids(e.model_dump()) for e in mine] == [
        _without_ids(e.model_dump()) for e in theirs
    ]
    (entry,) = session.ledger
    assert entry["complete"]


def test_async_streams_match_too(sim: str, tmp_path: Path) -> None:
    session = stayer.Session(home=tmp_path)

    async def events(client: Any) -> list[Any]:
        stream = await client.messages.create(
            model="claude-sonnet-4-5", max_tokens=64, messages=ASK, stream=True
        )
        return [e async for e in stream]

    def make() -> anthropic.AsyncAnthropic:
        return anthropic.AsyncAnthropic(base_url=sim, api_key="sk-x")

    mine = asyncio.run(events(stayer.meter(make(), session=session)))
    theirs = asyncio.run(events(make()))
    assert [type(e) for e in mine] == [type(e) for e in theirs]
    assert [_without_ids(e.model_dump()) for e in mine] == [
        _without_ids(e.model_dump()) for e in theirs
    ]


@pytest.mark.parametrize("status", [400, 401, 404, 413, 500])
@pytest.mark.parametrize("api", CALLS)
def test_same_exception_for_a_provider_error(api: str, status: int, tmp_path: Path) -> None:
    body = (
        {"type": "error", "error": {"type": "invalid_request_error", "message": f"no ({status})"}}
        if api == "anthropic"
        else {"error": {"message": f"no ({status})", "type": "invalid_request_error"}}
    )
    budget = stayer.Budget("1")
    with FakeServer() as srv:
        srv.reply(status, body)
        srv.reply(status, body)
        make = _client(api, srv.url, max_retries=0)
        raw, session = make(), stayer.Session(home=tmp_path)
        metered = stayer.meter(make(), budget=budget, session=session)
        with pytest.raises(Exception) as theirs:
            CALLS[api](raw)
        with pytest.raises(Exception) as mine:
            CALLS[api](metered)
        assert len(srv.requests) == 2
    assert type(mine.value) is type(theirs.value)
    assert isinstance(mine.value, (anthropic.APIStatusError, openai.APIStatusError))
    assert mine.value.status_code == theirs.value.status_code == status  # type: ignore[attr-defined]
    assert str(mine.value) == str(theirs.value)
    assert budget.reserved == 0 and budget.spent == 0 and session.ledger == []


@pytest.mark.parametrize("api", ["anthropic", "chat"])
def test_the_sdks_retries_stay_the_sdks(api: str, sim: str, tmp_path: Path) -> None:
    """A 529/429 then a reply: the SDK retries as it would unmetered; the refused attempt
    is released, unbilled, and only the reply is on the ledger."""
    import httpx

    answer = httpx.post(
        f"{sim}/v1/messages" if api == "anthropic" else f"{sim}/v1/chat/completions",
        json={"model": "claude-sonnet-4-5", "max_tokens": 64, "messages": ASK}
        if api == "anthropic"
        else {"model": "gpt-5", "messages": ASK},
        headers={"x-api-key": "sk-x", "anthropic-version": "2023-06-01"},
    ).json()
    status = 529 if api == "anthropic" else 429
    error = {"type": "error", "error": {"type": "overloaded_error", "message": "busy"}}
    results = []
    with FakeServer() as srv:
        for _ in range(2):
            srv.reply(status, error, headers={"retry-after": "0"})
            srv.reply(200, answer)
        budget = stayer.Budget("1")
        make = _client(api, srv.url, max_retries=2)
        raw, session = make(), stayer.Session(home=tmp_path)
        metered = stayer.meter(make(), budget=budget, session=session)
        for client in (raw, metered):
            results.append(CALLS[api](client))
        assert len(srv.requests) == 4  # each client: the refused attempt, then the retry
    assert type(results[0]) is type(results[1])
    assert results[0].model_dump() == results[1].model_dump()
    (entry,) = session.ledger
    assert budget.reserved == 0 and budget.spent == Decimal(entry["cost_usd"]) > 0

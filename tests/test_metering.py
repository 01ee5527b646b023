"""The metering core's reading of a provider call: usage from a response body and from the
bytes of its event stream, fed in any pieces, for each wire API (the simulator server's
replies, which the official SDKs accept, are the providers' shapes)."""

from __future__ import annotations

import random
from typing import Any

import pytest
from starlette.testclient import TestClient

from stayer.metering.requests import Api
from stayer.metering.usage import StreamReader, read_body
from stayer.models.sim_policies import parse_policy
from stayer.simserver.app import SimServer, create_app
from stayer.tokens import TiktokenCounter
from stayer.usage import Usage

SYSTEM = "Be exact. " * 700
CASES: dict[Api, tuple[str, dict[str, Any]]] = {
    "anthropic": (
        "/v1/messages",
        {
            "model": "claude-sonnet-4-5",
            "max_tokens": 300,
            "system": [{"type": "text", "text": SYSTEM, "cache_control": {"type": "ephemeral"}}],
            "messages": [{"role": "user", "content": "Say something long enough to stream."}],
        },
    ),
    "chat": (
        "/v1/chat/completions",
        {
            "model": "gpt-5",
            "messages": [
                {"role": "system", "content": SYSTEM},
                {"role": "user", "content": "Say something long enough to stream."},
            ],
            "prompt_cache_key": "k",
        },
    ),
    "responses": (
        "/v1/responses",
        {
            "model": "gpt-5",
            "instructions": SYSTEM,
            "input": "Say something long enough to stream.",
            "prompt_cache_key": "k",
        },
    ),
}


@pytest.fixture
def client() -> TestClient:
    policy = parse_policy("echo", solution=None, counter=TiktokenCounter())
    return TestClient(create_app(SimServer(policy)))


@pytest.mark.parametrize("api", list(CASES))
def test_a_stream_read_in_any_pieces_gives_the_bodys_usage(api: Api, client: TestClient) -> None:
    path, body = CASES[api]
    plain = client.post(path, json=body).json()  # writes the cache
    again = read_body(api, client.post(path, json=body).json())  # and reads it
    assert again.complete and again.usage is not None and again.usage.cache_read_tokens > 0
    streamed = dict(body, stream=True, stream_options={"include_usage": True})
    if api != "chat":
        del streamed["stream_options"]
    raw = client.post(path, json=streamed).content
    rng = random.Random(7)
    for pieces in (1, 3, len(raw)):  # whole, a few random cuts, byte by byte
        reader = StreamReader(api)
        cuts = sorted(rng.sample(range(1, len(raw)), min(pieces - 1, len(raw) - 1)))
        for a, b in zip([0, *cuts], [*cuts, len(raw)], strict=True):
            reader.feed(raw[a:b])
        got = reader.close()
        assert got.complete, (api, pieces)
        assert got.usage == again.usage, (api, pieces)
        assert got.model == plain["model"]
        assert got.stop_reason in ("end_turn", "stop", "completed")


def test_an_anthropic_stream_cut_after_its_start_keeps_the_input_it_reported(
    client: TestClient,
) -> None:
    path, body = CASES["anthropic"]
    raw = client.post(path, json=dict(body, stream=True)).content
    head = raw[: raw.index(b"event: content_block_delta")]
    reader = StreamReader("anthropic")
    reader.feed(head)
    got = reader.close()
    assert not got.complete
    assert got.usage is not None and got.usage.input_tokens > 0
    assert got.usage.output_tokens == 1  # what message_start says: the rest never came


def test_garbage_and_foreign_events_are_passed_over() -> None:
    reader = StreamReader("chat")
    reader.feed(b"data: {not json\n\n: a comment\n\ndata: [1, 2]\n\nevent: x\ndata: {}\n\n")
    reader.feed(b'data: {"usage": {"prompt_tokens": 5, "completion_tokens": 2}}\r\n\r\n')
    reader.feed(b"data: [DONE]\n\n")
    got = reader.close()
    assert got.usage == Usage(input_tokens=5, output_tokens=2) and got.complete
    assert read_body("anthropic", ["not", "a", "body"]).usage is None

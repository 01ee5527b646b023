"""A scripted HTTP server on 127.0.0.1 for driving the real SDK clients offline.

Why a socket and not a mocked transport: the adapters must work with the SDKs exactly as
shipped (their serialisation, headers, error classes, retry switches), so the tests let
the SDKs speak real HTTP to a server that answers with the providers' response shapes
and records every request it got.

    with FakeServer() as srv:
        srv.reply(200, {...})            # queued in order; one per request
        srv.reply(429, {...}, headers={"retry-after": "7"})
        ...  # point the SDK at srv.url
        srv.requests[0].json             # what the SDK sent
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass
class Reply:
    status: int = 200
    body: Any = None  # dict/list → JSON; str → sent as is
    headers: dict[str, str] = field(default_factory=dict)


@dataclass
class Recorded:
    method: str
    path: str
    headers: dict[str, str]  # lower-cased names
    body: bytes

    @property
    def json(self) -> Any:
        return json.loads(self.body) if self.body else None


class FakeServer:
    """Replays queued replies in order; an unscripted request goes to ``responder`` (which
    builds a reply from the request, e.g. a simulated provider's) or gets a 599 error."""

    def __init__(self, responder: Callable[[Recorded], Reply] | None = None) -> None:
        self.responder = responder
        self.requests: list[Recorded] = []
        self._replies: list[Reply] = []
        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler_class())
        self._server.daemon_threads = True
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.01}, daemon=True
        )

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def reply(
        self, status: int = 200, body: Any = None, headers: dict[str, str] | None = None
    ) -> None:
        with self._lock:
            self._replies.append(Reply(status, body, dict(headers or {})))

    def __enter__(self) -> FakeServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()

    def _next(self, rec: Recorded) -> Reply:
        with self._lock:
            self.requests.append(rec)
            if self._replies:
                return self._replies.pop(0)
        if self.responder is not None:
            return self.responder(rec)
        return Reply(599, {"error": {"message": "fake server: no scripted reply"}})

    def _handler_class(self) -> type[BaseHTTPRequestHandler]:
        fake = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"  # keep-alive, as the SDKs' pools expect

            def _serve(self) -> None:
                length = int(self.headers.get("content-length") or 0)
                body = self.rfile.read(length) if length else b""
                rec = Recorded(
                    method=self.command,
                    path=self.path,
                    headers={k.lower(): v for k, v in self.headers.items()},
                    body=body,
                )
                reply = fake._next(rec)
                if isinstance(reply.body, str | bytes):
                    data = reply.body.encode() if isinstance(reply.body, str) else reply.body
                    ctype = "text/plain"
                else:
                    data = json.dumps(reply.body).encode()
                    ctype = "application/json"
                self.send_response(reply.status)
                self.send_header("content-type", ctype)
                self.send_header("content-length", str(len(data)))
                for k, v in reply.headers.items():
                    self.send_header(k, v)
                self.end_headers()
                self.wfile.write(data)

            do_POST = _serve
            do_GET = _serve

            def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
                pass  # keep pytest output clean

        return Handler


def complete(model: Any, request: Any, *, close: Any = None) -> Any:
    """``model.complete(request)`` in a fresh event loop, closing the model's HTTP pool
    (and ``close``, a caller-supplied SDK client) before the loop ends, so no socket
    outlives its loop."""

    async def go() -> Any:
        try:
            return await model.complete(request)
        finally:
            await model.aclose()
            if close is not None:
                await close.close()

    return asyncio.run(go())


# --- the providers' real response shapes (trimmed to what the SDKs parse) ----------------

# Shape of a real Messages API response with text + tool_use and the cache_creation split.
ANTHROPIC_MESSAGE = {
    "id": "msg_01XFDUDYJgAACzvnptvVoYEL",
    "type": "message",
    "role": "assistant",
    "model": "claude-sonnet-4-5-20250929",
    "content": [
        {"type": "text", "text": "Let me look."},
        {"type": "text", "text": " Listing files."},
        {
            "type": "tool_use",
            "id": "toolu_01A09q90qw90lq917835lq9",
            "name": "bash",
            "input": {"command": "ls -la", "timeout": 30},
        },
    ],
    "stop_reason": "tool_use",
    "stop_sequence": None,
    "usage": {
        "input_tokens": 12,
        "cache_creation_input_tokens": 2000,
        "cache_read_input_tokens": 5000,
        "cache_creation": {"ephemeral_5m_input_tokens": 1500, "ephemeral_1h_input_tokens": 500},
        "output_tokens": 40,
        "service_tier": "standard",
    },
}

OPENAI_RESPONSE = {
    "id": "resp_67ccd2bed1ec8190b14f964abc0542670bb6a6b452d3795b",
    "object": "response",
    "created_at": 1741476542,
    "status": "completed",
    "error": None,
    "incomplete_details": None,
    "instructions": "You are careful.",
    "max_output_tokens": 777,
    "model": "gpt-5-2025-08-07",
    "output": [
        {"type": "reasoning", "id": "rs_1", "summary": []},
        {
            "type": "message",
            "id": "msg_1",
            "status": "completed",
            "role": "assistant",
            "content": [{"type": "output_text", "text": "Running the tests.", "annotations": []}],
        },
        {
            "type": "function_call",
            "id": "fc_1",
            "call_id": "call_abc",
            "name": "bash",
            "arguments": '{"command": "pytest -q"',  # malformed: must be kept raw
            "status": "completed",
        },
    ],
    "parallel_tool_calls": True,
    "previous_response_id": None,
    "reasoning": {"effort": "medium", "summary": None},
    "service_tier": "flex",
    "store": False,
    "temperature": 1.0,
    "text": {"format": {"type": "text"}},
    "tool_choice": "auto",
    "tools": [],
    "top_p": 1.0,
    "truncation": "disabled",
    "usage": {
        "input_tokens": 3000,
        "input_tokens_details": {"cached_tokens": 2048},
        "output_tokens": 300,
        "output_tokens_details": {"reasoning_tokens": 256},
        "total_tokens": 3300,
    },
    "user": None,
    "metadata": {},
}

OPENAI_CHAT_COMPLETION = {
    "id": "chatcmpl-B9MHDbslfkBeAs8l4bebGdFOJ6PeG",
    "object": "chat.completion",
    "created": 1741570283,
    "model": "gpt-4.1-2025-04-14",
    "choices": [
        {
            "index": 0,
            "message": {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "call_DdmO9pD3xa9XTPNJ32zg2hcA",
                        "type": "function",
                        "function": {"name": "bash", "arguments": '{"command":"make test"}'},
                    },
                    {
                        "id": "call_2",
                        "type": "function",
                        "function": {"name": "submit", "arguments": "{not json"},
                    },
                ],
                "refusal": None,
                "annotations": [],
            },
            "logprobs": None,
            "finish_reason": "tool_calls",
        }
    ],
    "usage": {
        "prompt_tokens": 2500,
        "completion_tokens": 50,
        "total_tokens": 2550,
        "prompt_tokens_details": {"cached_tokens": 2048, "audio_tokens": 0},
        "completion_tokens_details": {
            "reasoning_tokens": 0,
            "audio_tokens": 0,
            "accepted_prediction_tokens": 0,
            "rejected_prediction_tokens": 0,
        },
    },
    "service_tier": "default",
    "system_fingerprint": "fp_b705f0c291",
}

DEEPSEEK_CHAT_COMPLETION = {
    "id": "930c60df-bf64-41c9-a88e-3ec75f81e00e",
    "object": "chat.completion",
    "created": 1705651092,
    "model": "deepseek-chat",
    "choices": [
        {
            "index": 0,
            "message": {"role": "assistant", "content": "All tests pass."},
            "logprobs": None,
            "finish_reason": "stop",
        }
    ],
    "usage": {
        "prompt_tokens": 1200,
        "completion_tokens": 20,
        "total_tokens": 1220,
        "prompt_tokens_details": {"cached_tokens": 1024},
        "prompt_cache_hit_tokens": 1024,
        "prompt_cache_miss_tokens": 176,
    },
    "system_fingerprint": "fp_3a5770e1b4_prod0225",
}

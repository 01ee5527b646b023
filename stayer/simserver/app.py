"""``stayer sim serve``: the provider simulator over HTTP, on the providers' own wire APIs.

``POST /v1/messages`` (and ``/v1/messages/count_tokens``), ``POST /v1/chat/completions``
and ``POST /v1/responses``, streamed or not. The model id in each request picks the
provider's caching rules, usage fields, token counter and prices; the policy (``echo``,
``script:FILE``, ``replay:PATH``) picks what the model says. One simulated provider cache
per model, shared by every client, as a provider's is. Errors come in the API's own error
shape. Any API key is accepted: bind it to loopback (the default).
"""

from __future__ import annotations

import asyncio
import itertools
import json
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import msgspec
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from stayer.errors import ConfigError
from stayer.metering import requests as wire_in
from stayer.models.caching import provider_of
from stayer.models.sim import SimModel, SimPolicy
from stayer.simserver import wire
from stayer.tokens import MessageCounter, canonical_tools, counter_for

#: The largest request body read (a long agent's request is a few MB).
MAX_BODY = 32 * 1024 * 1024


class _HttpError(Exception):
    def __init__(self, status: int, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.status, self.param = status, param


async def _body(request: Request, limit: int) -> dict[str, Any]:
    try:
        data = await wire_in.read_limited(
            request.stream(), request.headers.get("content-length"), limit
        )
    except wire_in.BodyTooLarge as e:
        raise _HttpError(413, str(e)) from None
    try:
        body = json.loads(data)
    except (ValueError, RecursionError) as e:
        raise _HttpError(400, f"the body is not JSON ({type(e).__name__})") from None
    if not isinstance(body, dict):
        raise _HttpError(400, "the body must be a JSON object")
    return body


def _json(document: msgspec.Struct, status: int = 200) -> JSONResponse:
    return JSONResponse(wire.json_body(document), status_code=status)


class SimServer:
    """The state behind the routes: a simulated model per model id, one policy."""

    def __init__(
        self, policy: SimPolicy, *, latency_s: float = 0.0, max_body: int = MAX_BODY
    ) -> None:
        self.policy = policy
        self.max_body = max_body
        self.latency_s = latency_s
        self.models: dict[str, SimModel] = {}
        self.ids = itertools.count(1)

    def model(self, model_id: str) -> SimModel:
        sim = self.models.get(model_id)
        if sim is None:
            try:
                provider = provider_of(model_id)
            except ConfigError:
                raise _HttpError(
                    404,
                    f"model: {model_id!r} is not a model the simulator knows (a real model id, "
                    "e.g. claude-sonnet-4-5, gpt-5, deepseek-chat, gemini-2.5-flash)",
                    "model",
                ) from None
            counter = MessageCounter(counter_for(provider, model_id))
            sim = self.models[model_id] = SimModel(model_id, self.policy, counter)
        return sim

    def count(self, parsed: wire_in.Parsed) -> int:
        sim = self.model(parsed.model)
        req = parsed.request
        counter = sim.counter
        return (
            counter.text(canonical_tools(req.tools))
            + counter.text(req.system)
            + sum(counter.message(m) for m in req.messages)
        )


def create_app(server: SimServer) -> Starlette:
    def route(
        parse: Callable[[dict[str, Any]], wire_in.Parsed],
        body_of: Callable[[Any, str, wire_in.Parsed], msgspec.Struct],
        events_of: Callable[[Any, str, wire_in.Parsed], Iterator[bytes]],
        error: Callable[[int, str, str | None], wire_in.ErrorBody],
        prefix: str,
    ) -> Callable[[Request], Any]:
        async def endpoint(request: Request) -> Response:
            try:
                parsed = parse(await _body(request, server.max_body))
                sim = server.model(parsed.model)
                try:
                    response = sim.respond(parsed.request)
                except ConfigError as e:  # the policy cannot answer this request
                    raise _HttpError(400, str(e)) from None
            except wire_in.WireError as e:
                return _json(error(400, str(e), e.param), 400)
            except _HttpError as e:
                return _json(error(e.status, str(e), e.param), e.status)
            rid = f"{prefix}{next(server.ids):08d}"
            if not parsed.stream:
                if server.latency_s:
                    await asyncio.sleep(server.latency_s)
                return _json(body_of(response, rid, parsed))

            async def stream() -> AsyncIterator[bytes]:
                if server.latency_s:
                    await asyncio.sleep(server.latency_s)
                for event in events_of(response, rid, parsed):
                    yield event

            return StreamingResponse(
                stream(),
                media_type="text/event-stream",
                headers={"cache-control": "no-cache"},
            )

        return endpoint

    def anthropic_error(
        status: int, message: str, param: str | None = None
    ) -> wire_in.AnthropicError:
        return wire_in.anthropic_error(status, message)

    async def count_tokens(request: Request) -> Response:
        try:
            parsed = wire_in.parse_anthropic(await _body(request, server.max_body), count_only=True)
            return JSONResponse({"input_tokens": server.count(parsed)})
        except wire_in.WireError as e:
            return _json(wire_in.anthropic_error(400, str(e)), 400)
        except _HttpError as e:
            return _json(wire_in.anthropic_error(e.status, str(e)), e.status)

    async def not_found(request: Request, exc: Exception) -> Response:
        status = getattr(exc, "status_code", 404)
        message = f"{request.method} {request.url.path}: not an endpoint of the simulator"
        if request.url.path.startswith("/v1/messages"):
            return _json(wire_in.anthropic_error(status, message), status)
        return _json(wire_in.openai_error(status, message), status)

    async def health(request: Request) -> Response:
        return JSONResponse({"status": "ok"})

    routes = [
        Route(
            "/v1/messages",
            route(
                wire_in.parse_anthropic,
                lambda r, rid, p: wire.anthropic_body(r, rid),
                lambda r, rid, p: wire.anthropic_events(r, rid),
                anthropic_error,
                "msg_sim_",
            ),
            methods=["POST"],
        ),
        Route("/v1/messages/count_tokens", count_tokens, methods=["POST"]),
        Route(
            "/v1/chat/completions",
            route(
                wire_in.parse_chat,
                lambda r, rid, p: wire.chat_body(r, rid),
                lambda r, rid, p: wire.chat_events(r, rid, p.include_usage),
                wire_in.openai_error,
                "chatcmpl-sim-",
            ),
            methods=["POST"],
        ),
        Route(
            "/v1/responses",
            route(
                wire_in.parse_responses,
                lambda r, rid, p: wire.responses_body(r, rid, p.request),
                lambda r, rid, p: wire.responses_events(r, rid, p.request),
                wire_in.openai_error,
                "resp_sim_",
            ),
            methods=["POST"],
        ),
        Route("/healthz", health, methods=["GET"]),
    ]
    return Starlette(routes=routes, exception_handlers={404: not_found, 405: not_found})

"""What a provider's response says of its own cost: the model, the usage, the tier, why it
stopped. Read from a JSON body, or from a server-sent event stream as its bytes pass by
unchanged (:class:`StreamReader`), for Anthropic Messages, OpenAI Chat Completions and
OpenAI Responses. Usage comes only from the provider's own events, never estimated here; a
stream cut before its usage event leaves ``usage`` as what was reported so far (Anthropic
reports its input in ``message_start``), and ``complete`` False.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from typing import Any

from stayer.metering.requests import Api
from stayer.usage import Usage


@dataclass(slots=True)
class Reading:
    """A response's account of itself."""

    model: str | None = None
    usage: Usage | None = None
    service_tier: str | None = None
    stop_reason: str | None = None
    complete: bool = False  # the response (or stream) ended as the API ends it


def read_body(api: Api, body: Any) -> Reading:
    """The account a non-streamed response body gives."""
    if not isinstance(body, dict):
        return Reading()
    raw = body.get("usage")
    usage = _usage(api, raw) if isinstance(raw, dict) else None
    tier = body.get("service_tier")
    tier = tier if isinstance(tier, str) else _tier(raw)
    model = body.get("model") if isinstance(body.get("model"), str) else None
    if api == "anthropic":
        stop = body.get("stop_reason")
    elif api == "chat":
        choices = body.get("choices") or [{}]
        stop = choices[0].get("finish_reason") if isinstance(choices[0], dict) else None
    else:
        details = body.get("incomplete_details")
        stop = (details.get("reason") if isinstance(details, dict) else None) or body.get("status")
    return Reading(model, usage, tier, stop if isinstance(stop, str) else None, usage is not None)


def _usage(api: Api, raw: dict[str, Any]) -> Usage:
    if api == "anthropic":
        return Usage.from_anthropic(raw)
    if api == "chat":
        return Usage.from_openai_chat(raw)
    return Usage.from_openai_responses(raw)


def _tier(raw: Any) -> str | None:
    tier = raw.get("service_tier") if isinstance(raw, dict) else None
    return tier if isinstance(tier, str) else None


@dataclass
class StreamReader:
    """Reads a stream's events from its raw bytes, fed in whatever pieces they arrive."""

    api: Api
    reading: Reading = field(default_factory=Reading)
    _buffer: bytes = b""
    _anthropic: dict[str, Any] = field(default_factory=dict)  # usage fields seen so far

    def feed(self, chunk: bytes) -> None:
        self._buffer += chunk
        while True:
            cut = _event_end(self._buffer)
            if cut is None:
                break
            event, self._buffer = self._buffer[: cut[0]], self._buffer[cut[1] :]
            self._event(event)

    def close(self) -> Reading:
        """The account once the stream has ended (or been cut)."""
        if self._buffer.strip():
            self._event(self._buffer)
            self._buffer = b""
        return self.reading

    def _event(self, raw: bytes) -> None:
        data = b"\n".join(
            line[5:].lstrip(b" ")
            for line in raw.replace(b"\r\n", b"\n").split(b"\n")
            if line.startswith(b"data:")
        )
        if not data:
            return
        if data.strip() == b"[DONE]":
            self.reading.complete = self.reading.usage is not None
            return
        try:
            event = json.loads(data)
        except (ValueError, RecursionError):
            return  # not ours to judge: the client sees the bytes as they came
        if isinstance(event, dict):
            {"anthropic": self._on_anthropic, "chat": self._on_chat}.get(
                self.api, self._on_responses
            )(event)

    def _on_anthropic(self, event: dict[str, Any]) -> None:
        kind = event.get("type")
        if kind == "message_start" and isinstance(event.get("message"), dict):
            message = event["message"]
            if isinstance(message.get("model"), str):
                self.reading.model = message["model"]
            self._merge_anthropic(message.get("usage"))
        elif kind == "message_delta":
            delta = event.get("delta")
            if isinstance(delta, dict) and isinstance(delta.get("stop_reason"), str):
                self.reading.stop_reason = delta["stop_reason"]
            self._merge_anthropic(event.get("usage"))
        elif kind == "message_stop":
            self.reading.complete = True

    def _merge_anthropic(self, usage: Any) -> None:
        """``message_delta`` repeats (or first gives) the input counts and gives the final
        output count: each field's latest value wins."""
        if not isinstance(usage, dict):
            return
        self._anthropic.update({k: v for k, v in usage.items() if v is not None})
        self.reading.usage = Usage.from_anthropic(self._anthropic)
        self.reading.service_tier = _tier(self._anthropic) or self.reading.service_tier

    def _on_chat(self, event: dict[str, Any]) -> None:
        if isinstance(event.get("model"), str):
            self.reading.model = event["model"]
        if isinstance(event.get("service_tier"), str):
            self.reading.service_tier = event["service_tier"]
        for choice in event.get("choices") or []:
            if isinstance(choice, dict) and isinstance(choice.get("finish_reason"), str):
                self.reading.stop_reason = choice["finish_reason"]
        if isinstance(event.get("usage"), dict):
            self.reading.usage = Usage.from_openai_chat(event["usage"])

    def _on_responses(self, event: dict[str, Any]) -> None:
        response = event.get("response")
        if not isinstance(response, dict):
            return
        final = event.get("type") in (
            "response.completed",
            "response.incomplete",
            "response.failed",
        )
        got = read_body("responses", response)
        self.reading = replace(
            got,
            model=got.model or self.reading.model,
            usage=got.usage or self.reading.usage,
            complete=final and got.usage is not None,
        )


def _event_end(buffer: bytes) -> tuple[int, int] | None:
    """Where the first complete event in ``buffer`` ends, and where the next begins."""
    found = [(i, i + len(sep)) for sep in (b"\n\n", b"\r\n\r\n") if (i := buffer.find(sep)) >= 0]
    return min(found) if found else None

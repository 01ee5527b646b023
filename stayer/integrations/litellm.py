"""LiteLLM, metered through its callback interface: ``install(budget=…)`` adds a
``litellm.integrations.custom_logger.CustomLogger`` to ``litellm.callbacks``, so every
``litellm.completion``/``acompletion`` (mini-swe-agent's too) is priced with stayer's
prices, held against the budget and on the session's ledger.

* Before the request is sent (``log_pre_api_call``, which sees the exact provider body):
  its worst case is held; when only fewer output tokens fit, the body's max-tokens field is
  lowered in place; when nothing fits, ``BudgetRefused`` is raised. LiteLLM logs and
  swallows every ``Exception`` a callback raises, so it is a ``BaseException`` (like
  ``KeyboardInterrupt``), with the ``stayer.BudgetExceeded`` at ``.error``.
* A streamed chat call is sent with ``stream_options.include_usage`` so that the provider,
  not LiteLLM's estimate, counts it. After the call: priced from the provider's raw
  response (a stream: the usage LiteLLM assembled from its chunks), settled, journaled,
  and recorded as ``stayer.meter`` records a call (a span, the step metrics).
"""

from __future__ import annotations

import json
import threading
import time
from typing import Any

from stayer.errors import BudgetExceeded
from stayer.metering import requests as wire
from stayer.metering.meter import Admission
from stayer.metering.usage import Reading, read_body
from stayer.pricing import PriceBook
from stayer.sdk import Budget, Session, _Core, _db, _step_metrics, _tracer_provider
from stayer.usage import Usage


class BudgetRefused(BaseException):  # noqa: N818 - what it is, not an error class name
    """A call the budget cannot hold, stopped before LiteLLM sends it."""

    def __init__(self, error: BudgetExceeded) -> None:
        super().__init__(str(error))
        self.error = error


_PARSERS: dict[wire.Api, Any] = {
    "anthropic": wire.parse_anthropic,
    "chat": wire.parse_chat,
    "responses": wire.parse_responses,
}


def _api(provider: str, body: dict[str, Any]) -> wire.Api:
    if provider == "anthropic":
        return "anthropic"
    return "chat" if "messages" in body else "responses"


def _stream_usage(api: wire.Api, usage: Any) -> Usage | None:
    """The usage LiteLLM assembled from a stream (OpenAI's shape), in the API's terms."""
    if usage is None:
        return None
    raw = usage.model_dump(exclude_none=True) if hasattr(usage, "model_dump") else dict(usage)
    if api != "anthropic":
        return Usage.from_openai_chat(raw)
    read = int(raw.get("cache_read_input_tokens") or 0)
    written = int(raw.get("cache_creation_input_tokens") or 0)
    split = (raw.get("prompt_tokens_details") or {}).get("cache_creation_token_details") or {}
    return Usage.from_anthropic(
        {
            "input_tokens": int(raw.get("prompt_tokens") or 0) - read - written,
            "cache_read_input_tokens": read,
            "cache_creation_input_tokens": written,
            "cache_creation": {
                "ephemeral_5m_input_tokens": int(split.get("ephemeral_5m_input_tokens") or 0),
                "ephemeral_1h_input_tokens": int(split.get("ephemeral_1h_input_tokens") or 0),
            },
            "output_tokens": int(raw.get("completion_tokens") or 0),
        }
    )


def _callback_base() -> type:
    from litellm.integrations.custom_logger import CustomLogger

    return CustomLogger


class _Call:
    def __init__(self, admission: Admission, parsed: wire.Parsed, api: wire.Api, body: bytes):
        self.admission, self.parsed, self.api, self.body = admission, parsed, api, body
        self.started = time.perf_counter()


def callback(
    *,
    budget: Budget | None = None,
    session: Session | str | None = None,
    tracer_provider: Any = None,
    metrics: Any = None,
) -> Any:  # a litellm CustomLogger
    """The callback, to put in ``litellm.callbacks`` yourself (``install`` does);
    ``tracer_provider`` and ``metrics`` as ``stayer.meter`` takes them."""
    core = _Core(
        budget or Budget(),
        session if isinstance(session, Session) else Session(session),
        "litellm",
        PriceBook.load(),
        _tracer_provider(tracer_provider),
        _step_metrics(metrics),
    )
    calls: dict[str, _Call] = {}
    done = threading.Condition()

    def settle(kwargs: dict[str, Any], ok: bool) -> None:
        streamed = kwargs.get("complete_streaming_response") or kwargs.get(
            "async_complete_streaming_response"
        )
        if ok and kwargs.get("stream") and streamed is None:
            return  # a chunk's event: the stream's own comes at its end
        with done:
            call = calls.pop(str(kwargs.get("litellm_call_id")), None)
        if call is None:
            return
        try:
            if not ok:
                _db(core.meter.release, call.admission)
                return
            if streamed is not None:
                usage = _stream_usage(call.api, getattr(streamed, "usage", None))
                reading = Reading(call.parsed.model, usage, None, None, usage is not None)
            else:
                try:
                    reading = read_body(call.api, json.loads(kwargs.get("original_response") or ""))
                except (ValueError, TypeError, RecursionError):
                    reading = Reading()
            took = time.perf_counter() - call.started
            _db(core.finish, call.admission, call.parsed, call.body, reading, took)
        finally:
            with done:
                done.notify_all()

    class StayerCallback(_callback_base()):  # type: ignore[misc]
        """Holds, prices and records each LiteLLM call (see the module's docstring)."""

        session, budget = core.session, core.budget

        def log_pre_api_call(self, model: str, messages: Any, kwargs: dict[str, Any]) -> None:
            body = (kwargs.get("additional_args") or {}).get("complete_input_dict")
            call_id = kwargs.get("litellm_call_id")
            if not isinstance(body, dict) or call_id is None:
                return
            api = _api(str(kwargs.get("custom_llm_provider") or ""), body)
            if api == "chat" and body.get("stream"):
                body["stream_options"] = {
                    **(body.get("stream_options") or {}),
                    "include_usage": True,
                }
            try:
                parsed = _PARSERS[api](body)
            except wire.WireError:
                return  # the provider refuses it, unbilled
            try:
                admission = _db(core.admit, parsed, core.provider(api, parsed.model))
            except BudgetExceeded as e:
                raise BudgetRefused(e) from None
            if admission.max_tokens != parsed.request.max_tokens:
                lowered = wire.with_max_tokens(api, body, admission.max_tokens)
                body.clear()
                body.update(lowered)
            with done:
                calls[str(call_id)] = _Call(admission, parsed, api, json.dumps(body).encode())

        def log_success_event(
            self, kwargs: Any, response_obj: Any, start_time: Any, end_time: Any
        ) -> None:
            settle(kwargs, True)

        def log_failure_event(
            self, kwargs: Any, response_obj: Any, start_time: Any, end_time: Any
        ) -> None:
            settle(kwargs, False)

        async def async_log_success_event(
            self, kwargs: Any, response_obj: Any, start_time: Any, end_time: Any
        ) -> None:
            settle(kwargs, True)

        async def async_log_failure_event(
            self, kwargs: Any, response_obj: Any, start_time: Any, end_time: Any
        ) -> None:
            settle(kwargs, False)

        def flush(self, timeout: float = 30.0) -> bool:
            """Wait until every call sent is settled (LiteLLM logs success on a thread of
            its own, after the call returns); False if some are still open."""
            with done:
                return done.wait_for(lambda: not calls, timeout)

    return StayerCallback()


def install(
    *,
    budget: Budget | None = None,
    session: Session | str | None = None,
    tracer_provider: Any = None,
    metrics: Any = None,
) -> Any:
    """``callback(…)`` appended to ``litellm.callbacks``; returns it (``.flush()``,
    ``.session``, ``.budget``)."""
    import litellm

    handler = callback(
        budget=budget, session=session, tracer_provider=tracer_provider, metrics=metrics
    )
    litellm.callbacks.append(handler)
    return handler

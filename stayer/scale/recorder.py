"""Each step of a run as a trainer needs it: the token ids the model saw and produced, the
messages new to the step, and its exact cost by kind of token.

``StepRecorder`` is an ``Observer`` (``stayer.run.Controls.observers``): it wraps the run's
model inside the journal, so it sees live calls only. A step that a resumed run replayed
from its journal has no record here; ``complete`` says whether every step was seen.
"""

from __future__ import annotations

from dataclasses import dataclass
from decimal import Decimal
from typing import Any, Protocol, runtime_checkable

import msgspec

from stayer.agent import Observer
from stayer.ledger import LedgerEntry
from stayer.models.base import Message, Model, ModelRequest, ModelResponse
from stayer.pricing import PriceBook
from stayer.scale.records import ToolDefinition, TraceMessage, TraceStep


@runtime_checkable
class TokenIdSource(Protocol):
    """A model that can say the token ids of a request and of its reply (the simulator,
    from its tokenizer). Models without it give steps with no token ids."""

    def token_ids(self, request: ModelRequest, reply: Message) -> tuple[list[int], list[int]]: ...


@dataclass
class _Call:
    request: ModelRequest
    response: ModelResponse
    ids: tuple[list[int], list[int]] | None


class _RecordingModel:
    def __init__(self, inner: Model, calls: list[_Call]) -> None:
        self._inner = inner
        self._calls = calls

    def __getattr__(self, name: str) -> Any:  # spec, provider, model_id, ...: the inner model's
        return getattr(self._inner, name)

    async def complete(self, request: ModelRequest) -> ModelResponse:
        response = await self._inner.complete(request)
        source = self._inner if isinstance(self._inner, TokenIdSource) else None
        ids = source.token_ids(request, response.message) if source is not None else None
        self._calls.append(_Call(request, response, ids))
        return response


class StepRecorder(Observer):
    """Records the main agent's steps (``steps``, in order)."""

    def __init__(self, prices: PriceBook) -> None:
        self.prices = prices
        self.steps: list[TraceStep] = []
        self._calls: list[_Call] = []
        self._context: list[Message] = []  # the last prompt's messages and its reply

    def model(self, inner: Model) -> Model:
        return _RecordingModel(inner, self._calls)  # type: ignore[return-value]

    def on_step(self, entry: LedgerEntry) -> None:
        calls = list(self._calls)
        self._calls.clear()  # in place: the wrapped models hold this list
        if entry.agent != "main" or not calls:
            return  # a sub-agent's step, or one replayed from the journal
        # The step's own call comes last; any before it in the same step were auxiliary
        # (a summariser's), billed in this step's entry.
        call = calls[-1]
        self.steps.append(self._step(entry, call, auxiliary_calls=len(calls) - 1))

    def complete(self, steps: int) -> bool:
        """Whether every one of the run's ``steps`` main-agent steps was recorded."""
        return [s.step for s in self.steps] == list(range(1, steps + 1))

    def _step(self, entry: LedgerEntry, call: _Call, auxiliary_calls: int) -> TraceStep:
        messages = call.request.messages
        # Messages the previous prompt (and its reply) already held are not new; after a
        # compaction the prefix differs, and the messages kept are copied context.
        kept = 0
        while (
            kept < min(len(messages), len(self._context)) and messages[kept] == self._context[kept]
        ):
            kept += 1
        reset = bool(self._context) and kept < len(self._context)
        seen = set(self._context)
        new = [
            msgspec.structs.replace(TraceMessage.of(m), copied=reset and m in seen)
            for m in (messages if reset else messages[kept:])
        ]
        first = not self._context and not self.steps
        self._context = [*messages, call.response.message]
        prompt_ids, completion_ids = call.ids if call.ids is not None else (None, None)
        step = TraceStep(
            step=entry.step,
            model=entry.model,
            context_reset=reset,
            messages=new,
            reply=TraceMessage.of(call.response.message),
            stop_reason=call.response.stop_reason,
            prompt_ids=prompt_ids,
            completion_ids=completion_ids,
            usage=entry.usage,
            cost_usd=entry.cost.to_json(),
            cost_parts=self._cost_parts(entry),
            auxiliary_calls=auxiliary_calls,
        )
        if first:  # the prefix every prompt starts with
            step.system = call.request.system
            step.tools = [
                ToolDefinition(t.name, t.description, dict(t.parameters))
                for t in call.request.tools
            ]
        return step

    def _cost_parts(self, entry: LedgerEntry) -> dict[str, str] | None:
        """The step's cost by kind of token (cache read, cache write, uncached input,
        output) at the rates it was priced at; None where they are unknown or do not add up
        to the ledger's price (a price table whose rule these rates do not capture)."""
        c = entry.cost
        if c.total is None:
            return None
        rates = self.prices.rates(c.model_ref, c.provider, c.tier, entry.usage.input_tokens)
        if rates is None:
            return None
        parts = rates.parts(entry.usage)
        if sum(parts.values(), Decimal(0)) != c.total:
            return None
        return {k: str(v) for k, v in parts.items()}

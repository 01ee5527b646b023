"""A scripted model for tests, and the price book to go with it: a model that plays a
script of replies with chosen (or random, within what a provider can bill) usage, and a
price book with chosen rates (and a long-context cliff, priced the way genai-prices does).
Shipped in the package so that tests of code built on stayer need no network and no key."""

from __future__ import annotations

import asyncio
import json
import math
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from decimal import Decimal

from stayer.models.base import Message, ModelError, ModelRequest, ModelResponse, ToolCall
from stayer.pricing import Cost, Rates
from stayer.tokens import MessageCounter, TiktokenCounter, canonical_tools
from stayer.usage import Usage

COUNTER = MessageCounter(TiktokenCounter())


def rates(inp: str, read: str, write: str, out: str) -> Rates:
    return Rates(Decimal(inp), Decimal(read), Decimal(write), Decimal(write), Decimal(out))


@dataclass
class Prices:
    """``PriceBook``'s interface over fixed rates per model id; above ``cliff`` prompt
    tokens every rate is multiplied by ``long_factor`` (a long-context tier)."""

    table: dict[str, Rates]
    cliff: int | None = None
    long_factor: Decimal = Decimal(2)

    def knows(self, model_id: str, provider: str | None = None) -> bool:
        return model_id in self.table

    def rates(
        self,
        model_id: str,
        provider: str | None = None,
        service_tier: str | None = None,
        prompt_tokens: int = 0,
    ) -> Rates | None:
        r = self.table.get(model_id)
        if r is None:
            return None
        return (
            r.scaled(self.long_factor)
            if self.cliff is not None and prompt_tokens > self.cliff
            else r
        )

    def cost(
        self,
        usage: Usage,
        model_id: str,
        provider: str | None = None,
        service_tier: str | None = None,
    ) -> Cost:
        r = self.rates(model_id, provider, service_tier, usage.input_tokens)
        if r is None:
            return Cost.unknown(model_id, provider, service_tier)
        inp, out = r.price(usage)
        return Cost(inp + out, inp, out, model_id, provider, service_tier)


def call(name: str, args: dict | str, i: int = 0) -> Message:
    text = args if isinstance(args, str) else json.dumps(args)
    return Message("assistant", "", (ToolCall(f"c{i}_{name}", name, text),))


def bash(command: str, i: int = 0) -> Message:
    return call("bash", {"command": command}, i)


def text(content: str) -> Message:
    return Message("assistant", content)


Reply = Message | Exception | Callable[[ModelRequest], Message]


@dataclass
class ScriptedModel:
    """Plays ``replies`` in order (the last one repeats; an exception is raised). Usage:
    ``usage`` if given; else the prompt as counted by ``COUNTER`` scaled by
    ``count_factor`` (a provider's tokenizer differs), cached as ``cached_share`` says,
    output as the reply's own size capped at ``max_tokens``; or, with ``rng``, random
    within what the provider could bill for this request."""

    model_id: str = "m-strong"
    replies: Sequence[Reply] = ()
    provider: str = "anthropic"
    count_factor: float = 1.0
    cached_share: float = 0.0
    output_tokens: int | None = None
    rng: random.Random | None = None
    spikes: dict[int, int] = field(default_factory=dict)  # call number → extra input tokens
    misses: set[int] = field(default_factory=set)  # call numbers whose prompt is all cache-written
    requests: list[ModelRequest] = field(default_factory=list)
    usage: Usage | None = None  # the same usage for every call
    spec_prefix: str = "test"

    @property
    def spec(self) -> str:
        return f"{self.spec_prefix}:{self.model_id}"

    async def complete(self, request: ModelRequest) -> ModelResponse:
        self.requests.append(request)
        n = len(self.requests)
        reply = self.replies[min(n, len(self.replies)) - 1] if self.replies else text("thinking")
        if isinstance(reply, Exception):
            raise reply
        message = reply(request) if callable(reply) else reply
        await asyncio.sleep(0)  # let concurrent agents interleave between reserve and settle
        if self.usage is not None:
            return ModelResponse(message, self.usage, {}, self.model_id, 0.01)
        # The prompt as the loop counts it (system, tool schemas, messages).
        prompt = COUNTER.text(request.system) + COUNTER.text(canonical_tools(request.tools))
        prompt += sum(COUNTER.message(m) for m in request.messages)
        if self.rng is not None:  # anything a provider could bill, its worst case half the time
            rng, most = self.rng, math.floor(prompt * 1.2)  # counts differ by up to TOKEN_MARGIN
            total = most if rng.random() < 0.5 else rng.randint(0, most)
            read = 0 if rng.random() < 0.5 else rng.randint(0, total)
            write = total - read if rng.random() < 0.5 else rng.randint(0, total - read)
            out = request.max_tokens if rng.random() < 0.5 else rng.randint(0, request.max_tokens)
        else:
            total = math.ceil(prompt * self.count_factor) + self.spikes.get(n, 0)
            read, write = (0, total) if n in self.misses else (int(total * self.cached_share), 0)
            out = min(
                self.output_tokens if self.output_tokens is not None else COUNTER.message(message),
                request.max_tokens,
            )
        usage = Usage(
            input_tokens=total,
            cache_read_tokens=read,
            cache_write_5m_tokens=write,
            output_tokens=out,
        )
        return ModelResponse(message, usage, {}, self.model_id, 0.01)


def failing(model_id: str, provider: str = "anthropic") -> ScriptedModel:
    """A model whose every call fails past its retries."""
    return ScriptedModel(model_id, [ModelError("503 after 6 attempts")], provider)

"""Summaries of evicted tool output written by a model (for real providers).

The ``summarize`` policy decides *what* to evict and plans with a local state digest
(``StateSummarizer``) whose size and price stand in for the call; with a real provider the
loop then asks a model for the summary itself, keeping the state an agent needs to go on.
"""

from __future__ import annotations

from collections.abc import Sequence

from stayer.messages import Message
from stayer.models.base import Model, ModelRequest
from stayer.pricing import Cost, PriceBook
from stayer.tokens import render_message

INSTRUCTIONS = """\
You compress an autonomous agent's old tool output so that it can keep working without it.
Write a terse summary that keeps the state: files created or changed (paths), commands that
failed and why, facts established, decisions taken, and open items. No preamble."""


class ModelSummarizer:
    def __init__(self, model: Model, prices: PriceBook, max_tokens: int = 1024) -> None:
        self.model = model
        self.prices = prices
        self.max_tokens = max_tokens

    def request(self, span: Sequence[Message]) -> ModelRequest:
        """The call that summarises ``span`` (also what its budget reservation is for)."""
        body = "\n\n".join(render_message(m) for m in span)
        return ModelRequest(
            system=INSTRUCTIONS,
            tools=[],
            messages=[Message("user", f"Tool output to summarise:\n\n{body}")],
            max_tokens=self.max_tokens,
        )

    async def replacement(self, span: Sequence[Message], stub: Message) -> tuple[Message, Cost]:
        """The message that replaces the planned digest ``stub`` (the first of the evicted
        span's stand-ins): the model's summary, then the stub's last line, which says where
        the full text was saved. Raises ModelError when the call fails after its retries."""
        response = await self.model.complete(self.request(span))
        cost = self.prices.cost(
            response.usage, self.model.model_id, self.model.provider, response.service_tier
        )
        marker = stub.content.splitlines()[-1]
        text = f"{response.message.content.strip()}\n{marker}"
        return Message(stub.role, text, (), stub.tool_call_id, False, "summary"), cost

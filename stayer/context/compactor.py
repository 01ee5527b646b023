"""Carrying out a compaction a context policy planned: its worst case, for the budget to
hold; the elided output archived in the workspace; the summary written by a model where a
summariser is set; the context rewritten; and the record the ledger and journal keep.

The policy decides *what* to evict and when (``stayer.context.policies``); this module
only executes the plan. It does not hold money itself: the loop funds the summary call
through the guard with the worst case given here, and settles it with the cost returned.
"""

from __future__ import annotations

from collections.abc import Callable
from decimal import Decimal

import msgspec
from msgspec import UNSET, UnsetType

from stayer.context.layout import Context
from stayer.context.policies import Compaction, policy_cost
from stayer.context.summarizer import ModelSummarizer
from stayer.events import Event, SummaryFailed
from stayer.models.base import Message, ModelError
from stayer.money import Usd
from stayer.pricing import PriceBook, Rates
from stayer.records import Record
from stayer.sandbox.base import Sandbox
from stayer.tokens import MessageCounter

RatesAt = Callable[[int], Rates | None]


class ToolsTaken(Record):
    """Tool lists a source changed mid-run, taken into the context ``when`` (at a
    ``compaction``, or at a ``call`` of a changed tool): the names added, removed and changed."""

    when: str
    added: list[str]
    removed: list[str]
    changed: list[str] | UnsetType = UNSET  # same name, new schema (absent: not said)


class Compacted(Record):
    """A compaction carried out, as its step's ledger entry keeps it; ``cost`` is what its
    summary cost (absent from entries written before it was kept); ``tools_changed``: the
    changed tool lists taken with it, if any."""

    reason: str
    first_index: int
    tokens_before: int
    tokens_after: int
    cost: Usd | UnsetType = msgspec.field(default=UNSET, name="cost_usd")
    tools_changed: ToolsTaken | UnsetType = UNSET

    @property
    def spent(self) -> Decimal:
        cost = self.cost if isinstance(self.cost, Usd) else Usd()
        return cost.amount or Decimal(0)


# Writes each archived file from inside the sandbox: stdin carries, per file, its path
# (relative to /app), its length in bytes and its body.
ARCHIVE_SCRIPT = (
    "export LC_ALL=C; mkdir -p .stayer/outputs; "
    "while IFS= read -r path && IFS= read -r len; do "
    'IFS= read -r -d "" -N "$len" body; printf %s "$body" > "$path"; done'
)


class Compactor:
    """Executes planned compactions for one agent. ``rates_at`` prices a call on the
    agent's current model; ``emit`` receives ``CompactionEvent`` and ``SummaryFailed``."""

    def __init__(
        self,
        rates_at: RatesAt,
        counter: MessageCounter,
        prices: PriceBook,
        summarizer: ModelSummarizer | None,
        sandbox: Sandbox | None,
        command_timeout: float,
        emit: Callable[[Event], None],
        path: str = "main",
    ) -> None:
        self.rates_at = rates_at
        self.counter = counter
        self.prices = prices
        self.summarizer = summarizer
        self.sandbox = sandbox
        self.command_timeout = command_timeout
        self.emit = emit
        self.path = path

    def worst_case(self, ctx: Context, c: Compaction) -> tuple[RatesAt, int, int]:
        """The summary call to hold budget for, as (rates, prompt tokens, output tokens);
        a prompt of 0 tokens: no call. A model-written summary's is the summariser's
        request exactly as it will be sent (its instructions and the span, its tier, its
        ``max_tokens``); the local digest is priced as the policy planned it, on the
        current model."""
        if not c.summary_input_tokens:
            return self.rates_at, 0, 0
        if self.summarizer is None:
            return self.rates_at, c.summary_input_tokens, c.summary_output_tokens
        request = self.summarizer.request(_span(ctx, c))
        prompt = self.counter.text(request.system) + sum(
            self.counter.message(m) for m in request.messages
        )
        m, tier, prices = self.summarizer.model, request.service_tier, self.prices
        return (lambda n: prices.rates(m.model_id, m.provider, tier, n)), prompt, request.max_tokens

    async def apply(self, ctx: Context, c: Compaction, step: int) -> Compacted:
        """Archive, summarise and rewrite ``ctx``; the record for the step's ledger entry
        (its ``cost_usd`` is what the summary cost)."""
        await self._archive(c.archive)
        cost = policy_cost(c, self.rates_at(c.summary_input_tokens)) or Decimal(0)
        if self.summarizer is not None and c.summary_input_tokens:
            cost = await self._summarize(ctx, c, cost)
        first = c.apply(ctx)
        self.emit(c.event(step, str(cost)))
        return Compacted(
            reason=c.reason,
            first_index=first,
            tokens_before=c.tokens_before,
            tokens_after=c.tokens_after,
            cost=Usd(cost),
        )

    async def _summarize(self, ctx: Context, c: Compaction, planned: Decimal) -> Decimal:
        """Replace the planned digest with a model-written summary of the evicted span.
        If the summariser's call fails (after its retries), the digest stays: the
        compaction still happens, and a failed call bills nothing."""
        assert self.summarizer is not None
        first = min(c.changes)
        try:
            c.changes[first], cost = await self.summarizer.replacement(
                _span(ctx, c), c.changes[first]
            )
        except ModelError as e:
            self.emit(
                SummaryFailed(agent=self.path, model=self.summarizer.model.spec, error=str(e))
            )
            return Decimal(0)
        return cost.total if cost.total is not None else planned

    async def _archive(self, files: dict[str, str]) -> None:
        """Save elided tool output in the workspace (the stubs name these files). Written
        from inside the sandbox, so a path the agent planted cannot lead outside /app."""
        if not files or self.sandbox is None:
            return
        # Paths relative to /app (the working directory), so that every sandbox kind works.
        payload = b"".join(
            f"{path.removeprefix('/app/')}\n{len(body.encode())}\n".encode() + body.encode()
            for path, body in files.items()
        )
        await self.sandbox.exec(ARCHIVE_SCRIPT, stdin=payload, timeout=self.command_timeout)


def _span(ctx: Context, c: Compaction) -> list[Message]:
    """The messages a compaction evicts, in order: what a summary is written of."""
    return [ctx.messages[i] for i in sorted(c.changes)]

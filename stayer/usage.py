"""One normalised token usage, built from each provider's own usage fields.

Semantics follow genai-prices and OpenTelemetry GenAI: ``input_tokens`` is the total
prompt size *including* cache reads and cache writes; ``output_tokens`` includes
reasoning tokens, and ``reasoning_tokens`` is only a breakdown of it (never billed twice).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields
from typing import Any


@dataclass(frozen=True, slots=True)
class Usage:
    input_tokens: int = 0
    cache_read_tokens: int = 0
    cache_write_5m_tokens: int = 0
    cache_write_1h_tokens: int = 0
    output_tokens: int = 0
    reasoning_tokens: int = 0
    # Derived (5m + 1h), a field so that JSON carries it; a stored usage that has only
    # this total (written before the split) reads as 5-minute writes.
    cache_write_tokens: int = field(init=False, default=0)

    def __post_init__(self) -> None:
        total = self.cache_write_5m_tokens + self.cache_write_1h_tokens
        if not total and self.cache_write_tokens:
            object.__setattr__(self, "cache_write_5m_tokens", self.cache_write_tokens)
        else:
            object.__setattr__(self, "cache_write_tokens", total)

    @property
    def uncached_input_tokens(self) -> int:
        return self.input_tokens - self.cache_read_tokens - self.cache_write_tokens

    @property
    def cache_hit_ratio(self) -> float:
        return self.cache_read_tokens / self.input_tokens if self.input_tokens else 0.0

    def __add__(self, other: Usage) -> Usage:
        return Usage(**{n: getattr(self, n) + getattr(other, n) for n in KINDS})

    def to_dict(self) -> dict[str, int]:
        """The JSON shape used by ``--json`` outputs and the ledger."""
        return asdict(self)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Usage:
        kw = {k: int(v) for k, v in d.items() if k in KINDS}
        if "cache_write_tokens" in d and not (
            "cache_write_5m_tokens" in d or "cache_write_1h_tokens" in d
        ):
            kw["cache_write_5m_tokens"] = int(d["cache_write_tokens"])
        return cls(**kw)

    # --- provider shapes -------------------------------------------------------------

    @classmethod
    def from_openai_chat(cls, u: Mapping[str, Any]) -> Usage:
        """OpenAI Chat Completions (also vLLM, Ollama, most OpenAI-compatible servers)."""
        # DeepSeek reports its cache hits in its own top-level fields.
        if "prompt_cache_hit_tokens" in u:
            return cls.from_deepseek(u)
        cached = _get(u.get("prompt_tokens_details") or {}, "cached_tokens")
        return cls._chat_completion(u, _get(u, "prompt_tokens"), cached)

    @classmethod
    def _chat_completion(cls, u: Mapping[str, Any], prompt: int, cached: int) -> Usage:
        """A Chat Completions usage, given its prompt size and cache reads (which providers
        report in fields of their own)."""
        return cls(
            input_tokens=prompt,
            cache_read_tokens=cached,
            output_tokens=_get(u, "completion_tokens"),
            reasoning_tokens=_get(u.get("completion_tokens_details") or {}, "reasoning_tokens"),
        )

    @classmethod
    def from_openai_responses(cls, u: Mapping[str, Any]) -> Usage:
        return cls(
            input_tokens=_get(u, "input_tokens"),
            cache_read_tokens=_get(u.get("input_tokens_details") or {}, "cached_tokens"),
            output_tokens=_get(u, "output_tokens"),
            reasoning_tokens=_get(u.get("output_tokens_details") or {}, "reasoning_tokens"),
        )

    @classmethod
    def from_anthropic(cls, u: Mapping[str, Any]) -> Usage:
        """Anthropic Messages: ``input_tokens`` there is only the uncached remainder."""
        uncached = _get(u, "input_tokens")
        read = _get(u, "cache_read_input_tokens")
        written = _get(u, "cache_creation_input_tokens")
        split = u.get("cache_creation") or {}
        w1h = _get(split, "ephemeral_1h_input_tokens")
        w5m = _get(split, "ephemeral_5m_input_tokens") if split else written
        if split and w5m + w1h != written:
            # Trust the total; attribute any unexplained remainder to the default 5 m TTL.
            w5m = written - w1h
        return cls(
            input_tokens=uncached + read + written,
            cache_read_tokens=read,
            cache_write_5m_tokens=w5m,
            cache_write_1h_tokens=w1h,
            output_tokens=_get(u, "output_tokens"),
            # Extended thinking is billed inside output_tokens; newer APIs also break it out.
            reasoning_tokens=_get(u.get("output_tokens_details") or {}, "thinking_tokens"),
        )

    @classmethod
    def from_deepseek(cls, u: Mapping[str, Any]) -> Usage:
        hit = _get(u, "prompt_cache_hit_tokens")
        miss = _get(u, "prompt_cache_miss_tokens")
        return cls._chat_completion(u, _get(u, "prompt_tokens") or hit + miss, hit)

    @classmethod
    def from_gemini(cls, u: Mapping[str, Any]) -> Usage:
        """Gemini ``usageMetadata``: thoughts are billed as output but reported apart."""
        thoughts = _get(u, "thoughtsTokenCount")
        return cls(
            input_tokens=_get(u, "promptTokenCount"),
            cache_read_tokens=_get(u, "cachedContentTokenCount"),
            output_tokens=_get(u, "candidatesTokenCount") + thoughts,
            reasoning_tokens=thoughts,
        )


#: The kinds of token a usage counts (its constructor's fields).
KINDS = tuple(f.name for f in fields(Usage) if f.init)


def _get(d: Mapping[str, Any], key: str) -> int:
    # dict first: the Mapping check is an ABC lookup, and audits call this per logged call
    v = d.get(key) if type(d) is dict or isinstance(d, Mapping) else getattr(d, key, None)
    return int(v or 0)

"""Each provider's documented prompt-caching rules, shared by the simulator (which applies
them) and the cache-break forensics (which explains a request that missed).

* Anthropic — explicit ``cache_control`` breakpoints (≤ 4), a per-model minimum
  cacheable length (1,024 / 2,048 / 4,096), reads within 20 blocks before a breakpoint,
  entries of 5 minutes or 1 hour refreshed on every hit.
* OpenAI — automatic from 1,024 tokens, hits in 128-token increments, ~5 minutes.
* DeepSeek — automatic, 64-token units. Gemini — implicit from 1,024 / 2,048 tokens.
* llama.cpp (``local:``) — each slot reuses the longest common prefix of its last prompt.

The per-model table and sources: ``docs/internals.md#models-caching``.
"""

from __future__ import annotations

from dataclasses import dataclass
from decimal import Decimal
from typing import Literal

from stayer.errors import ConfigError
from stayer.pricing import Rates


@dataclass(frozen=True, slots=True)
class CacheRules:
    mode: Literal["explicit", "automatic"]
    min_tokens: int
    increment: int = 1  # granularity of an automatic hit, counted from min_tokens
    ttl_s: float = 300.0
    lookback_blocks: int = 20  # explicit mode: how far before a breakpoint a hit is found
    usage_shape: Literal["anthropic", "openai_responses", "deepseek", "gemini"] = "anthropic"


def provider_of(model_id: str) -> str:
    """The provider whose rules a ``sim:`` model follows, from its model family."""
    m = model_id.lower()
    if m.startswith("claude"):
        return "anthropic"
    if m.startswith(("gpt-", "o1", "o3", "o4", "codex")):
        return "openai"
    if m.startswith("deepseek"):
        return "deepseek"
    if m.startswith("gemini"):
        return "google"
    raise ConfigError(
        f"--model sim:{model_id}: unknown model family; use a real model id such as "
        "sim:claude-sonnet-4-5, sim:gpt-5, sim:deepseek-chat or sim:gemini-2.5-flash"
    )


def cache_rules(provider: str, model_id: str) -> CacheRules:
    m = model_id.lower()
    if provider == "anthropic":
        if any(k in m for k in ("opus-4-5", "opus-4-6", "haiku-4-5")):
            minimum = 4096
        elif "sonnet-4-6" in m or "haiku" in m:
            minimum = 2048
        else:
            minimum = 1024
        return CacheRules("explicit", minimum, usage_shape="anthropic")
    if provider == "openai":
        return CacheRules("automatic", 1024, increment=128, usage_shape="openai_responses")
    if provider == "deepseek":
        return CacheRules("automatic", 64, increment=64, ttl_s=3600.0, usage_shape="deepseek")
    if provider == "google":
        return CacheRules("automatic", 2048 if "pro" in m else 1024, usage_shape="gemini")
    if provider == "local":
        return CacheRules("automatic", 1, ttl_s=float("inf"), usage_shape="openai_responses")
    raise ConfigError(f"no caching rules for provider {provider!r}")


def cached_length(rules: CacheRules, prefix_tokens: int) -> int:
    """How much of a reusable prefix of this length the provider reports as read."""
    if prefix_tokens < rules.min_tokens:
        return 0
    if rules.mode == "explicit":
        return prefix_tokens
    return (
        rules.min_tokens + (prefix_tokens - rules.min_tokens) // rules.increment * rules.increment
    )


def miss_premium(rules: CacheRules, rates: Rates) -> Decimal:
    """What a prompt token costs when it must be sent again instead of read from the cache,
    per million tokens: written again (explicit caching, at the entry's lifetime's price)
    or billed as input (automatic caching), less the read it replaces."""
    if rules.mode == "explicit":
        write = rates.cache_write_1h if rules.ttl_s >= 3600 else rates.cache_write_5m
    else:
        write = rates.input
    return write - rates.cache_read

"""A session's cache breaks, explained and priced as calls are metered.

Each call is compared with the session's previous one by the context layer's forensics
(``stayer.context.forensics``: ``model_switch``, ``tools_changed``, ``prefix_edit``,
``ttl_expired``, ``below_minimum``, ``unknown``); a break also gets ``cost_usd``, what the
miss cost over a hit: the previous prompt's cacheable tokens the provider did not read,
times the model's miss premium (a write or an uncached read, less the read it replaced).
With explicit breakpoints (Anthropic) what was cacheable is what the provider said it
read or wrote at the previous call's breakpoints, not the whole previous prompt: a client
that marks only its system prompt misses nothing when its messages are billed as input.
"""

from __future__ import annotations

import time
from decimal import Decimal

from stayer.context.forensics import CacheBreak, CacheForensics
from stayer.errors import ConfigError
from stayer.models.base import ModelRequest
from stayer.models.caching import cache_rules, cached_length, miss_premium
from stayer.money import MTOK, Usd
from stayer.pricing import PriceBook
from stayer.tokens import MessageCounter, counter_for
from stayer.usage import Usage


class SessionForensics:
    """One session's forensics: the previous call, kept in this process."""

    def __init__(self, provider: str, model: str) -> None:
        self.forensics = CacheForensics(MessageCounter(counter_for(provider, model)))
        self.previous_usage: Usage | None = None

    def observe(
        self,
        request: ModelRequest,
        usage: Usage,
        model: str,
        provider: str,
        tier: str | None,
        prices: PriceBook,
        now: float | None = None,
    ) -> CacheBreak | None:
        try:
            rules = cache_rules(provider, model)
        except ConfigError:
            return None  # a provider whose caching we do not model: no verdict
        previous, before = self.forensics.previous, self.previous_usage
        self.previous_usage = usage
        verdict = self.forensics.observe(
            request, usage, model, rules, time.time() if now is None else now
        )
        if verdict is None or previous is None:
            return verdict
        if rules.mode == "explicit" and before is not None:
            cacheable = before.cache_read_tokens + before.cache_write_tokens
        else:
            cacheable = cached_length(rules, previous.tokens)
        missed = max(0, cacheable - usage.cache_read_tokens)
        if verdict.reason in ("unknown", "ttl_expired") and not missed:
            return None  # all that the previous call left in the cache was read
        rates = prices.rates(model, provider, tier, prompt_tokens=usage.input_tokens)
        verdict.missed_tokens = missed
        verdict.cost = (
            None if rates is None else Usd(Decimal(missed) * miss_premium(rules, rates) / MTOK)
        )
        return verdict

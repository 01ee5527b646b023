"""Each provider's own usage shape → one normalised Usage (stayer/usage.py).

The dicts are shaped as each provider documents its response ``usage`` object.
"""

from __future__ import annotations

from stayer.usage import Usage

# OpenAI Chat Completions, o-series/gpt-5 style: cached prompt tokens and reasoning tokens.
OPENAI_CHAT = {
    "prompt_tokens": 2006,
    "completion_tokens": 300,
    "total_tokens": 2306,
    "prompt_tokens_details": {"cached_tokens": 1920, "audio_tokens": 0},
    "completion_tokens_details": {
        "reasoning_tokens": 192,
        "audio_tokens": 0,
        "accepted_prediction_tokens": 0,
        "rejected_prediction_tokens": 0,
    },
}

# OpenAI Responses API.
OPENAI_RESPONSES = {
    "input_tokens": 10000,
    "input_tokens_details": {"cached_tokens": 8000},
    "output_tokens": 1000,
    "output_tokens_details": {"reasoning_tokens": 600},
    "total_tokens": 11000,
}

# Anthropic Messages: input_tokens is only the uncached remainder; cache writes split by TTL.
ANTHROPIC = {
    "input_tokens": 50,
    "cache_creation_input_tokens": 2048,
    "cache_read_input_tokens": 10000,
    "cache_creation": {"ephemeral_5m_input_tokens": 48, "ephemeral_1h_input_tokens": 2000},
    "output_tokens": 503,
    "service_tier": "standard",
}

# DeepSeek: OpenAI-shaped plus its own hit/miss fields.
DEEPSEEK = {
    "prompt_tokens": 1500,
    "completion_tokens": 400,
    "total_tokens": 1900,
    "prompt_cache_hit_tokens": 1024,
    "prompt_cache_miss_tokens": 476,
    "completion_tokens_details": {"reasoning_tokens": 300},
}

# Gemini usageMetadata: promptTokenCount includes cached content; thoughts reported apart.
GEMINI = {
    "promptTokenCount": 12000,
    "candidatesTokenCount": 350,
    "cachedContentTokenCount": 8000,
    "thoughtsTokenCount": 900,
    "totalTokenCount": 13250,
    "promptTokensDetails": [{"modality": "TEXT", "tokenCount": 12000}],
    "cacheTokensDetails": [{"modality": "TEXT", "tokenCount": 8000}],
}


def test_openai_chat_cached_and_reasoning() -> None:
    u = Usage.from_openai_chat(OPENAI_CHAT)
    assert u == Usage(
        input_tokens=2006, cache_read_tokens=1920, output_tokens=300, reasoning_tokens=192
    )
    assert u.uncached_input_tokens == 2006 - 1920
    # reasoning is a breakdown of output, not extra output
    assert u.output_tokens == OPENAI_CHAT["completion_tokens"]


def test_openai_chat_without_details() -> None:
    u = Usage.from_openai_chat({"prompt_tokens": 12, "completion_tokens": 5, "total_tokens": 17})
    assert u == Usage(input_tokens=12, output_tokens=5)


def test_openai_responses() -> None:
    u = Usage.from_openai_responses(OPENAI_RESPONSES)
    assert u == Usage(
        input_tokens=10000, cache_read_tokens=8000, output_tokens=1000, reasoning_tokens=600
    )


def test_anthropic_5m_1h_split() -> None:
    u = Usage.from_anthropic(ANTHROPIC)
    assert u.input_tokens == 50 + 10000 + 2048  # made total, as genai-prices expects
    assert u.cache_read_tokens == 10000
    assert (u.cache_write_5m_tokens, u.cache_write_1h_tokens) == (48, 2000)
    assert u.cache_write_tokens == 2048
    assert u.uncached_input_tokens == 50
    assert u.output_tokens == 503


def test_anthropic_without_ttl_split_is_5m() -> None:
    # Older responses carry only cache_creation_input_tokens: the default TTL is 5 minutes.
    u = Usage.from_anthropic(
        {
            "input_tokens": 3,
            "cache_creation_input_tokens": 1500,
            "cache_read_input_tokens": 0,
            "output_tokens": 10,
        }
    )
    assert (u.cache_write_5m_tokens, u.cache_write_1h_tokens) == (1500, 0)
    assert u.input_tokens == 1503


def test_anthropic_split_not_summing_trusts_total() -> None:
    raw = dict(ANTHROPIC, cache_creation={"ephemeral_1h_input_tokens": 2000})
    u = Usage.from_anthropic(raw)
    assert (u.cache_write_5m_tokens, u.cache_write_1h_tokens) == (48, 2000)


def test_deepseek_hit_miss() -> None:
    u = Usage.from_deepseek(DEEPSEEK)
    assert u == Usage(
        input_tokens=1500, cache_read_tokens=1024, output_tokens=400, reasoning_tokens=300
    )
    assert u.uncached_input_tokens == DEEPSEEK["prompt_cache_miss_tokens"]
    # the OpenAI-compatible entry point recognises DeepSeek's own fields
    assert Usage.from_openai_chat(DEEPSEEK) == u


def test_deepseek_without_prompt_tokens_sums_hit_and_miss() -> None:
    u = Usage.from_deepseek(
        {"prompt_cache_hit_tokens": 100, "prompt_cache_miss_tokens": 20, "completion_tokens": 7}
    )
    assert u.input_tokens == 120


def test_gemini_cached_and_thoughts() -> None:
    u = Usage.from_gemini(GEMINI)
    assert u.input_tokens == 12000
    assert u.cache_read_tokens == 8000
    assert u.output_tokens == 350 + 900  # thoughts are billed as output
    assert u.reasoning_tokens == 900


def test_add_dict_roundtrip_and_ratio() -> None:
    a = Usage.from_anthropic(ANTHROPIC)
    b = Usage.from_openai_chat(OPENAI_CHAT)
    s = a + b
    assert s.input_tokens == a.input_tokens + b.input_tokens
    assert s.cache_write_1h_tokens == 2000
    d = s.to_dict()
    assert d["cache_write_tokens"] == 2048
    assert Usage.from_dict(d) == s
    assert Usage.from_dict({"input_tokens": 10, "cache_write_tokens": 4}).cache_write_5m_tokens == 4
    assert b.cache_hit_ratio == 1920 / 2006
    assert Usage().cache_hit_ratio == 0.0


def test_anthropic_thinking_tokens_are_a_breakdown_of_output():
    u = Usage.from_anthropic(
        {
            "input_tokens": 10,
            "output_tokens": 500,
            "output_tokens_details": {"thinking_tokens": 320},
        }
    )
    assert u.output_tokens == 500 and u.reasoning_tokens == 320

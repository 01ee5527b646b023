"""The simulator's caching rules, checked against the providers' documented behaviour.

Token counts come from a word counter so that each request's size is known exactly; every
message also carries the layout's fixed framing of 4 tokens.
"""

from __future__ import annotations

import asyncio

import pytest

from stayer.errors import ConfigError
from stayer.models.base import Message, ModelRequest, ToolSpec
from stayer.models.caching import cache_rules, provider_of
from stayer.models.sim import SimModel
from stayer.models.sim_policies import OraclePolicy, parse_policy
from stayer.tokens import MessageCounter


class WordCounter:
    encoding_name = "words"

    def count(self, text: str) -> int:
        return len(text.split())

    def encode(self, text: str) -> list[int]:
        return list(range(self.count(text)))

    def decode(self, tokens: list[int]) -> str:
        return " ".join("w" for _ in tokens)


class Fixed:
    def next_message(self, request: ModelRequest) -> Message:
        return Message(role="assistant", content="ok")


TOOLS = [ToolSpec("bash", "run", {"type": "object"})]


def words(n: int, tag: str = "w") -> str:
    return " ".join(f"{tag}{i}" for i in range(n))


def call(
    sim: SimModel,
    system: str,
    messages: list[Message],
    *,
    now: float = 0.0,
    key: str | None = "run",
    breakpoints: list[int] | None = None,
    ttl: str = "5m",
) -> dict:
    req = ModelRequest(
        system=system,
        tools=TOOLS,
        messages=messages,
        cache_breakpoints=[0, len(messages) - 1] if breakpoints is None else breakpoints,
        cache_key=key,
        cache_ttl=ttl,  # type: ignore[arg-type]
        now=now,
    )
    return asyncio.run(sim.complete(req)).raw_usage


def sim(model: str) -> SimModel:
    return SimModel(model, Fixed(), MessageCounter(WordCounter()))


def prompt_tokens(sim_model: SimModel, system: str, messages: list[Message]) -> int:
    mc = sim_model.counter
    from stayer.tokens import canonical_tools

    return mc.text(canonical_tools(TOOLS)) + mc.text(system) + sum(mc.message(m) for m in messages)


# --- Anthropic ---------------------------------------------------------------------------


def test_anthropic_write_then_read_whole_previous_prompt():
    s = sim("claude-sonnet-4-5")
    history = [Message("user", words(1500))]
    first = call(s, "sys", history)
    total1 = prompt_tokens(s, "sys", history)
    assert first["cache_read_input_tokens"] == 0
    assert first["cache_creation_input_tokens"] == total1
    assert first["input_tokens"] == 0
    history += [Message("assistant", words(50, "a")), Message("user", words(200, "b"))]
    second = call(s, "sys", history, now=10)
    total2 = prompt_tokens(s, "sys", history)
    assert second["cache_read_input_tokens"] == total1
    assert second["cache_creation_input_tokens"] == total2 - total1
    assert second["cache_creation"] == {
        "ephemeral_5m_input_tokens": total2 - total1,
        "ephemeral_1h_input_tokens": 0,
    }


def test_anthropic_below_minimum_is_not_cached():
    s = sim("claude-sonnet-4-5")  # minimum 1,024 tokens
    history = [Message("user", words(500))]
    first = call(s, "sys", history)
    second = call(s, "sys", history, now=1)
    for u in (first, second):
        assert u["cache_creation_input_tokens"] == 0 and u["cache_read_input_tokens"] == 0
        assert u["input_tokens"] == prompt_tokens(s, "sys", history)


@pytest.mark.parametrize(
    ("model", "minimum"),
    [
        ("claude-sonnet-4-5", 1024),
        ("claude-opus-4-1", 1024),
        ("claude-opus-4-5", 4096),
        ("claude-haiku-4-5", 4096),
        ("claude-3-5-haiku", 2048),
        ("claude-sonnet-4-6", 2048),
    ],
)
def test_anthropic_minimum_cacheable_length_by_model(model, minimum):
    assert cache_rules("anthropic", model).min_tokens == minimum


def test_anthropic_ttl_5m_expires_and_hits_refresh_it():
    s = sim("claude-sonnet-4-5")
    history = [Message("user", words(1500))]
    total = prompt_tokens(s, "sys", history)
    call(s, "sys", history, now=0)
    assert (
        call(s, "sys", history, now=240)["cache_read_input_tokens"] == total
    )  # 4 min: hit, refreshed
    assert (
        call(s, "sys", history, now=480)["cache_read_input_tokens"] == total
    )  # 8 min: alive since 4
    expired = call(s, "sys", history, now=480 + 301)  # idle > 5 min
    assert expired["cache_read_input_tokens"] == 0
    assert expired["cache_creation_input_tokens"] == total


def test_anthropic_1h_ttl_survives_ten_minutes_and_reports_1h_writes():
    s = sim("claude-sonnet-4-5")
    history = [Message("user", words(1500))]
    total = prompt_tokens(s, "sys", history)
    first = call(s, "sys", history, now=0, ttl="1h")
    assert first["cache_creation"] == {
        "ephemeral_5m_input_tokens": 0,
        "ephemeral_1h_input_tokens": total,
    }
    assert call(s, "sys", history, now=600, ttl="1h")["cache_read_input_tokens"] == total


def test_anthropic_lookback_is_limited_to_20_blocks():
    s = sim("claude-sonnet-4-5")
    history = [Message("user", words(1500))]
    call(s, "sys", history, breakpoints=[0])
    near = history + [Message("user", "x")] * 19
    assert call(s, "sys", near, breakpoints=[len(near) - 1], now=1)["cache_read_input_tokens"] > 0
    s2 = sim("claude-sonnet-4-5")
    call(s2, "sys", history, breakpoints=[0])
    far = history + [Message("user", "x")] * 25
    assert call(s2, "sys", far, breakpoints=[len(far) - 1], now=1)["cache_read_input_tokens"] == 0


def test_anthropic_prefix_edit_misses_from_the_edit_on():
    s = sim("claude-sonnet-4-5")
    history = [
        Message("user", words(1500)),
        Message("assistant", "a"),
        Message("user", words(1200, "c")),
    ]
    call(s, "sys", history)
    edited = [history[0], Message("assistant", "EDITED"), history[2]]
    u = call(s, "sys", edited, now=1)
    # The first breakpoint (after the task message) still hits; everything after it is re-written.
    assert u["cache_read_input_tokens"] == prompt_tokens(s, "sys", history[:1])


def test_system_prompt_change_breaks_everything():
    s = sim("claude-sonnet-4-5")
    history = [Message("user", words(1500))]
    call(s, "sys", history)
    assert call(s, "sys changed", history, now=1)["cache_read_input_tokens"] == 0


# --- OpenAI ------------------------------------------------------------------------------


def test_openai_automatic_cache_rounds_down_to_128_token_increments():
    s = sim("gpt-5")
    history = [Message("user", words(1990))]
    total = prompt_tokens(s, "sys", history)
    assert 1024 < total < 2048
    first = call(s, "sys", history, breakpoints=[])
    assert first["input_tokens_details"]["cached_tokens"] == 0
    second = call(s, "sys", history + [Message("user", "more")], now=1, breakpoints=[])
    expected = 1024 + (total - 1024) // 128 * 128
    assert second["input_tokens_details"]["cached_tokens"] == expected
    assert second["input_tokens"] == total + prompt_tokens(
        s, "", [Message("user", "more")]
    ) - prompt_tokens(s, "", [])


def test_openai_below_1024_tokens_never_cached():
    s = sim("gpt-5")
    history = [Message("user", words(900))]
    call(s, "sys", history)
    assert call(s, "sys", history, now=1)["input_tokens_details"]["cached_tokens"] == 0


def test_openai_prompt_cache_key_routes_to_separate_caches():
    s = sim("gpt-5")
    history = [Message("user", words(3000))]
    call(s, "sys", history, key="a")
    assert call(s, "sys", history, key="b", now=1)["input_tokens_details"]["cached_tokens"] == 0
    assert call(s, "sys", history, key="a", now=2)["input_tokens_details"]["cached_tokens"] > 0


def test_deepseek_reports_hit_and_miss_in_64_token_units():
    s = sim("deepseek-chat")
    history = [Message("user", words(1000))]
    total = prompt_tokens(s, "sys", history)
    call(s, "sys", history)
    u = call(s, "sys", history + [Message("user", "next")], now=1)
    assert u["prompt_cache_hit_tokens"] == total // 64 * 64
    assert u["prompt_cache_hit_tokens"] + u["prompt_cache_miss_tokens"] == u["prompt_tokens"]


def test_usage_goes_through_the_same_normalisation_as_real_calls():
    s = sim("claude-sonnet-4-5")
    history = [Message("user", words(1500))]
    req = ModelRequest(system="sys", tools=TOOLS, messages=history, cache_breakpoints=[0], now=0)
    r = asyncio.run(s.complete(req))
    assert r.usage.input_tokens == prompt_tokens(s, "sys", history)
    assert r.usage.cache_write_5m_tokens == r.raw_usage["cache_creation_input_tokens"]


# --- policies and model names ------------------------------------------------------------


def test_provider_of_unknown_family_is_bad_input():
    assert provider_of("claude-sonnet-4-5") == "anthropic"
    assert provider_of("gpt-5") == "openai"
    with pytest.raises(ConfigError, match="sim:llama"):
        provider_of("llama")


@pytest.mark.parametrize(
    "spec", ["synthetic:steps=x", "synthetic:bogus=1", "synthetic:steps=0", "nope", "replay:"]
)
def test_invalid_policy_specs_are_bad_input(spec):
    with pytest.raises(ConfigError, match="--sim-policy"):
        parse_policy(spec, solution="true", counter=WordCounter())


def test_oracle_runs_solution_then_submits():
    policy = OraclePolicy("echo hi > /app/x\n")
    req = ModelRequest(system="s", tools=TOOLS, messages=[Message("user", "task")])
    first = policy.next_message(req)
    assert (
        first.tool_calls[0].name == "bash" and "echo hi > /app/x" in first.tool_calls[0].arguments
    )
    req.messages += [first, Message("tool", "ok", tool_call_id=first.tool_calls[0].id)]
    assert policy.next_message(req).tool_calls[0].name == "submit"

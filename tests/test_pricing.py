"""Usage × model × tier → Cost, checked against hand arithmetic on published prices.

Expected values are computed here from the providers' per-million-token list prices (as
carried by genai-prices 0.2.3), never copied from the function under test. ``AT`` pins
the request time, since prices are dated and DeepSeek's depend on the time of day.
"""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime
from decimal import Decimal as D
from pathlib import Path

import pytest

# Provider usage objects as documented, shared with the normalisation tests.
from test_usage import ANTHROPIC, DEEPSEEK, GEMINI, OPENAI_CHAT, OPENAI_RESPONSES

from stayer.errors import ConfigError
from stayer.pricing import Cost, PriceBook, Rates
from stayer.usage import Usage

AT = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)  # 12:00 UTC: DeepSeek standard hours
M = D(1_000_000)


@pytest.fixture(scope="module")
def book() -> PriceBook:
    return PriceBook()


# --- five provider shapes, end to end -------------------------------------------------


def test_openai_chat_gpt5(book: PriceBook) -> None:
    # gpt-5: input $1.25, cached input $0.125, output $10 per MTok.
    # 2006 prompt, 1920 cached → 86 uncached; 300 completion (192 of them reasoning).
    c = book.cost(Usage.from_openai_chat(OPENAI_CHAT), "gpt-5", "openai", at=AT)
    exp_in = (86 * D("1.25") + 1920 * D("0.125")) / M  # 107.5 + 240 = 347.5
    exp_out = 300 * D(10) / M  # 3000
    assert c.input == exp_in
    assert c.output == exp_out
    assert c.total == D("0.0033475") == exp_in + exp_out
    assert c.provider == "openai" and c.known


def test_openai_responses_flex_cheaper_than_standard(book: PriceBook) -> None:
    u = Usage.from_openai_responses(OPENAI_RESPONSES)  # 10000 in (8000 cached), 1000 out
    std = book.cost(u, "gpt-5", at=AT)
    flex = book.cost(u, "gpt-5", service_tier="flex", at=AT)
    # standard: 2000×1.25 + 8000×0.125 + 1000×10 = 2500 + 1000 + 10000 = 13500
    assert std.total == D(13500) / M
    # flex ($0.625 / $0.0625 / $5): 2000×0.625 + 8000×0.0625 + 1000×5 = 1250 + 500 + 5000
    assert flex.total == D(6750) / M
    assert flex.total < std.total
    assert flex.tier == "flex" and std.tier is None
    # response-side "default" is standard pricing
    assert book.cost(u, "gpt-5", service_tier="default", at=AT).total == std.total


def test_openai_flex_fallback_multiplier_when_no_variant(book: PriceBook) -> None:
    # gpt-4o has no flex variant in genai-prices: the built-in 0.5× applies.
    u = Usage(input_tokens=1000, output_tokens=100)
    # gpt-4o standard: 1000×2.5 + 100×10 = 3500; flex = half
    assert book.cost(u, "gpt-4o", at=AT).total == D(3500) / M
    assert book.cost(u, "gpt-4o", service_tier="flex", at=AT).total == D(1750) / M


def test_anthropic_1h_writes_at_1h_rate(book: PriceBook) -> None:
    # claude-sonnet-4-5 (≤200K): input $3, 5m write $3.75, 1h write $6, read $0.30, output $15.
    u = Usage.from_anthropic(ANTHROPIC)  # 50 uncached, 10000 read, 48 5m + 2000 1h, 503 out
    c = book.cost(u, "claude-sonnet-4-5", "anthropic", at=AT)
    exp_in = (50 * D(3) + 10000 * D("0.3") + 48 * D("3.75") + 2000 * D(6)) / M
    # = 150 + 3000 + 180 + 12000 = 15330
    assert c.input == exp_in == D(15330) / M
    assert c.output == 503 * D(15) / M  # 7545
    assert c.total == D(22875) / M
    # the same writes all with a 5m TTL cost 2000×(6 − 3.75) = 4500 less
    as_5m = dataclasses.replace(u, cache_write_5m_tokens=2048, cache_write_1h_tokens=0)
    assert c.total - book.cost(as_5m, "claude-sonnet-4-5", at=AT).total == 2000 * D("2.25") / M
    assert not c.long_context


def test_anthropic_long_context_tier_prices_whole_request(book: PriceBook) -> None:
    # claude-sonnet-4-5 >200K prompt: input $6, read $0.60, 5m write $7.50, 1h write $12,
    # output $22.50 — for every token of the request, not just those above 200K.
    u = Usage(input_tokens=205_000, cache_read_tokens=200_000, output_tokens=1000)
    c = book.cost(u, "claude-sonnet-4-5", at=AT)
    # 5000×6 + 200000×0.6 + 1000×22.5 = 30000 + 120000 + 22500 = 172500
    assert c.total == D(172_500) / M
    assert c.long_context
    # the cliff is strictly above 200,000 prompt tokens
    at_limit = book.cost(
        Usage(input_tokens=200_000, output_tokens=1000), "claude-sonnet-4-5", at=AT
    )
    assert at_limit.total == (200_000 * D(3) + 1000 * D(15)) / M  # 0.615
    over = book.cost(Usage(input_tokens=200_001, output_tokens=1000), "claude-sonnet-4-5", at=AT)
    assert over.total == (200_001 * D(6) + 1000 * D("22.5")) / M  # 1.222506
    assert book.rates("claude-sonnet-4-5", prompt_tokens=200_001, at=AT) == Rates(
        input=D(6),
        cache_read=D("0.6"),
        cache_write_5m=D("7.5"),
        cache_write_1h=D(12),
        output=D("22.5"),
    )
    assert book.rates("claude-sonnet-4-5", prompt_tokens=1000, at=AT) == Rates(
        input=D(3), cache_read=D("0.3"), cache_write_5m=D("3.75"), cache_write_1h=D(6), output=D(15)
    )


def test_deepseek_hit_miss_and_time_of_day(book: PriceBook) -> None:
    u = Usage.from_deepseek(DEEPSEEK)  # 1024 hit, 476 miss, 400 out (300 reasoning)
    # deepseek-chat standard hours (00:30–16:30 UTC): miss $0.27, hit $0.07, output $1.10
    c = book.cost(u, "deepseek-chat", at=AT)
    assert c.total == (476 * D("0.27") + 1024 * D("0.07") + 400 * D("1.1")) / M  # 640.2
    assert c.provider == "deepseek"
    # off-peak (20:00 UTC): half price — miss $0.135, hit $0.035, output $0.55
    night = book.cost(u, "deepseek-chat", at=AT.replace(hour=20))
    assert night.total == (476 * D("0.135") + 1024 * D("0.035") + 400 * D("0.55")) / M  # 320.1


def test_gemini_cached_thoughts_and_long_context(book: PriceBook) -> None:
    # gemini-2.5-pro ≤200K: input $1.25, cached $0.125, output (incl. thoughts) $10.
    u = Usage.from_gemini(GEMINI)  # 12000 prompt (8000 cached), 350 + 900 thoughts out
    c = book.cost(u, "gemini-2.5-pro", at=AT)
    assert c.total == (4000 * D("1.25") + 8000 * D("0.125") + 1250 * D(10)) / M  # 18500
    # >200K: input $2.50, output $15
    big = book.cost(Usage(input_tokens=250_000, output_tokens=1000), "gemini-2.5-pro", at=AT)
    assert big.total == (250_000 * D("2.5") + 1000 * D(15)) / M  # 0.64
    assert big.long_context and big.provider == "google"


# --- invariants -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("usage", "model"),
    [
        (Usage.from_openai_chat(OPENAI_CHAT), "gpt-5"),
        (Usage.from_gemini(GEMINI), "gemini-2.5-pro"),
        (Usage.from_deepseek(DEEPSEEK), "deepseek-reasoner"),
    ],
)
def test_reasoning_not_billed_twice(book: PriceBook, usage: Usage, model: str) -> None:
    assert usage.reasoning_tokens > 0
    without = dataclasses.replace(usage, reasoning_tokens=0)
    assert book.cost(usage, model, at=AT).total == book.cost(without, model, at=AT).total


def test_rates_price_agrees_with_genai_prices(book: PriceBook) -> None:
    u = Usage.from_anthropic(ANTHROPIC)
    rates = book.rates("claude-sonnet-4-5", prompt_tokens=u.input_tokens, at=AT)
    assert rates is not None
    inp, out = rates.price(u)
    assert inp + out == book.cost(u, "claude-sonnet-4-5", at=AT).total


def test_unknown_model_is_unknown_never_zero(book: PriceBook) -> None:
    c = book.cost(Usage(input_tokens=1000, output_tokens=10), "no-such-model-xyz", at=AT)
    assert c.total is None and c.input is None and c.output is None
    assert not c.known
    assert c.to_json() == "unknown"
    assert book.rates("no-such-model-xyz") is None
    assert not book.knows("no-such-model-xyz")
    assert book.knows("gpt-5") and book.knows("sim:claude-sonnet-4-5")


def test_unknown_tier_is_unknown(book: PriceBook) -> None:
    # Sonnet has no fast mode and Anthropic Priority Tier has no list price.
    u = Usage(input_tokens=1000, output_tokens=10)
    assert book.cost(u, "claude-sonnet-4-5", service_tier="fast", at=AT).total is None
    c = book.cost(u, "claude-opus-4-6", service_tier="priority", at=AT)
    assert c.total is None and c.provider == "anthropic" and c.tier == "priority"


def test_anthropic_fast_mode_opus_4_6_is_6x(book: PriceBook) -> None:
    # claude-opus-4-6: $5 / $25; fast mode $30 / $150 (6×), per Anthropic's fast-mode docs
    u = Usage(input_tokens=1000, output_tokens=100)
    assert book.cost(u, "claude-opus-4-6", at=AT).total == (1000 * D(5) + 100 * D(25)) / M
    fast = book.cost(u, "claude-opus-4-6", service_tier="fast", at=AT)
    assert fast.total == (1000 * D(30) + 100 * D(150)) / M
    # Opus 4.8's fast variant comes from genai-prices: $10 / $50
    assert (
        book.cost(u, "claude-opus-4-8", service_tier="fast", at=AT).total
        == (1000 * D(10) + 100 * D(50)) / M
    )


def test_sim_and_provider_prefixes(book: PriceBook) -> None:
    u = Usage(input_tokens=1000, output_tokens=100)
    plain = book.cost(u, "gpt-5", at=AT).total
    assert plain == (1000 * D("1.25") + 100 * D(10)) / M
    assert book.cost(u, "sim:gpt-5", at=AT).total == plain
    assert book.cost(u, "openai:gpt-5", at=AT).total == plain


def test_cost_json_is_plain_decimal_string() -> None:
    assert Cost(D("5E-8"), D("5E-8"), D(0), "m").to_json() == "0.00000005"
    assert Cost(D("17.70"), None, None, "m").to_json() == "17.7"
    assert Cost(D("0.000"), D(0), D(0), "m").to_json() == "0"
    assert Cost.unknown("m").to_dict()["total"] == "unknown"


# --- override files -------------------------------------------------------------------

OVERRIDE = """
[models."my-finetune"]
provider = "openai"
input = "2.00"
cache_read = "0.20"
cache_write_5m = "2.50"
cache_write_1h = "4.00"
output = "8.00"

[tiers.anthropic.fast]
multiplier = "6"
"""


def test_override_model_and_tier(tmp_path: Path) -> None:
    p = tmp_path / "prices.toml"
    p.write_text(OVERRIDE)
    book = PriceBook(overrides=p)
    u = Usage(
        input_tokens=10_000,
        cache_read_tokens=6000,
        cache_write_5m_tokens=1000,
        cache_write_1h_tokens=1000,
        output_tokens=500,
    )
    c = book.cost(u, "my-finetune", at=AT)
    # 2000×2 + 6000×0.2 + 1000×2.5 + 1000×4 + 500×8 = 4000 + 1200 + 2500 + 4000 + 4000
    assert c.total == D(15_700) / M
    assert c.provider == "openai" and book.knows("my-finetune")
    # built-in OpenAI flex fallback (0.5×) applies to the override model's provider
    assert book.cost(u, "my-finetune", service_tier="flex", at=AT).total == D(7850) / M
    # user tier rule: 6× on every Anthropic model, sonnet included
    small = Usage(input_tokens=1000, output_tokens=100)
    assert book.cost(small, "claude-sonnet-4-5", service_tier="fast", at=AT).total == (
        6 * (1000 * D(3) + 100 * D(15)) / M
    )
    # without the override file the model is unknown
    assert PriceBook().cost(u, "my-finetune").total is None


def test_override_defaults_for_missing_cache_prices(tmp_path: Path) -> None:
    p = tmp_path / "p.toml"
    p.write_text('[models.local]\ninput = 1\noutput = "3"\n')
    r = PriceBook(p).rates("local")
    assert r == Rates(
        input=D(1), cache_read=D(1), cache_write_5m=D(1), cache_write_1h=D(1), output=D(3)
    )


@pytest.mark.parametrize(
    ("text", "field"),
    [
        ("[models.x\ninput = 1", "invalid TOML"),
        ('[models.x]\ninput = "1"\noutput = "2"\ninptu = "3"\n', "models.x.inptu"),
        ('[models.x]\ninput = "1"\n', "models.x.output"),
        ('[models.x]\ninput = "-1"\noutput = "2"\n', "models.x.input"),
        ('[models.x]\ninput = "abc"\noutput = "2"\n', "models.x.input"),
        ("[tiers.openai.flex]\nmultipler = 0.5\n", "tiers.openai.flex.multipler"),
        ("[tiers.openai.flex]\n", "tiers.openai.flex.multiplier"),
        ("[pricing]\nx = 1\n", "pricing"),
    ],
)
def test_malformed_override_names_file_and_field(tmp_path: Path, text: str, field: str) -> None:
    p = tmp_path / "bad-prices.toml"
    p.write_text(text)
    with pytest.raises(ConfigError) as e:
        PriceBook(overrides=p)
    msg = str(e.value)
    assert str(p) in msg and field in msg
    assert "\n" not in msg


def test_missing_override_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="nope.toml"):
        PriceBook(overrides=tmp_path / "nope.toml")


def test_load_from_env_and_cwd(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    p = tmp_path / "env.toml"
    p.write_text(OVERRIDE)
    monkeypatch.setenv("STAYER_PRICES", str(p))
    assert PriceBook.load().knows("my-finetune")
    monkeypatch.delenv("STAYER_PRICES")
    monkeypatch.chdir(tmp_path)
    assert not PriceBook.load().knows("my-finetune")
    (tmp_path / "stayer-prices.toml").write_text(OVERRIDE)
    assert PriceBook.load().knows("my-finetune")


def test_rate_steps_agree_with_rates_at_every_step_and_time(book: PriceBook) -> None:
    """The compiled step function an audit prices with gives what ``rates`` gives, for
    every priced model of the main providers, every tier spelling and prompt sizes on both
    sides of each step; models whose prices depend on the time say so (None)."""
    from genai_prices.data_snapshot import get_snapshot

    times = [datetime(2025, 3, 1, 3, tzinfo=UTC), datetime(2026, 11, 20, 17, 45, tzinfo=UTC)]
    timeless = timed = 0
    for provider in get_snapshot().providers:
        if provider.id not in ("anthropic", "openai", "google", "deepseek"):
            continue
        for model in provider.models:
            for tier in (None, "standard", "fast", "batch", "priority", "flex"):
                steps = book.rate_steps(model.id, provider.id, tier)
                if steps is None:
                    timed += 1
                    continue
                timeless += 1
                assert [n for n, _ in steps] == sorted({n for n, _ in steps}) and steps[0][0] == 0
                for i, (start, rates) in enumerate(steps):
                    end = steps[i + 1][0] - 1 if i + 1 < len(steps) else start + 10**7
                    for prompt in {start, end}:
                        for at in times:
                            assert (
                                book.rates(model.id, provider.id, tier, prompt, at=at) == rates
                            ), (model.id, tier, prompt)
    assert timeless > 50 and timed > 0  # both kinds exist in the data, so both paths ran

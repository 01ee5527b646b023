"""The budget property: a cost cap is never overshot.

Generated cases run the real agent loop against the provider simulator (Anthropic, OpenAI,
DeepSeek and Gemini models) and against the real SDK adapters talking HTTP to a fake
provider that answers with the simulator's replies in each API's wire shape; with every
service tier, routes (planning model, cascade, tier policy, summariser), failover, and
sub-agents with carved budgets; with random caps, steps and reply sizes (often beyond the
call's ``max_tokens``, so replies are cut off), latency 0 and no sandbox (the one tool is
a no-op that answers with an observation of a chosen size).

Every case checks, exactly (``Decimal``):

* what the provider billed — every reply priced at the tier it was served, by a meter
  outside the loop — equals what the budget recorded and what the run reports, and is
  within the cap;
* no call cost more than its reservation (no ``reservation_overrun``), and the
  ``max_tokens`` each reservation was made for is the one sent on the wire;
* a tier or route without price data is refused up front (``require_prices``) and, run
  anyway, never gets an unpriced call sent.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import subprocess
import sys
from dataclasses import dataclass, field, replace
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from http_fake import FakeServer, Recorded, Reply
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from stayer.agent import Agent, AgentSettings, Limits, RunResult
from stayer.context.policies import make_policy
from stayer.context.summarizer import ModelSummarizer
from stayer.delegation import ChildAgents, ChildSettings
from stayer.errors import ConfigError
from stayer.guard.breakers import GuardConfig
from stayer.guard.budget import Budget
from stayer.models.anthropic import AnthropicModel
from stayer.models.base import (
    Message,
    Model,
    ModelError,
    ModelRequest,
    ModelResponse,
    ToolCall,
    ToolSpec,
)
from stayer.models.caching import provider_of
from stayer.models.openai import OpenAIChatModel, OpenAIResponsesModel
from stayer.models.retry import RetryPolicy
from stayer.models.sim import SimModel
from stayer.models.sim_policies import filler
from stayer.pricing import PriceBook
from stayer.routing.setup import RoutingSetup, require_prices
from stayer.settings import parse_config
from stayer.tokens import MessageCounter, TiktokenCounter
from stayer.tools.base import ToolContext, ToolResult
from stayer.tools.submit import SubmitTool

# About 100 s on a loaded two-core machine (700 simulator and 300 HTTP cases), so the
# property runs with the slow suites (.ci/run); the one-off checks below are quick.
pytestmark = pytest.mark.filterwarnings("ignore:The model .* is deprecated:DeprecationWarning")
slow = pytest.mark.slow

D = Decimal
ROOT = Path(__file__).resolve().parent.parent
PRICES = PriceBook()
TOKENIZER = TiktokenCounter()
PRICED = [
    "claude-sonnet-4-5",
    "claude-haiku-4-5",
    "claude-opus-4-6",
    "gpt-5",
    "gpt-5-mini",
    "deepseek-chat",
    "gemini-2.5-flash",
]
UNPRICED = "claude-unknown-9"  # a model genai-prices does not know
# Standard spellings, tiers some providers price (flex, priority, fast, batch) and tiers
# nobody prices here (scale, turbo).
TIERS = [
    None,
    "auto",
    "default",
    "standard_only",
    "flex",
    "priority",
    "fast",
    "batch",
    "scale",
    "turbo",
]
CASE = settings(
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


# --- the workload ---------------------------------------------------------------------


@dataclass(frozen=True)
class Workload:
    """What the simulated model says at each step, drawn from ``seed`` and the step: text
    of up to ``max_out`` tokens (often more than the call's max_tokens, so it is cut off),
    then one call — the no-op ``observe`` tool (an observation of up to ``max_obs``
    tokens), ``subagent`` (with ``delegate`` probability, asking for up to
    ``max_ask_usd``), or ``submit`` after ``steps`` steps."""

    seed: int
    steps: int
    max_out: int
    max_obs: int
    delegate: float = 0.0
    max_ask_usd: Decimal = D(0)

    def next_message(self, request: ModelRequest) -> Message:
        step = 1 + sum(1 for m in request.messages if m.role == "assistant")
        rng = random.Random(self.seed * 1_000_003 + step)
        text = filler(rng.randint(0, self.max_out), rng)
        if step > self.steps:
            call = ToolCall(f"call_{step}", "submit", json.dumps({"summary": "done"}))
        elif rng.random() < self.delegate:
            ask = (
                float(self.max_ask_usd * D(rng.randint(0, 100)) / 100)
                if rng.random() < 0.7
                else None
            )
            args = {"task": "help", "max_steps": rng.randint(1, 4)} | (
                {"budget_usd": ask} if ask is not None else {}
            )
            call = ToolCall(f"call_{step}", "subagent", json.dumps(args))
        else:
            call = ToolCall(
                f"call_{step}", "observe", json.dumps({"tokens": rng.randint(0, self.max_obs)})
            )
        return Message("assistant", text, (call,))


class Observe:
    """The no-op tool: an observation of the asked size, no sandbox."""

    spec = ToolSpec(
        "observe",
        "Return an observation of about `tokens` tokens.",
        {"type": "object", "properties": {"tokens": {"type": "integer"}}, "required": ["tokens"]},
    )

    async def __call__(self, args: dict[str, Any], ctx: ToolContext) -> ToolResult:
        return ToolResult(filler(args["tokens"], random.Random(args["tokens"])))


# --- the provider's side: what it bills -------------------------------------------------


@dataclass
class Billing:
    """Every reply the provider sent, priced at the tier it was served (independently of
    the loop's own accounting)."""

    total: Decimal = D(0)
    calls: int = 0
    cut_offs: int = 0
    unpriced: list[str] = field(default_factory=list)

    def bill(self, model_id: str, provider: str, response: ModelResponse) -> None:
        cost = PRICES.cost(response.usage, model_id, provider, response.service_tier)
        self.calls += 1
        self.cut_offs += response.cut_off
        if cost.total is None:
            self.unpriced.append(f"{model_id} at {response.service_tier}")
        else:
            self.total += cost.total


@dataclass
class Metered:
    """A simulated provider that bills every reply; the calls numbered in ``failures`` fail
    as an outage does once the adapter's retries are spent."""

    sim: SimModel
    billing: Billing
    spec: str
    failures: frozenset[int] = frozenset()
    calls: int = 0

    @property
    def provider(self) -> str:
        return self.sim.provider

    @property
    def model_id(self) -> str:
        return self.sim.model_id

    async def complete(self, request: ModelRequest) -> ModelResponse:
        self.calls += 1
        if self.calls in self.failures:
            raise ModelError(f"{self.spec}: 503 after retries")
        response = await self.sim.complete(request)
        self.billing.bill(self.model_id, self.provider, response)
        return response


# --- the run ----------------------------------------------------------------------------


def overruns(result: RunResult) -> list[dict[str, Any]]:
    trips = [t for e in result.ledger for t in e.breakers] + result.breakers
    return [t for t in trips if t["reason"] == "reservation_overrun"]


async def run_agent(
    main: Model,
    counter: MessageCounter,
    cap: Decimal,
    tier: str | None,
    steps: int,
    max_output_tokens: int,
    *,
    setup: RoutingSetup | None = None,
    subagent: Model | None = None,
    summariser: Model | None = None,
    policy: str = "none",
) -> tuple[RunResult, Budget]:
    budget = Budget(cap)
    router = setup.router(main, lambda m: m, PRICES, tier) if setup else None
    limits = Limits(
        steps + 3, cap, max_output_tokens, tier, guard=setup.guard if setup else GuardConfig()
    )
    summariser = summariser or (router.role("summariser") if router else main)
    agent = Agent(
        main,
        [Observe(), SubmitTool()],
        ToolContext(None, ""),
        AgentSettings(
            PRICES,
            counter,
            limits,
            policy=make_policy(policy),
            summarizer=ModelSummarizer(summariser, PRICES),
            router=router,
            budget=budget,
        ),
    )
    child_model = router.role("subagent") if router and setup and setup.subagents else subagent
    if child_model is not None:
        child_settings = (
            ChildSettings(**setup.subagents.model_dump())
            if setup and setup.subagents
            else ChildSettings(max_steps=4)
        )
        agent.add_tool(
            ChildAgents(
                agent, child_model, lambda: [Observe(), SubmitTool()], child_settings
            ).tool()
        )
    result = await agent.run("Do the task.", "run-1")
    return result, budget


def check(result: RunResult, budget: Budget, billing: Billing, cap: Decimal) -> None:
    # What the case exercised (pytest --hypothesis-show-statistics).
    event(f"ended {result.status}/{result.stop_reason}")
    event("a reply was cut off at max_tokens" if billing.cut_offs else "no cut-off")
    event("refused: nothing sent" if not billing.calls else "calls sent")
    event("sub-agents ran" if any(e.agent != "main" for e in result.ledger) else "no sub-agent")
    event("models switched" if len({e.model for e in result.ledger}) > 1 else "one model")
    assert not billing.unpriced, f"unpriced calls were sent under a cap: {billing.unpriced}"
    assert budget.reserved == 0
    assert budget.spent <= cap, f"overshoot: {budget.spent} > {cap}"
    assert billing.total == budget.spent == result.cost_usd, (
        billing.total,
        budget.spent,
        result.cost_usd,
    )
    assert not overruns(result), overruns(result)
    assert result.status in ("submitted", "budget_exhausted", "error"), result.status


def unpriced(models: list[str], tier: str | None) -> bool:
    """Has any of ``models`` no price at the standard tier or at ``tier``?"""
    return any(PRICES.rates(m, provider_of(m), t) is None for m in models for t in (None, tier))


# --- the simulator, with routes, failover and sub-agents -----------------------------------


def caps() -> st.SearchStrategy[Decimal]:
    """$0.00001 to $9.90, spread evenly over the orders of magnitude."""
    return st.builds(lambda m, e: D(m).scaleb(-e), st.integers(1, 99), st.integers(1, 5))


def tiers(model_id: str) -> st.SearchStrategy[str | None]:
    """Mostly a tier the model is priced at; any tier (priced or not) a third of the time."""
    priced = [t for t in TIERS if not unpriced([model_id], t)]
    return st.sampled_from(priced) | st.sampled_from(priced) | st.sampled_from(TIERS)


@st.composite
def sim_cases(draw: st.DrawFn) -> dict[str, Any]:
    main = draw(st.sampled_from(PRICED))
    anyone = (
        st.sampled_from(PRICED) | st.sampled_from(PRICED) | st.sampled_from([*PRICED, UNPRICED])
    )
    failover = draw(st.none() | st.tuples(st.integers(1, 4), anyone.filter(lambda m: m != main)))
    return {
        "cap": draw(caps()),
        "tier": draw(tiers(main)),
        "main": main,
        "steps": draw(st.integers(1, 8)),
        "max_out": draw(st.sampled_from([40, 700, 3_000, 12_000])),
        "max_obs": draw(st.sampled_from([0, 600, 5_000])),
        "max_output_tokens": draw(st.sampled_from([300, 1_024, 8_192])),
        "seed": draw(st.integers(0, 2**32 - 1)),
        "planning": draw(st.none() | anyone),
        "cascade": draw(st.none() | st.lists(anyone, min_size=2, max_size=3, unique=True)),
        "failover": failover,
        "latency_target": draw(st.none() | st.sampled_from([1.0, 8.0, 60.0])),
        "summariser": draw(st.none() | anyone),
        "policy": draw(st.sampled_from(["none", "auto", "summarize:2500", "mask:2"])),
        "subagent": draw(st.none() | anyone),
    }


def stayer_toml(c: dict[str, Any]) -> dict[str, Any]:
    """The case's routes as a stayer.toml document."""
    doc: dict[str, Any] = {"models": {}}
    if c["planning"]:
        doc["models"] |= {"planning": f"sim:{c['planning']}", "planning_steps": 2}
    if c["summariser"]:
        doc["models"]["summariser"] = f"sim:{c['summariser']}"
    if c["subagent"]:
        doc["models"]["subagent"] = f"sim:{c['subagent']}"
        doc["subagents"] = {"max_steps": 4, "budget_fraction": 0.5}
    if c["cascade"]:
        doc["cascade"] = {
            "models": [f"sim:{m}" for m in c["cascade"]],
            "escalate_after_errors": 1,
            "relax_after": 2,
        }
    if c["failover"]:
        doc["failover"] = {f"sim:{c['main']}": [f"sim:{c['failover'][1]}"]}
    if c["latency_target"]:
        doc["tiers"] = {"latency_target_s": c["latency_target"]}
    return doc


async def sim_case(c: dict[str, Any]) -> None:
    counter = MessageCounter(TOKENIZER)
    billing = Billing()
    work = Workload(
        c["seed"], c["steps"], c["max_out"], c["max_obs"], 0.5 if c["subagent"] else 0.0, c["cap"]
    )
    child_work = replace(work, delegate=0.0, steps=2)

    def model(
        model_id: str, workload: Workload = work, failures: frozenset[int] = frozenset()
    ) -> Metered:
        return Metered(SimModel(model_id, workload, counter), billing, f"sim:{model_id}", failures)

    config = parse_config(stayer_toml(c), "stayer.toml")
    main = model(
        c["main"], failures=frozenset({c["failover"][0]}) if c["failover"] else frozenset()
    )
    named = {
        spec: model(
            spec.removeprefix("sim:"), child_work if spec == f"sim:{c['subagent']}" else work
        )
        for spec in config.model_specs()
        if spec != main.spec
    }
    setup = RoutingSetup("stayer.toml", config, named)  # type: ignore[arg-type]

    everyone = [c["main"], *(spec.removeprefix("sim:") for spec in named)]
    if unpriced(everyone, c["tier"]):
        with pytest.raises(ConfigError, match="no price data for .* cannot be enforced"):
            require_prices(PRICES, main, c["tier"], setup)
    else:
        require_prices(PRICES, main, c["tier"], setup)
    # Run anyway: the guard must still never send a call it cannot price.
    result, budget = await run_agent(
        main,
        counter,
        c["cap"],
        c["tier"],
        c["steps"],
        c["max_output_tokens"],
        setup=setup,
        policy=c["policy"],
    )
    check(result, budget, billing, c["cap"])
    if unpriced([c["main"]], c["tier"]) and not (
        c["planning"] or c["cascade"] or c["latency_target"]
    ):
        assert billing.calls == 0  # the first call is the main model's: refused, nothing sent


@slow
@settings(CASE, max_examples=700)
@given(sim_cases())
def test_the_simulator_never_overshoots_a_cap_whatever_the_tier_route_or_sub_agent(c):
    asyncio.run(sim_case(c))


# --- the real SDK adapters over HTTP, the simulator as the provider -----------------------------

NO_RETRY = RetryPolicy(max_attempts=1)
APIS = {  # which adapter speaks to which simulated model
    "anthropic": ["claude-sonnet-4-5", "claude-haiku-4-5", "claude-opus-4-6"],
    "responses": ["gpt-5", "gpt-5-mini"],
    "chat": ["gpt-5-mini", "deepseek-chat", "gemini-2.5-flash"],
}


def _arguments(text: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except ValueError:
        return {}  # a call cut off mid-arguments: Anthropic returns what it could parse
    return value if isinstance(value, dict) else {}


def wire_reply(api: str, r: ModelResponse, model: str) -> dict[str, Any]:
    """The simulator's reply as the provider's API sends it."""
    m = r.message
    if api == "anthropic":
        blocks = [{"type": "text", "text": m.content}] if m.content else []
        blocks += [
            {"type": "tool_use", "id": c.id, "name": c.name, "input": _arguments(c.arguments)}
            for c in m.tool_calls
        ]
        usage = r.raw_usage | (
            {"speed": "fast"} if r.service_tier == "fast" else {"service_tier": r.service_tier}
        )
        return {
            "id": "msg_sim",
            "type": "message",
            "role": "assistant",
            "model": model,
            "content": blocks,
            "stop_reason": r.stop_reason,
            "stop_sequence": None,
            "usage": usage,
        }
    if api == "responses":
        output: list[dict[str, Any]] = []
        if m.content:
            output.append(
                {
                    "type": "message",
                    "id": "msg_1",
                    "status": "completed",
                    "role": "assistant",
                    "content": [{"type": "output_text", "text": m.content, "annotations": []}],
                }
            )
        output += [
            {
                "type": "function_call",
                "id": f"fc_{c.id}",
                "call_id": c.id,
                "name": c.name,
                "arguments": c.arguments,
                "status": "completed",
            }
            for c in m.tool_calls
        ]
        cut = r.cut_off
        return {
            "id": "resp_sim",
            "object": "response",
            "created_at": 0,
            "model": model,
            "output": output,
            "status": "incomplete" if cut else "completed",
            "error": None,
            "incomplete_details": {"reason": r.stop_reason} if cut else None,
            "parallel_tool_calls": True,
            "tool_choice": "auto",
            "tools": [],
            "service_tier": r.service_tier,
            "usage": r.raw_usage,
        }
    u = r.usage
    usage = (
        r.raw_usage
        if "prompt_cache_hit_tokens" in r.raw_usage
        else {
            "prompt_tokens": u.input_tokens,
            "completion_tokens": u.output_tokens,
            "total_tokens": u.input_tokens + u.output_tokens,
            "prompt_tokens_details": {"cached_tokens": u.cache_read_tokens},
        }
    )
    message: dict[str, Any] = {"role": "assistant", "content": m.content or None}
    if m.tool_calls:
        message["tool_calls"] = [
            {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
            for c in m.tool_calls
        ]
    finish = "length" if r.cut_off else ("tool_calls" if m.tool_calls else "stop")
    return {
        "id": "chatcmpl-sim",
        "object": "chat.completion",
        "created": 0,
        "model": model,
        "choices": [{"index": 0, "message": message, "logprobs": None, "finish_reason": finish}],
        "usage": usage,
        "service_tier": r.service_tier,
    }


class OverHttp:
    """A real SDK adapter (``adapter``) whose provider is ``sim`` behind an HTTP fake: the
    server answers the request *as sent* — its max_tokens and tier — with the simulator's
    reply to it, in the API's wire shape, and bills it."""

    def __init__(self, api: str, sim: SimModel, billing: Billing) -> None:
        self.api, self.sim, self.billing = api, sim, billing
        self.server = FakeServer(self.respond)
        self.pending: ModelRequest | None = None
        self.errors: list[str] = []

    def connect(self) -> None:
        url, model_id = self.server.url, self.sim.model_id
        if self.api == "anthropic":
            self.adapter: Any = AnthropicModel(model_id, api_key="k", base_url=url, retry=NO_RETRY)
        elif self.api == "responses":
            self.adapter = OpenAIResponsesModel(model_id, api_key="k", base_url=url, retry=NO_RETRY)
        else:
            provider = self.sim.provider
            self.adapter = OpenAIChatModel(
                model_id,
                api_key="k",
                base_url=url,
                provider=provider,
                openai_params=provider == "openai",
                retry=NO_RETRY,
            )
        self.spec, self.provider, self.model_id = self.adapter.spec, self.adapter.provider, model_id

    async def complete(self, request: ModelRequest) -> ModelResponse:
        self.pending = request
        return await self.adapter.complete(request)

    def respond(self, rec: Recorded) -> Reply:
        try:
            body, request = rec.json, self.pending
            assert request is not None
            sent = (
                body.get("max_tokens")
                or body.get("max_output_tokens")
                or body.get("max_completion_tokens")
            )
            assert sent == request.max_tokens, (
                f"max_tokens sent {sent}, reserved for {request.max_tokens}"
            )
            tier = "fast" if body.get("speed") == "fast" else body.get("service_tier")
            reply = self.sim.respond(replace(request, max_tokens=sent, service_tier=tier))
            self.billing.bill(self.model_id, self.provider, reply)
            return Reply(200, wire_reply(self.api, reply, self.model_id))
        except Exception as e:  # noqa: BLE001 - reported by the test, not lost in the server thread
            self.errors.append(f"{type(e).__name__}: {e}")
            return Reply(400, {"error": {"message": str(e)}})


@st.composite
def http_cases(draw: st.DrawFn) -> dict[str, Any]:
    api = draw(st.sampled_from(sorted(APIS)))
    model = draw(st.sampled_from(APIS[api]))
    return {
        "api": api,
        "model": model,
        "cap": draw(caps()),
        "tier": draw(tiers(model)),
        "steps": draw(st.integers(1, 6)),
        "max_out": draw(st.sampled_from([40, 700, 3_000, 12_000])),
        "max_obs": draw(st.sampled_from([0, 600, 5_000])),
        "max_output_tokens": draw(st.sampled_from([300, 1_024, 8_192])),
        "seed": draw(st.integers(0, 2**32 - 1)),
        "delegate": draw(st.sampled_from([0.0, 0.3])),
    }


async def http_case(c: dict[str, Any]) -> None:
    counter = MessageCounter(TOKENIZER)
    billing = Billing()
    work = Workload(c["seed"], c["steps"], c["max_out"], c["max_obs"], c["delegate"], c["cap"])
    provider = OverHttp(c["api"], SimModel(c["model"], work, counter), billing)
    with provider.server:
        provider.connect()
        try:
            if unpriced([c["model"]], c["tier"]):
                with pytest.raises(ConfigError, match="no price data for .* cannot be enforced"):
                    require_prices(PRICES, provider, c["tier"], None)
            result, budget = await run_agent(
                provider,
                counter,
                c["cap"],
                c["tier"],
                c["steps"],
                c["max_output_tokens"],
                subagent=provider if c["delegate"] else None,
            )
        finally:
            await provider.adapter.aclose()
    assert not provider.errors, provider.errors
    check(result, budget, billing, c["cap"])
    if unpriced([c["model"]], c["tier"]):
        assert billing.calls == 0 and not provider.server.requests  # refused before any call


@slow
@settings(CASE, max_examples=300)
@given(http_cases())
def test_the_real_adapters_over_http_never_overshoot_a_cap(c):
    asyncio.run(http_case(c))


# --- one-off checks: the edges the property relies on -------------------------------------


@pytest.mark.parametrize(
    ("model", "tier", "priced"),
    [
        ("claude-sonnet-4-5", "priority", False),
        ("claude-sonnet-4-5", "flex", False),
        ("claude-sonnet-4-5", "batch", True),
        ("claude-opus-4-6", "fast", True),
        ("claude-sonnet-4-5", "fast", False),
        ("gpt-5", "flex", True),
        ("gpt-5", "scale", False),
        ("deepseek-chat", "flex", False),
        ("gemini-2.5-flash", "priority", False),
        ("gemini-2.5-flash", "auto", True),
        (UNPRICED, None, False),
    ],
)
def test_price_data_is_known_per_model_and_tier(model, tier, priced):
    assert PRICES.knows(model, provider_of(model), tier) is priced
    assert (PRICES.rates(model, provider_of(model), tier) is not None) is priced


class CutThenSubmit:
    """First a short text and a tool call whose arguments run far past max_tokens (cut off
    mid-arguments), then ``submit``."""

    def next_message(self, request: ModelRequest) -> Message:
        if any(m.role == "assistant" for m in request.messages):
            return Message("assistant", "", (ToolCall("call_2", "submit", '{"summary": "done"}'),))
        args = json.dumps({"note": filler(2_000, random.Random(1))})
        return Message("assistant", "Writing the note.", (ToolCall("call_1", "take_note", args),))


class TakeNote:
    """A tool with no required argument, so that a cut call Anthropic returns as ``{}``
    would pass validation; it records every run."""

    spec = ToolSpec(
        "take_note", "Keep a note.", {"type": "object", "properties": {"note": {"type": "string"}}}
    )

    def __init__(self) -> None:
        self.ran: list[dict[str, Any]] = []

    async def __call__(self, args: dict[str, Any], ctx: ToolContext) -> ToolResult:
        self.ran.append(args)
        return ToolResult("noted")


@pytest.mark.parametrize(
    ("model_id", "cut", "whole", "output_field"),
    [
        ("claude-sonnet-4-5", "max_tokens", "tool_use", "output_tokens"),
        ("gpt-5", "max_output_tokens", "completed", "output_tokens"),
        ("deepseek-chat", "length", "tool_calls", "completion_tokens"),
        ("gemini-2.5-flash", "MAX_TOKENS", "STOP", "candidatesTokenCount"),
    ],
)
def test_the_simulator_cuts_a_reply_at_max_tokens_as_each_provider_does(
    model_id, cut, whole, output_field
):
    counter = MessageCounter(TOKENIZER)
    sim = SimModel(model_id, CutThenSubmit(), counter)
    request = ModelRequest(
        "Be brief.", [TakeNote.spec], [Message("user", "Take a note.")], max_tokens=120
    )
    r = asyncio.run(sim.complete(request))
    assert r.cut_off and r.stop_reason == cut
    assert (
        r.usage.output_tokens == 120 and r.raw_usage[output_field] == 120
    )  # billed: exactly max_tokens
    assert counter.message(r.message) <= 120 and r.message.content == "Writing the note."
    [call] = r.message.tool_calls  # the call the limit fell in: cut mid-arguments
    assert call.id == "call_1" and call.name == "take_note" and not call.arguments.endswith('"}')
    request.max_tokens = 8_000
    whole_reply = asyncio.run(SimModel(model_id, CutThenSubmit(), counter).complete(request))
    assert not whole_reply.cut_off and whole_reply.stop_reason == whole
    assert whole_reply.usage.output_tokens == counter.message(whole_reply.message) < 8_000


@pytest.mark.parametrize("api", sorted(APIS))
def test_a_reply_cut_off_at_max_tokens_is_billed_max_tokens_and_its_call_is_not_run(api):
    """Through each real adapter: the provider's own cut-off signal (Anthropic
    ``stop_reason: max_tokens``, Responses ``status: incomplete`` with
    ``max_output_tokens``, Chat ``finish_reason: length``) reaches the loop, the output
    is billed at exactly max_tokens, and the cut tool call is answered, never run."""
    counter = MessageCounter(TOKENIZER)
    provider = OverHttp(api, SimModel(APIS[api][0], CutThenSubmit(), counter), Billing())
    tool = TakeNote()

    async def go() -> RunResult:
        with provider.server:
            provider.connect()
            try:
                agent = Agent(
                    provider,
                    [tool, SubmitTool()],
                    ToolContext(None, ""),
                    AgentSettings(
                        PRICES,
                        counter,
                        Limits(max_steps=10, max_output_tokens=300),
                        policy=make_policy("none"),
                    ),
                )
                return await agent.run("Do the task.", "run-1")
            finally:
                await provider.adapter.aclose()

    result = asyncio.run(go())
    assert not provider.errors, provider.errors
    first = result.ledger[0]
    assert first.usage.output_tokens == 300 and first.tool_calls == [
        {"id": "call_1", "name": "take_note", "is_error": True, "exit_code": None}
    ]
    answer = next(m for m in provider.pending.messages if m.role == "tool")  # type: ignore[union-attr]
    assert answer.is_error and answer.content.startswith("not run: your reply was cut off")
    assert tool.ran == [] and result.status == "submitted"


@pytest.mark.parametrize(
    ("model", "tier"),
    [
        ("claude-sonnet-4-5", "priority"),
        ("claude-sonnet-4-5", "flex"),
        ("claude-haiku-4-5", "fast"),
        ("gpt-5", "scale"),
        ("deepseek-chat", "flex"),
        ("gemini-2.5-flash", "priority"),
    ],
)
def test_a_cap_on_an_unpriced_tier_is_refused_before_anything_runs(tmp_path, model, tier):
    home = tmp_path / "home"
    r = stayer(
        "run",
        str(ROOT / "examples" / "hello-file"),
        "--model",
        f"sim:{model}",
        "--service-tier",
        tier,
        "--max-cost",
        "0.01",
        "--json",
        home=home,
    )
    assert r.returncode == 2 and r.stdout == "", r.stderr
    line = r.stderr.strip()
    assert len(line.splitlines()) == 1
    assert f"no price data for sim:{model} at service tier '{tier}'" in line
    assert f"tiers.{provider_of(model)}.{tier}" in line and not home.exists()


def test_a_cap_with_an_unpriced_route_is_refused_naming_the_file_and_the_route(tmp_path):
    config = tmp_path / "stayer.toml"
    config.write_text(
        '[failover]\n"sim:gpt-5" = ["sim:claude-sonnet-4-5"]\n[models]\nsubagent = "sim:gpt-5-mini"\n'
    )
    home = tmp_path / "home"
    r = stayer(
        "run",
        str(ROOT / "examples" / "hello-file"),
        "--model",
        "sim:gpt-5",
        "--service-tier",
        "flex",
        "--max-cost",
        "0.01",
        "--config",
        str(config),
        "--json",
        home=home,
    )
    assert r.returncode == 2 and r.stdout == "", r.stderr
    assert r.stderr.strip().startswith(
        f"error: {config}: no price data for sim:claude-sonnet-4-5 "
        f"(failover.\"sim:gpt-5\") at service tier 'flex'"
    )
    assert (
        "gpt-5-mini" not in r.stderr and not home.exists()
    )  # gpt-5 and gpt-5-mini have flex prices


def stayer(*args: str, home: Path) -> subprocess.CompletedProcess:
    env = {
        k: v for k, v in os.environ.items() if not k.endswith("_API_KEY") and k != "STAYER_PRICES"
    }
    return subprocess.run(
        [sys.executable, "-m", "stayer.cli", *args],
        capture_output=True,
        text=True,
        env=env | {"STAYER_HOME": str(home)},
        cwd=home.parent,
        timeout=120,
    )


def test_the_loop_never_sends_a_call_it_cannot_price_under_a_cap():
    """Whatever got past the up-front check (a route, a tier chosen at run time), the guard
    refuses a call without price data when the budget has a cap: nothing is sent."""
    counter = MessageCounter(TOKENIZER)
    billing = Billing()
    model = Metered(SimModel("gpt-5", Workload(1, 3, 50, 50), counter), billing, "sim:gpt-5")
    result, budget = asyncio.run(run_agent(model, counter, D("1"), "scale", 3, 1_024))
    assert billing.calls == 0 and budget.spent == 0 and result.steps == 0
    assert result.status == "budget_exhausted" and result.stop_reason == "max_cost"
    assert (
        "no price data for the next call's model and service tier" in result.breakers[0]["detail"]
    )
    # Without a cap the same calls are made, their cost reported as unknown (never as 0).
    result = asyncio.run(
        Agent(
            model,
            [Observe(), SubmitTool()],
            ToolContext(None, ""),
            AgentSettings(PRICES, counter, Limits(5, None, 1_024, "scale")),
        ).run("Do the task.", "run-2")
    )
    assert billing.calls > 0 and billing.unpriced and result.cost_usd is None

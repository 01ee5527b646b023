"""Routing: stayer.toml, roles and phases, the cascade, cache-aware switching, tiers,
failover — and the bad input around them, through the command line."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from decimal import Decimal
from pathlib import Path

import pytest

from stayer.agent import Agent, AgentSettings, Hooks, Limits
from stayer.errors import ConfigError
from stayer.events import event_record
from stayer.guard.breakers import GuardConfig, StepRecord, ToolCallRecord
from stayer.models.scripted import COUNTER, ScriptedModel, bash, call, failing
from stayer.pricing import PriceBook
from stayer.routing.router import Router, RouteView
from stayer.routing.tiers import TierPolicy
from stayer.sandbox.local import LocalSandbox
from stayer.settings import load_config, parse_config
from stayer.tools import default_tools
from stayer.tools.base import ToolContext

ROOT = Path(__file__).resolve().parent.parent
PRICES = PriceBook()
SONNET = ScriptedModel("claude-sonnet-4-5")
HAIKU = ScriptedModel("claude-haiku-4-5")


def view(
    step: int, tokens: int, now: float, messages: int | None = None, max_steps: int = 200
) -> RouteView:
    return RouteView(
        step, max_steps, tokens, 3_000, 0, now, messages if messages is not None else 2 * step
    )


# --- stayer.toml --------------------------------------------------------------------------


def test_unknown_key_names_the_file_the_key_and_what_is_allowed(tmp_path):
    f = tmp_path / "stayer.toml"
    f.write_text('[cascade]\nmodels = ["sim:claude-haiku-4-5"]\nescalate_on_lopo = true\n')
    with pytest.raises(ConfigError) as e:
        load_config(f)
    msg = str(e.value)
    assert (
        msg.startswith(f"{f}: unknown key 'cascade.escalate_on_lopo'") and "escalate_on_loop" in msg
    )
    assert "\n" not in msg


def test_config_values_are_validated():
    with pytest.raises(
        ConfigError, match=r"x.toml: guard.soft_fraction: .*less than or equal to 1"
    ):
        parse_config({"guard": {"soft_fraction": 1.5}}, "x.toml")
    with pytest.raises(ConfigError, match="unknown key 'modles'; allowed at the top level: models"):
        parse_config({"modles": {}}, "x.toml")
    cfg = parse_config({"guard": {"max_tokens": 1000}, "failover": {"a:b": ["c:d"]}}, "x.toml")
    assert cfg.guard.max_tokens == 1000 and cfg.model_specs() == ["a:b", "c:d"]


def stayer(*args: str, home: Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.endswith("_API_KEY")} | {
        "STAYER_HOME": str(home)
    }
    return subprocess.run(
        [sys.executable, "-m", "stayer.cli", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )


@pytest.mark.parametrize(
    ("toml", "expected"),
    [
        ('[cascade]\nmodels = ["sim:claude-haiku-4-5"]\nfoo = 1\n', "unknown key 'cascade.foo'"),
        (
            '[models]\nsubagent = "sim:claude-unknown-9"\n',
            "no price data for sim:claude-unknown-9 (models.subagent), so --max-cost cannot be enforced",
        ),
        ('[models]\nexecution = "anthropic:claude-haiku-4-5"\n', "mixes simulated and real models"),
    ],
)
def test_bad_config_is_a_one_line_error_and_writes_nothing(tmp_path, toml, expected):
    f = tmp_path / "stayer.toml"
    f.write_text(toml)
    home = tmp_path / "home"
    r = stayer(
        "run",
        str(ROOT / "examples" / "hello-file"),
        "--model",
        "sim:claude-sonnet-4-5",
        "--sandbox",
        "local",
        "--max-cost",
        "1",
        "--config",
        str(f),
        "--json",
        home=home,
    )
    assert r.returncode == 2 and r.stdout == ""
    assert expected in r.stderr and str(f) in r.stderr and len(r.stderr.strip().splitlines()) == 1
    assert not home.exists()


def test_cost_capped_run_that_cannot_finish_exits_3_with_a_summary(tmp_path):
    home = tmp_path / "home"
    r = stayer(
        "run",
        str(ROOT / "examples" / "hello-file"),
        "--model",
        "sim:claude-sonnet-4-5",
        "--sandbox",
        "local",
        "--sim-policy",
        "synthetic:steps=200,obs_tokens=400,out_tokens=100",
        "--max-steps",
        "250",
        "--max-cost",
        "0.15",
        "--json",
        home=home,
    )
    assert r.returncode == 3, r.stderr
    doc = json.loads(r.stdout)
    assert doc["status"] == "budget_exhausted" and doc["stop_reason"] == "max_cost"
    assert Decimal(doc["cost_usd"]) <= Decimal("0.15")
    assert doc["summary"].startswith("DONE: ") and "REMAINING" in doc["summary"]
    assert any(t["reason"] == "max_cost" for e in doc["ledger"] for t in e["breakers"])
    assert doc["breakers"][0]["reason"] == "max_cost" and doc["agents"][0]["agent"] == "main"
    # The synthetic commands work without a sandbox too (no /app on the host needed).
    assert all(e["tool_errors"] == 0 for e in doc["ledger"])


# --- roles, cascade and the priced switch -------------------------------------------------------


def test_planning_phase_then_execution_model():
    router = Router(
        SONNET,
        PRICES,
        roles={"planning": SONNET, "execution": HAIKU},
        planning_steps=2,
        cache_aware=False,
    )
    chosen = [router.choose(view(s, 5_000, 10.0 * s)).model.model_id for s in range(1, 5)]
    assert chosen == [
        "claude-sonnet-4-5",
        "claude-sonnet-4-5",
        "claude-haiku-4-5",
        "claude-haiku-4-5",
    ]
    assert router.role("summariser") is SONNET and router.role("execution") is HAIKU


def test_cascade_escalates_on_repeated_errors_and_failing_tests():
    router = Router(
        HAIKU,
        PRICES,
        cascade=[HAIKU, SONNET],
        escalate_after_errors=2,
        escalate_after_failing_tests=2,
    )
    failed = StepRecord(1, None, (ToolCallRecord("bash", '{"command": "ls nope"}', False, 2),))
    router.record_step(failed)
    assert router.level == 0
    router.record_step(failed)
    assert router.level == 1 and router.choose(view(3, 5_000, 30.0)).model is SONNET
    router = Router(
        HAIKU,
        PRICES,
        cascade=[HAIKU, SONNET],
        escalate_after_errors=0,
        escalate_after_failing_tests=2,
    )
    tests_fail = StepRecord(
        1,
        None,
        (
            ToolCallRecord("bash", '{"command": "pytest -q"}', False, 1),
            ToolCallRecord("read_file", "{}", False),
        ),
    )
    router.record_step(tests_fail)
    router.record_step(tests_fail)
    assert router.level == 1


def test_cache_aware_router_stays_where_the_cache_is_warm_when_a_switch_cannot_pay_back():
    # On the strong model with a large warm context and few steps left, stepping down would
    # re-bill 150K tokens on the cheap model: stay. The cache-ignoring router switches.
    for aware, expect in ((True, SONNET), (False, HAIKU)):
        router = Router(HAIKU, PRICES, cascade=[HAIKU, SONNET], relax_after=1, cache_aware=aware)
        router.escalate()
        for s in range(1, 196):
            router.choose(view(s, 1_000 * s, 20.0 * s))
        router.relax()
        route = router.choose(view(196, 150_000, 20.0 * 196))
        assert route.model is expect
        if aware:
            assert (
                route.quote is not None
                and not route.quote.pays
                and "would not pay back" in route.reason
            )


def test_cache_aware_router_switches_when_the_saving_pays_for_the_miss():
    # A small context and replies of 500 tokens: the cheaper model's per-step saving (on
    # output alone, $5/M less) repays the re-read and a possible comeback quickly.
    router = Router(HAIKU, PRICES, cascade=[HAIKU, SONNET], relax_after=1, cache_aware=True)
    router.escalate()
    for s in range(1, 41):
        router.choose(view(s, 4_000 + 10 * s, 20.0 * s))
        router.output_per_step = 500
    router.relax()
    route = router.choose(view(41, 4_400, 20.0 * 41, max_steps=400))
    assert route.model is HAIKU and route.switched and route.quote is not None and route.quote.pays


def test_escalation_is_never_held_back_by_the_cache():
    router = Router(HAIKU, PRICES, cascade=[HAIKU, SONNET], cache_aware=True)
    for s in range(1, 50):
        router.choose(view(s, 2_000 * s, 10.0 * s))
    router.escalate()
    route = router.choose(view(50, 100_000, 500.0))
    assert route.model is SONNET and route.switched and route.quote is None


# --- tiers and failover -------------------------------------------------------------------------


def test_service_tier_by_latency_target_and_batch_mode():
    gpt = ScriptedModel("gpt-5", provider="openai")

    def tier(policy: TierPolicy) -> str | None:
        router = Router(gpt, PRICES, tiers=policy)
        router.output_per_step = 500
        return router.choose(view(1, 20_000, 0.0)).tier

    assert tier(TierPolicy(latency_target_s=60)) == "flex"  # slow is fine: the cheapest tier
    assert tier(TierPolicy(latency_target_s=10)) is None  # the standard tier fits, flex does not
    assert tier(TierPolicy(latency_target_s=6)) == "priority"  # only priority is fast enough
    assert tier(TierPolicy(latency_target_s=1)) == "priority"  # none is: the fastest
    sonnet_batch = Router(SONNET, PRICES, tiers=TierPolicy(batch=True)).choose(view(1, 20_000, 0.0))
    assert sonnet_batch.tier == "batch" and sonnet_batch.latency_s > 600
    # Anthropic has no fast mode on Sonnet (no price): never chosen, however tight the target.
    assert (
        Router(SONNET, PRICES, tiers=TierPolicy(latency_target_s=1))
        .choose(view(1, 20_000, 0.0))
        .tier
        is None
    )


def test_failover_to_another_provider_after_retries_fail(tmp_path):
    primary = failing("claude-sonnet-4-5")
    backup = ScriptedModel(
        "gpt-5",
        [bash("echo hi", 1), call("submit", {"summary": "done on the backup"}, 2)],
        provider="openai",
    )
    router = Router(primary, PRICES, failover_to={primary.spec: [backup]})
    events = []
    ctx = ToolContext(sandbox=LocalSandbox(tmp_path), workspace=str(tmp_path))
    agent = Agent(
        primary,
        default_tools(COUNTER.counter),
        ctx,
        AgentSettings(PRICES, COUNTER, Limits(max_steps=5), router=router),
        [Hooks(event=lambda e: events.append(event_record(e)))],
    )
    result = asyncio.run(agent.run("task", "run-1"))
    assert result.status == "submitted" and {e.model for e in result.ledger} == {backup.spec}
    assert (
        "failover",
        {"agent": "main", "from": primary.spec, "to": backup.spec, "error": "503 after 6 attempts"},
    ) in events
    assert len(primary.requests) == 1  # taken out of rotation after its failure


def test_loop_breaker_escalates_the_cascade_before_wrapping_up(tmp_path):
    cheap = ScriptedModel("claude-haiku-4-5", [bash("ls")])
    strong = ScriptedModel(
        "claude-sonnet-4-5", [call("submit", {"summary": "the stronger model finished it"})]
    )
    router = Router(
        cheap,
        PRICES,
        cascade=[cheap, strong],
        escalate_after_errors=0,
        escalate_after_failing_tests=0,
    )
    ctx = ToolContext(sandbox=LocalSandbox(tmp_path), workspace=str(tmp_path))
    agent = Agent(
        cheap,
        default_tools(COUNTER.counter),
        ctx,
        AgentSettings(
            PRICES, COUNTER, Limits(max_steps=20, guard=GuardConfig(loop_repeats=3)), router=router
        ),
    )
    result = asyncio.run(agent.run("task", "run-1"))
    assert result.status == "submitted"
    trip = result.ledger[2].breakers[0]
    assert trip["reason"] == "loop" and trip["action"] == "escalate"
    assert [e.model for e in result.ledger] == [cheap.spec] * 3 + [strong.spec]
    assert result.ledger[3].route["switched"] and result.ledger[3].route["model"] == strong.spec

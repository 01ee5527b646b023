"""The loop itself, with a scripted model: tool errors, nudges, limits, incremental counting."""

from __future__ import annotations

import asyncio
from decimal import Decimal

from stayer.agent import Agent, AgentSettings, Limits
from stayer.context.layout import Context
from stayer.models.base import Message, ModelError, ToolCall, ToolSpec
from stayer.models.scripted import ScriptedModel
from stayer.pricing import PriceBook
from stayer.sandbox.local import LocalSandbox
from stayer.tokens import MessageCounter, TiktokenCounter
from stayer.tools import default_tools
from stayer.tools.base import ToolContext
from stayer.usage import Usage


def scripted(replies: list[Message | Exception]) -> ScriptedModel:
    return ScriptedModel(
        "claude-sonnet-4-5", replies, usage=Usage(input_tokens=1000, output_tokens=50)
    )


def call(name: str, args: str, i: int = 0) -> Message:
    return Message("assistant", "", (ToolCall(f"c{i}", name, args),))


def run(model: ScriptedModel, tmp_path, **limits) -> tuple:
    counter = TiktokenCounter()
    ctx = ToolContext(sandbox=LocalSandbox(tmp_path), workspace=str(tmp_path))
    agent = Agent(
        model,
        default_tools(counter),
        ctx,
        AgentSettings(PriceBook(), MessageCounter(counter), Limits(**limits)),
    )
    return asyncio.run(agent.run("Do the task.", "run-1")), agent


def test_malformed_tool_arguments_go_back_to_the_model_as_errors(tmp_path):
    model = scripted(
        [call("bash", '{"command": "echo hi', 1), call("nope", "{}", 2), call("submit", "{}", 3)]
    )
    result, _ = run(model, tmp_path)
    assert result.status == "submitted" and result.steps == 3
    assert [e.to_dict()["tool_errors"] for e in result.ledger] == [1, 1, 0]
    tool_msgs = [m for m in model.requests[-1].messages if m.role == "tool"]
    assert tool_msgs[0].is_error and "JSON" in tool_msgs[0].content
    assert tool_msgs[1].is_error and "nope" in tool_msgs[1].content


def test_commands_that_exit_non_zero_count_as_tool_errors_in_the_ledger(tmp_path):
    # The breakers trip on them; the ledger must say why, not show 0 errors a step.
    model = scripted(
        [call("bash", f'{{"command": "exit {i}"}}', i) for i in (3, 0, 1)]
        + [call("submit", "{}", 9)]
    )
    result, _ = run(model, tmp_path)
    assert [e.to_dict()["tool_errors"] for e in result.ledger] == [1, 0, 1, 0]


def test_reply_without_tool_call_gets_a_nudge(tmp_path):
    model = scripted([Message("assistant", "thinking"), call("submit", "{}")])
    result, _ = run(model, tmp_path)
    assert result.status == "submitted"
    assert model.requests[1].messages[-1].kind == "nudge"


def test_max_steps_ends_budget_exhausted(tmp_path):
    model = scripted([call("bash", '{"command": "true"}', i) for i in range(5)])
    result, _ = run(model, tmp_path, max_steps=3)
    assert (
        result.status == "budget_exhausted"
        and result.steps == 3
        and result.stop_reason == "max_steps"
    )


def test_model_error_ends_the_run_with_error(tmp_path):
    model = scripted([call("bash", '{"command": "true"}'), ModelError("503 after 6 attempts")])
    result, _ = run(model, tmp_path)
    assert result.status == "error" and "503" in result.error and result.steps == 1


def test_history_is_append_only_and_prefix_stable(tmp_path):
    model = scripted(
        [
            call("bash", '{"command": "echo a"}', 1),
            call("bash", '{"command": "echo b"}', 2),
            call("submit", "{}", 3),
        ]
    )
    run(model, tmp_path)
    a, b, c = model.requests
    assert a.system == b.system == c.system and a.tools == c.tools
    assert b.messages[: len(a.messages)] == a.messages
    assert c.messages[: len(b.messages)] == b.messages
    assert [t.name for t in a.tools] == sorted(t.name for t in a.tools)
    assert c.cache_breakpoints == [0, len(c.messages) - 1] and c.cache_key == "run-1"


def test_cost_cap_never_overshot_and_shrinks_max_tokens(tmp_path):
    # Distinct commands: the same one repeated would (rightly) trip the loop breaker first.
    model = scripted([call("bash", f'{{"command": "echo {i}"}}', i) for i in range(50)])
    result, _ = run(model, tmp_path, max_cost=Decimal("0.05"), max_steps=50)
    assert result.status == "budget_exhausted" and result.stop_reason == "max_cost"
    assert result.cost_usd <= Decimal("0.05")
    # Each step bills 1,000 input at $3/M + 50 output at $15/M = $0.00375; the run stops
    # only when the next call's worst case (about $0.01 here) no longer fits.
    assert result.cost_usd == result.steps * Decimal("0.00375")
    assert result.cost_usd > Decimal("0.05") - Decimal("0.01")
    assert min(r.max_tokens for r in model.requests) < 8192


class CountingCounter(TiktokenCounter):
    def __init__(self) -> None:
        super().__init__()
        self.calls = 0

    def count(self, text: str) -> int:
        self.calls += 1
        return super().count(text)


def test_token_counting_is_incremental():
    counter = CountingCounter()
    ctx = Context("system", [ToolSpec("t", "d", {})], "task", MessageCounter(counter))
    base = counter.calls
    for i in range(100):
        ctx.append(Message("tool", f"output {i}"))
        ctx.request(max_tokens=100)
    assert counter.calls - base == 100  # one count per new message, never the whole history

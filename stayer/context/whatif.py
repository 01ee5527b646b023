"""What-if replay: a recorded trajectory's cost under another model, policy or context limit.

The trajectory's actions and observations are fixed; what changes is the prompt each step
would send — assembled by the same ``Context`` and ``ContextPolicy`` as a live run — and
what that prompt costs under the target provider's caching rules and prices (the
simulator's accounting, the same pricing path as a real call). The result is an
*estimate*: it assumes the agent would have acted the same with a different context.

Traces: a stayer run (its id under ``$STAYER_HOME/runs``, or its directory), a SWE-agent
``.traj`` file, or a mini-swe-agent ``.traj.json`` file.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from stayer.context.policies import ContextPolicy
from stayer.errors import ConfigError
from stayer.models.base import Message, ModelRequest, ToolCall, ToolSpec
from stayer.pricing import PriceBook
from stayer.tokens import MessageCounter
from stayer.tools.base import ToolContext, ToolResult


@dataclass
class Trace:
    source: str
    system: str
    instruction: str
    turns: list[Message]  # assistant messages, each with at least one tool call
    observations: dict[str, str]  # tool_call_id → observation text
    tools: list[ToolSpec] = field(default_factory=list)


BASH = ToolSpec("bash", "Run a shell command in the workspace and return its output.", {
    "type": "object", "properties": {"command": {"type": "string"}},
})


def load_trace(ref: str, home: Path | None = None) -> Trace:
    """Load a trace from a run id, a run directory, a ``.traj`` or a ``.traj.json`` file."""
    path = Path(ref)
    if not path.exists() and home is not None and (home / "runs" / ref).is_dir():
        path = home / "runs" / ref
    if path.is_dir():
        return _stayer_run(path)
    if not path.is_file():
        raise ConfigError(f"{ref}: no such trace (expected a stayer run id or directory, a SWE-agent .traj or a mini-swe-agent .traj.json file)")
    try:
        data = json.loads(path.read_text())
    except (ValueError, UnicodeDecodeError) as e:
        raise ConfigError(f"{path}: not valid JSON ({e}); the file may be truncated") from None
    if isinstance(data, dict) and isinstance(data.get("messages"), list):
        return _mini_swe_agent(path, data["messages"])
    if isinstance(data, dict) and isinstance(data.get("history"), list) and isinstance(data.get("trajectory"), list):
        return _swe_agent(path, data)
    raise ConfigError(
        f"{path}: unknown trace format (expected a mini-swe-agent .traj.json with 'messages', "
        "or a SWE-agent .traj with 'history' and 'trajectory')"
    )


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # content blocks
        return "\n".join(str(b.get("text", "")) if isinstance(b, dict) else str(b) for b in content)
    return "" if content is None else str(content)


def _mini_swe_agent(path: Path, messages: list[dict]) -> Trace:
    system = "\n".join(_text(m.get("content")) for m in messages if m.get("role") == "system")
    rest = [m for m in messages if m.get("role") != "system"]
    first = next((i for i, m in enumerate(rest) if m.get("role") == "assistant"), len(rest))
    instruction = "\n\n".join(_text(m.get("content")) for m in rest[:first])
    turns: list[Message] = []
    observations: dict[str, str] = {}
    pending: list[str] = []
    for n, m in enumerate(rest[first:]):
        role = m.get("role")
        if role == "assistant":
            calls = []
            for i, c in enumerate(m.get("tool_calls") or []):
                fn = c.get("function") or {}
                args = _object_arguments(fn.get("arguments") or "{}")
                calls.append(ToolCall(c.get("id") or f"t{n}_{i}", fn.get("name") or "bash", args))
            if not calls:  # text actions (older format): the next user message is the output
                calls = [ToolCall(f"t{n}", "bash", "{}")]
            turns.append(Message("assistant", _text(m.get("content")), tuple(calls)))
            pending = [c.id for c in calls]
        elif role in ("tool", "user") and turns:
            # A user message after the calls were answered (a format-error nudge) was part of
            # the prompt too: it goes with the last call's observation.
            key = m.get("tool_call_id") or (pending[0] if pending else turns[-1].tool_calls[-1].id)
            observations[key] = observations.get(key, "") + _text(m.get("content"))
            if key in pending:
                pending.remove(key)
    if not turns:
        raise ConfigError(f"{path}: the trajectory has no assistant turns")
    return Trace(str(path), system, instruction, turns, observations, [BASH])


def _swe_agent(path: Path, data: dict) -> Trace:
    history = data["history"]
    system = "\n".join(_text(h.get("content")) for h in history if h.get("role") == "system")
    first = next((i for i, h in enumerate(history) if h.get("role") == "assistant"), len(history))
    instruction = "\n\n".join(_text(h.get("content")) for h in history[:first] if h.get("role") != "system")
    turns: list[Message] = []
    observations: dict[str, str] = {}
    for n, step in enumerate(data["trajectory"]):
        if not isinstance(step, dict):
            raise ConfigError(f"{path}: trajectory[{n}] is not an object")
        call = ToolCall(f"t{n}", "bash", "{}")  # the action is part of the response text
        turns.append(Message("assistant", _text(step.get("response")), (call,)))
        observations[call.id] = _text(step.get("observation"))
    if not turns:
        raise ConfigError(f"{path}: the trajectory is empty")
    return Trace(str(path), system, instruction, turns, observations, [BASH])


def _stayer_run(run_dir: Path) -> Trace:
    from stayer.agent import SYSTEM_PROMPT
    from stayer.tokens import TiktokenCounter
    from stayer.tools import default_tools

    file = run_dir / "trajectory.jsonl"
    if not file.is_file():
        raise ConfigError(f"{run_dir}: not a stayer run directory (no trajectory.jsonl)")
    instruction, turns, observations = "", [], {}
    for n, line in enumerate(file.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except ValueError:
            raise ConfigError(f"{file}:{n}: truncated or malformed record") from None
        if rec.get("kind") == "task":
            instruction = rec.get("content", "")
        elif rec.get("role") == "assistant" and rec.get("tool_calls"):
            calls = tuple(ToolCall(c["id"], c["name"], _object_arguments(c["arguments"])) for c in rec["tool_calls"])
            turns.append(Message("assistant", rec.get("content", ""), calls))
        elif rec.get("role") == "tool":
            observations[rec.get("tool_call_id", "")] = rec.get("content", "")
    tools = [t.spec for t in default_tools(TiktokenCounter())]
    return Trace(str(run_dir), SYSTEM_PROMPT, instruction, turns, observations, tools)


class _Script:
    """The simulated model's behaviour: the trace's own assistant turns, in order."""

    def __init__(self, turns: list[Message]) -> None:
        self.turns = turns

    def next_message(self, request: ModelRequest) -> Message:
        step = sum(1 for m in request.messages if m.role == "assistant")
        return self.turns[min(step, len(self.turns) - 1)]


async def replay(
    trace: Trace,
    model_id: str,
    policy: ContextPolicy,
    *,
    prices: PriceBook,
    counter: MessageCounter,
    max_context: int | None = None,
) -> dict[str, Any]:
    """Replay ``trace`` through ``policy`` on ``sim:model_id``; the ``whatif --json`` document."""
    from stayer.agent import Agent, Limits
    from stayer.guard.breakers import GuardConfig
    from stayer.models.sim import SimModel

    names = sorted({c.name for t in trace.turns for c in t.tool_calls} | {t.name for t in trace.tools})
    specs = {t.name: t for t in trace.tools}
    outputs = iter([trace.observations.get(c.id, "") for t in trace.turns for c in t.tool_calls])
    tools = [RecordedTool(specs.get(n, ToolSpec(n, f"Recorded tool {n}.", {"type": "object"})), outputs) for n in names]
    model = SimModel(model_id, _Script(trace.turns), counter)
    agent = Agent(
        model,
        tools,
        prices,
        ToolContext(sandbox=None, workspace=""),  # type: ignore[arg-type]
        counter,
        Limits(max_steps=len(trace.turns), max_context=max_context, guard=GuardConfig.off()),
        system_prompt=trace.system,
        policy=policy,
    )
    result = await agent.run(trace.instruction, run_id="whatif")
    u = result.usage
    if result.status == "error":
        raise ConfigError(result.error or "replay failed")
    return {
        "estimate": True,
        "trace": trace.source,
        "model": f"sim:{model_id}",
        "policy": policy.name,
        "max_context": max_context,
        "cost_usd": "unknown" if result.cost_usd is None else str(result.cost_usd),
        "usage": u.to_dict(),
        "cache_hit_ratio": round(u.cache_hit_ratio, 4),
        "peak_context_tokens": result.peak_context_tokens,
        "requests": result.steps,
        "compactions": sum(1 for e in result.ledger if e.compaction),
        "cache_breaks": sum(1 for e in result.ledger if e.cache_break),
        "step_costs": [e.cost.to_json() for e in result.ledger],
    }


class RecordedTool:
    """Returns the recorded observations in call order (what-if keeps actions fixed; the
    loop runs calls in the order the trace made them)."""

    def __init__(self, spec: ToolSpec, outputs: Iterator[str]) -> None:
        self.spec = ToolSpec(spec.name, spec.description, {"type": "object"})
        self.outputs = outputs

    async def __call__(self, args: dict[str, Any], ctx: ToolContext) -> ToolResult:
        return ToolResult(next(self.outputs, ""))


def _object_arguments(arguments: str) -> str:
    """Arguments that the loop's dispatcher accepts, with the same text where possible:
    a recorded call whose arguments were not a JSON object is wrapped, not dropped."""
    try:
        if isinstance(json.loads(arguments), dict):
            return arguments
    except ValueError:
        pass
    return json.dumps({"raw": arguments})

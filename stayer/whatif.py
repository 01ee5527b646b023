"""What-if replay: a recorded trajectory's cost under another model, policy or context limit.

A layer above the agent (next to ``eval`` and ``audit``): it drives a whole ``Agent`` on a
simulated model.

The trajectory's actions and observations are fixed; what changes is the prompt each step
would send — assembled by the same ``Context`` and ``ContextPolicy`` as a live run — and
what that prompt costs under the target provider's caching rules and prices (the
simulator's accounting, the same pricing path as a real call). The result is an
*estimate*: it assumes the agent would have acted the same with a different context.

Traces: a stayer run (its id under ``$STAYER_HOME/runs``, or its directory), a SWE-agent
``.traj`` file, or a mini-swe-agent ``.traj.json`` file.

Details and rationale: docs/notes.md, ``stayer/whatif.py``.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path
from typing import Any

import msgspec
from msgspec import UNSET, UnsetType

from stayer.agent import SYSTEM_PROMPT, Agent, AgentSettings, Limits
from stayer.context.policies import ContextPolicy, make_policy
from stayer.errors import ConfigError
from stayer.guard.breakers import GuardConfig
from stayer.ledger import LedgerEntry
from stayer.messages import Message, ToolCall, ToolSpec
from stayer.models.base import ModelRequest
from stayer.models.caching import provider_of
from stayer.models.sim import SimModel
from stayer.money import Usd
from stayer.pricing import PriceBook
from stayer.records import Record, decode
from stayer.settings import read_text
from stayer.tokens import Counters, MessageCounter, TiktokenCounter
from stayer.tools import check_args, default_tools
from stayer.tools.base import ToolContext, ToolResult
from stayer.usage import Usage


@dataclass(frozen=True)
class Recorded:
    """What a trace says about its own run: its cost, model and context policy."""

    cost_usd: Decimal | None = None  # None: the trace does not say
    model: str | None = None  # the model id as the trace names it (provider prefix dropped)
    policy: str = "none"  # other agents keep the whole history
    requests: int | None = None  # model calls the run made, where the trace counts them

    @property
    def cost_text(self) -> str | None:
        return None if self.cost_usd is None else str(self.cost_usd)

    def record(self, source: str) -> RecordedRun:
        return RecordedRun(
            cost_usd=self.cost_text,
            model=self.model,
            policy=self.policy,
            requests=self.requests,
            source=source,
        )


class RecordedRun(Record, kw_only=True):
    """``recorded`` of the ``whatif --json`` document: what the trace says it cost."""

    cost_usd: str | None
    model: str | None
    policy: str
    requests: int | None
    source: str


class Replay(Record, kw_only=True):
    """One replay of a trace (``replay``); ``delta_usd``: a scenario's difference from
    the baseline replay."""

    estimate: bool = True
    trace: str
    model: str
    policy: str
    max_context: int | None
    cost_usd: str
    usage: Usage
    cache_hit_ratio: float
    peak_context_tokens: int
    requests: int
    compactions: int
    cache_breaks: int
    step_costs: list[str]
    step_cache_read_tokens: list[int]
    delta_usd: str | None | UnsetType = UNSET


class WhatIf(Record, kw_only=True):
    """The comparison part of the ``whatif --json`` document (``compare``)."""

    recorded: RecordedRun
    baseline: Replay | None
    baseline_error: str | None
    replayed_calls: int
    rejected_calls: int
    notes: list[str]
    replay_error_usd: str | None
    scenarios: list[Replay]


@dataclass
class Trace:
    source: str
    system: str
    instruction: str
    turns: list[Message]  # assistant messages, each with at least one tool call
    observations: dict[str, str]  # tool_call_id → observation text
    tools: list[ToolSpec] = field(default_factory=list)
    reasoning: list[int] = field(default_factory=list)  # per turn, where recorded
    recorded: Recorded = field(default_factory=Recorded)
    agent: str = "stayer"  # the agent that wrote the trace, as the notes name it
    # turn index → the text that answered a reply without tool calls (default: NUDGE)
    nudges: dict[int, str] = field(default_factory=dict)
    # turns whose reply the agent rejected and did not keep (replayed as empty replies)
    rejected: set[int] = field(default_factory=set)
    # per turn, whether the recorded cost includes that call (empty: all of them)
    billed: list[bool] = field(default_factory=list)
    # turn index → (its recorded cost, the cached prompt tokens recorded), where recorded
    calls: dict[int, tuple[Decimal, int]] = field(default_factory=dict)


BASH = ToolSpec(
    "bash",
    "Run a shell command in the workspace and return its output.",
    {
        "type": "object",
        "properties": {"command": {"type": "string"}},
    },
)


def load_trace(ref: str, home: Path | None = None) -> Trace:
    """Load a trace from a run id, a run directory, a ``.traj`` or a ``.traj.json`` file."""
    path = Path(ref)
    if not path.exists() and home is not None and (home / "runs" / ref).is_dir():
        path = home / "runs" / ref
    if path.is_dir():
        return _stayer_run(path)
    if not path.is_file():
        raise ConfigError(
            f"{ref}: no such trace (expected a stayer run id or directory, a SWE-agent .traj or a mini-swe-agent .traj.json file)"
        )
    text = read_text(path, "")
    try:
        data = json.loads(text)
    except ValueError as e:
        raise ConfigError(f"{path}: not valid JSON ({e}); the file may be truncated") from None
    except RecursionError:
        raise ConfigError(f"{path}: nested too deeply to be a trajectory") from None
    if isinstance(data, dict) and isinstance(data.get("messages"), list):
        trace = _mini_swe_agent(path, _objects(data["messages"], path, "messages"))
        trace.recorded = _recorded_by_swe_agent(data, _mini_swe_agent_model(data))
        trace.billed = _billed_by_mini_swe_agent(data["messages"], trace, trace.recorded)
        kept = [i for i in range(len(trace.turns)) if i not in trace.rejected]
        replies = [m for m in data["messages"] if m.get("role") == "assistant"]
        trace.calls = {i: c for i, m in zip(kept, replies, strict=False) if (c := _call_of(m))}
        return trace
    if (
        isinstance(data, dict)
        and isinstance(data.get("history"), list)
        and isinstance(data.get("trajectory"), list)
    ):
        trace = _swe_agent(path, data)
        trace.recorded = _recorded_by_swe_agent(data, _swe_agent_model(data))
        return trace
    raise ConfigError(
        f"{path}: unknown trace format (expected a mini-swe-agent .traj.json with 'messages', "
        "or a SWE-agent .traj with 'history' and 'trajectory')"
    )


def _objects(items: list[Any], path: Path, field: str) -> list[dict[str, Any]]:
    for i, item in enumerate(items):
        if not isinstance(item, dict):
            raise ConfigError(
                f"{path}: {field}[{i}]: expected an object, got {type(item).__name__}"
            )
    return items


def _call_arguments(value: Any) -> str:
    """Recorded arguments as the loop's dispatcher sees them: JSON text of an object."""
    return _object_arguments(value if isinstance(value, str) else json.dumps(value))


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # content blocks
        return "\n".join(str(b.get("text", "")) if isinstance(b, dict) else str(b) for b in content)
    return "" if content is None else str(content)


def _model_id(name: object) -> str | None:
    """``openai/gpt-5-mini``, ``sim:gpt-5`` → ``gpt-5-mini``, ``gpt-5``."""
    if not isinstance(name, str) or not name:
        return None
    return name.rsplit("/", 1)[-1].rsplit(":", 1)[-1]


def _recorded_by_swe_agent(data: dict, model: str | None) -> Recorded:
    stats = (data.get("info") or {}).get("model_stats") or {}
    cost, calls = stats.get("instance_cost"), stats.get("api_calls")
    return Recorded(
        Decimal(repr(cost)) if isinstance(cost, int | float) else None,
        model,
        requests=calls if isinstance(calls, int) else None,
    )


def _mini_swe_agent_model(data: dict) -> str | None:
    config = (data.get("info") or {}).get("config") or {}
    return _model_id(
        ((config.get("model") or {}) if isinstance(config, dict) else {}).get("model_name")
    )


def _swe_agent_model(data: dict) -> str | None:
    config = data.get("replay_config")
    try:
        config = json.loads(config) if isinstance(config, str) else config
    except ValueError:
        return None
    model = (
        ((config or {}).get("agent") or {}).get("model") or {} if isinstance(config, dict) else {}
    )
    return _model_id(model.get("name") if isinstance(model, dict) else None)


def _call_of(message: dict) -> tuple[Decimal, int] | None:
    """The cost and cached prompt tokens an OpenAI-style usage logged with a reply reports."""
    extra = message.get("extra") or {}
    usage = (extra.get("response") or {}).get("usage") or {} if isinstance(extra, dict) else {}
    cost = extra.get("cost") if isinstance(extra, dict) else None
    details = usage.get("prompt_tokens_details") or {} if isinstance(usage, dict) else {}
    cached = details.get("cached_tokens") if isinstance(details, dict) else None
    if not isinstance(cost, int | float) or not isinstance(cached, int):
        return None
    return Decimal(repr(cost)), cached


def _reasoning_of(message: dict) -> int:
    """The reasoning tokens an OpenAI-style usage logged with a message reports."""
    usage = ((message.get("extra") or {}).get("response") or {}).get("usage") or {}
    details = usage.get("completion_tokens_details") or {} if isinstance(usage, dict) else {}
    value = details.get("reasoning_tokens") if isinstance(details, dict) else None
    return value if isinstance(value, int) and value > 0 else 0


def _rejected(m: dict) -> bool:
    """A mini-swe-agent message answering a reply it rejected (a format error)."""
    extra = m.get("extra")
    return (
        m.get("role") == "user"
        and isinstance(extra, dict)
        and (extra.get("interrupt_type") == "FormatError")
    )


def _mini_swe_agent(path: Path, messages: list[dict]) -> Trace:
    """mini-swe-agent 2 keeps no reply it rejects (``FormatError``: no or a bad tool call):
    its call was made and billed, and only the error message that answered it is kept. A
    format error that follows no assistant message is such a call: a turn of its own, an
    empty reply answered by the recorded error text. (mini-swe-agent 1 kept the rejected
    reply: there the error is the observation of the reply before it.)"""
    system = "\n".join(_text(m.get("content")) for m in messages if m.get("role") == "system")
    rest = [m for m in messages if m.get("role") != "system"]
    first = next(
        (i for i, m in enumerate(rest) if m.get("role") == "assistant" or _rejected(m)), len(rest)
    )
    instruction = "\n\n".join(_text(m.get("content")) for m in rest[:first])
    turns: list[Message] = []
    reasoning: list[int] = []
    observations: dict[str, str] = {}
    nudges: dict[int, str] = {}
    rejected: set[int] = set()
    pending: list[str] = []
    previous = None
    for n, m in enumerate(rest[first:]):
        role = m.get("role")
        if role == "assistant":
            reasoning.append(_reasoning_of(m))
            calls = []
            tool_calls = m.get("tool_calls") or []
            if not isinstance(tool_calls, list):
                raise ConfigError(
                    f"{path}: messages: tool_calls: expected a list, got {type(tool_calls).__name__}"
                )
            for i, c in enumerate(_objects(tool_calls, path, "tool_calls")):
                fn = c.get("function")
                fn = fn if isinstance(fn, dict) else {}
                args = _call_arguments(fn.get("arguments") or "{}")
                calls.append(
                    ToolCall(str(c.get("id") or f"t{n}_{i}"), str(fn.get("name") or "bash"), args)
                )
            if not calls:  # text actions (older format): the next user message is the output
                calls = [ToolCall(f"t{n}", "bash", "{}")]
            turns.append(Message("assistant", _text(m.get("content")), tuple(calls)))
            pending = [c.id for c in calls]
        elif _rejected(m) and previous != "assistant":
            rejected.add(len(turns))
            nudges[len(turns)] = _text(m.get("content"))
            turns.append(Message("assistant", "", (), kind="rejected"))
            reasoning.append(0)
            pending = []
        elif role in ("tool", "user") and len(turns) - 1 in rejected and not pending:
            nudges[len(turns) - 1] += "\n" + _text(m.get("content"))  # after the error text
        elif role in ("tool", "user") and turns:
            # A user message after the calls were answered (a format-error nudge) was part of
            # the prompt too: it goes with the last call's observation.
            last = next(t for t in reversed(turns) if t.tool_calls)
            key = str(m.get("tool_call_id") or (pending[0] if pending else last.tool_calls[-1].id))
            observations[key] = observations.get(key, "") + _text(m.get("content"))
            if key in pending:
                pending.remove(key)
        previous = role
    if not any(t.tool_calls for t in turns):
        raise ConfigError(f"{path}: the trajectory has no assistant turns")
    return Trace(
        str(path),
        system,
        instruction,
        turns,
        observations,
        [BASH],
        reasoning,
        agent="mini-swe-agent",
        nudges=nudges,
        rejected=rejected,
    )


def _billed_by_mini_swe_agent(messages: list[Any], trace: Trace, recorded: Recorded) -> list[bool]:
    """Which calls the recorded cost counts. mini-swe-agent sums the costs of the replies it
    kept: when those add up to its ``instance_cost``, a rejected reply's cost is not in it."""
    costs = [
        (m.get("extra") or {}).get("cost")
        for m in messages
        if m.get("role") == "assistant" and isinstance(m.get("extra") or {}, dict)
    ]
    if (
        not trace.rejected
        or recorded.cost_usd is None
        or not all(isinstance(c, int | float) for c in costs)
    ):
        return []
    kept = sum(Decimal(repr(c)) for c in costs)
    if abs(kept - recorded.cost_usd) > Decimal("1e-9") * max(Decimal(1), recorded.cost_usd):
        return []
    return [i not in trace.rejected for i in range(len(trace.turns))]


def _swe_agent(path: Path, data: dict) -> Trace:
    history = _objects(data["history"], path, "history")
    system = "\n".join(_text(h.get("content")) for h in history if h.get("role") == "system")
    first = next((i for i, h in enumerate(history) if h.get("role") == "assistant"), len(history))
    instruction = "\n\n".join(
        _text(h.get("content")) for h in history[:first] if h.get("role") != "system"
    )
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
    file = run_dir / "trajectory.jsonl"
    if not file.is_file():
        raise ConfigError(f"{run_dir}: not a stayer run directory (no trajectory.jsonl)")
    result = _run_result(run_dir)
    # Reasoning tokens per assistant message: the main agent's ledger, one entry per call.
    reasoning_by_call = [
        e.usage.reasoning_tokens
        for e in (result.ledger if result else [])
        if e.agent == "main" and e.kind != "lost_in_flight"
    ]
    instruction, turns, observations, reasoning = "", [], {}, []
    calls_seen = 0
    for n, line in enumerate(read_text(file, "").splitlines(), 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except (ValueError, RecursionError):
            raise ConfigError(f"{file}:{n}: truncated or malformed record") from None
        if not isinstance(rec, dict):
            raise ConfigError(f"{file}:{n}: expected a JSON object, got {type(rec).__name__}")
        if rec.get("kind") == "task":
            instruction = _text(rec.get("content"))
        elif rec.get("role") == "assistant":
            # Every reply, a text-only one too (the loop answered it with NUDGE): each a call.
            calls_seen += 1
            calls = _recorded_calls(rec.get("tool_calls") or [], file, n)
            turns.append(Message("assistant", _text(rec.get("content")), calls))
            reasoning.append(
                reasoning_by_call[calls_seen - 1] if calls_seen <= len(reasoning_by_call) else 0
            )
        elif rec.get("role") == "tool":
            observations[str(rec.get("tool_call_id", ""))] = _text(rec.get("content"))
    tools = [t.spec for t in default_tools(TiktokenCounter())]
    recorded = (
        Recorded(
            result.cost.amount,
            _model_id(result.model),
            result.policy or "none",
            len(reasoning_by_call),
        )
        if result
        else Recorded()
    )
    return Trace(
        str(run_dir), SYSTEM_PROMPT, instruction, turns, observations, tools, reasoning, recorded
    )


class _RunDocument(Record, kw_only=True):
    """What a replay reads of a run's ``result.json``."""

    cost: Usd = msgspec.field(default=Usd(None), name="cost_usd")
    model: str | None = None
    policy: str | None = None
    ledger: list[LedgerEntry] = msgspec.field(default_factory=list)


def _run_result(run_dir: Path) -> _RunDocument | None:
    """The run's result.json (None if it has none yet: a run still going or killed)."""
    try:
        return decode((run_dir / "result.json").read_bytes(), _RunDocument)
    except (OSError, msgspec.DecodeError):
        return None


def _recorded_calls(value: Any, file: Path, n: int) -> tuple[ToolCall, ...]:
    """A trajectory record's tool calls: each an object with string ``id`` and ``name``."""
    if not isinstance(value, list):
        raise ConfigError(f"{file}:{n}: tool_calls: expected a list, got {type(value).__name__}")
    calls = []
    for i, c in enumerate(value):
        if (
            not isinstance(c, dict)
            or not isinstance(c.get("id"), str)
            or not isinstance(c.get("name"), str)
        ):
            raise ConfigError(
                f"{file}:{n}: tool_calls[{i}]: expected an object with string 'id' and 'name'"
            )
        calls.append(ToolCall(c["id"], c["name"], _call_arguments(c.get("arguments", "{}"))))
    return tuple(calls)


_COUNTERS = Counters()  # the replays' counters, one per encoding (each caches its counts)


class _Script:
    """The simulated model's behaviour: the trace's own assistant turns, in order (one per
    call, whatever a context policy dropped from the prompt), each with the reasoning
    tokens it was recorded with; ``nudge`` is the text that answered the last one served."""

    def __init__(self, trace: Trace) -> None:
        self.turns, self.reasoning, self.nudges = trace.turns, trace.reasoning, trace.nudges
        self.served = 0

    def next_message(self, request: ModelRequest) -> Message:
        turn = self.turns[min(self.served, len(self.turns) - 1)]
        self.served += 1
        return turn

    def reasoning_tokens(self, request: ModelRequest) -> int:
        return self.reasoning[self.served] if self.served < len(self.reasoning) else 0

    def nudge(self) -> str:
        from stayer.agent import NUDGE

        return self.nudges.get(self.served - 1, NUDGE)


async def replay(
    trace: Trace,
    model_id: str,
    policy: ContextPolicy,
    *,
    prices: PriceBook,
    counter: MessageCounter | None = None,
    max_context: int | None = None,
) -> Replay:
    """Replay ``trace`` through ``policy`` on ``sim:model_id``; the ``whatif --json`` document.
    ``counter``: None for the model's own tokenizer (``counter_for``), as a run counts."""

    # The run's own tools in its order (the prompt's prefix), then any other the trace called.
    called = [c for t in trace.turns for c in t.tool_calls]
    specs = {t.name: t for t in trace.tools}
    for name in sorted({c.name for c in called} - specs.keys()):
        specs[name] = ToolSpec(name, f"Recorded tool {name}.", {"type": "object"})
    outputs = iter([trace.observations.get(c.id, "") for c in called])
    tools = [
        RecordedTool(_replayable(spec, [c for c in called if c.name == name]), outputs)
        for name, spec in specs.items()
    ]
    counter = counter or _COUNTERS.for_model(provider_of(model_id), model_id)
    script = _Script(trace)
    model = SimModel(model_id, script, counter)
    agent = Agent(
        model,
        tools,
        ToolContext(sandbox=None, workspace=""),  # type: ignore[arg-type]
        AgentSettings(
            prices,
            counter,
            Limits(max_steps=len(trace.turns), max_context=max_context, guard=GuardConfig.off()),
            system_prompt=trace.system,
            policy=policy,
            nudge=script.nudge,
        ),
    )
    result = await agent.run(trace.instruction, run_id="whatif")
    u = result.usage
    if result.status == "error":
        raise ConfigError(result.error or "replay failed")
    return Replay(
        trace=trace.source,
        model=f"sim:{model_id}",
        policy=policy.name,
        max_context=max_context,
        cost_usd="unknown" if result.cost_usd is None else str(result.cost_usd),
        usage=u,
        cache_hit_ratio=round(u.cache_hit_ratio, 4),
        peak_context_tokens=result.peak_context_tokens,
        requests=result.steps,
        compactions=sum(1 for e in result.ledger if e.compaction),
        cache_breaks=sum(1 for e in result.ledger if e.cache_break),
        step_costs=[e.cost.to_json() for e in result.ledger],
        step_cache_read_tokens=[e.usage.cache_read_tokens for e in result.ledger],
    )


async def compare(
    trace: Trace,
    scenarios: Sequence[tuple[str | None, str]],
    *,
    prices: PriceBook,
    counter: MessageCounter | None = None,
    max_context: int | None = None,
) -> WhatIf:
    """What the trace cost, its replay under its own model and policy (the baseline), and
    each ``(model, policy)`` scenario (model None: the recorded one) with its difference
    from the baseline. The ``whatif --json`` document's comparison part; its ``notes``
    say what the replay could not reproduce exactly (empty: nothing)."""

    recorded = trace.recorded
    baseline: Replay | None = None
    baseline_error = None
    try:
        if recorded.model is None:
            raise ConfigError("the trace does not name its model")
        provider_of(recorded.model)
        baseline = await replay(
            trace, recorded.model, make_policy(recorded.policy), prices=prices, counter=counter
        )
    except ConfigError as e:
        baseline_error = f"no replay under the recorded model and policy: {e}"
    results = []
    for model, policy in scenarios:
        model = model or recorded.model
        if model is None:
            raise ConfigError(
                "--model: the trace does not name its model; give the one to replay under"
            )
        result = await replay(
            trace,
            model,
            make_policy(policy),
            prices=prices,
            counter=counter,
            max_context=max_context,
        )
        result.delta_usd = _difference(result.cost_usd, baseline.cost_usd if baseline else None)
        results.append(result)
    billed = trace.billed or [True] * len(trace.turns)
    # The replay's own error: how far re-simulating the recording is from what it cost,
    # over the calls the recorded cost counts.
    replayed_cost = baseline.cost_usd if baseline else None
    if baseline and not all(billed) and replayed_cost != "unknown":
        steps = baseline.step_costs
        if "unknown" in steps:
            replayed_cost = "unknown"
        else:
            replayed_cost = str(sum(Decimal(c) for c, b in zip(steps, billed, strict=False) if b))
    return WhatIf(
        recorded=recorded.record(trace.source),
        baseline=baseline,
        baseline_error=baseline_error,
        replayed_calls=len(trace.turns),
        rejected_calls=len(trace.rejected),
        notes=replay_notes(trace, billed) + missed_cache_notes(trace, baseline),
        replay_error_usd=_difference(replayed_cost, recorded.cost_text),
        scenarios=results,
    )


def replay_notes(trace: Trace, billed: list[bool]) -> list[str]:
    """What a replay of ``trace`` does not reproduce exactly, one sentence each."""
    notes = []
    calls, rejected = len(trace.turns), len(trace.rejected)
    if rejected:
        notes.append(
            f"{rejected} of {calls} calls were replies {trace.agent} rejected (no valid tool "
            "call) and did not keep: replayed with their recorded prompts and an empty reply "
            "(their output tokens are not in the trace)"
        )
    kept = sum(billed)
    if kept < calls:
        notes.append(
            f"the trace's own cost counts {kept} of its {calls} calls ({trace.agent} does not add "
            "a rejected reply's cost): the replay's error is over those "
            f"{kept}; the replay bills all {calls}"
        )
    requests = trace.recorded.requests
    if requests is not None and requests != calls:
        missing = requests - calls
        notes.append(
            f"the trace counts {requests} calls and records {calls}: "
            + (
                f"{missing} calls are not in it and were not replayed"
                if missing > 0
                else f"{-missing} recorded replies are not counted by it"
            )
        )
    return notes


def missed_cache_notes(trace: Trace, baseline: Replay | None) -> list[str]:
    """The recorded calls that read less from the cache than the provider's rules give, by
    a cache block (1,024 tokens) or more: a miss the rules do not predict (an evicted
    entry, another server, a write not yet visible). The part of the replay's error they
    explain, and the worst of them."""
    if baseline is None or not trace.calls:
        return []
    missed: list[tuple[Decimal, int, int, int]] = []
    steps, reads = baseline.step_costs, baseline.step_cache_read_tokens
    for i, (cost, cached) in sorted(trace.calls.items()):
        if i < len(steps) and steps[i] != "unknown" and reads[i] - cached >= 1024:
            missed.append((cost - Decimal(steps[i]), i + 1, cached, reads[i]))
    if not missed:
        return []
    extra = sum((m[0] for m in missed), Decimal(0))
    worst = sorted(missed, reverse=True)[:3]
    named = ", ".join(f"call {n}: {c:,} of {r:,}" for _, n, c, r in worst)
    return [
        f"the recording read fewer cached tokens than the provider's caching rules give on "
        f"{len(missed)} call(s) (recorded of replayed; worst: {named}): those calls cost "
        f"${extra:.6f} more than their replay"
    ]


def _difference(a: str | None, b: str | None) -> str | None:
    """``a − b`` of two money strings; None if either is missing or unknown."""
    if a in (None, "unknown") or b in (None, "unknown"):
        return None
    return format(Decimal(a) - Decimal(b), "f")


def _replayable(spec: ToolSpec, calls: list[ToolCall]) -> ToolSpec:
    """``spec`` if every recorded call passes its schema, so the replayed prompt carries the
    schema the run sent; else a schema any arguments pass, so that every call reaches the
    recorded observation (a call the loop refused would not take its turn)."""

    def fits(call: ToolCall) -> bool:
        try:
            return check_args(spec.parameters, json.loads(call.arguments or "{}")) is None
        except ValueError:
            return False

    if all(fits(c) for c in calls):
        return spec
    return ToolSpec(spec.name, spec.description, {"type": "object"})


class RecordedTool:
    """Returns the recorded observations in call order (what-if keeps actions fixed; the
    loop runs calls in the order the trace made them)."""

    def __init__(self, spec: ToolSpec, outputs: Iterator[str]) -> None:
        self.spec = spec
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

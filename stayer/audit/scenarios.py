"""``stayer audit --what-if model=ID,policy=P``: an audited session under another model or
context policy — an *estimate*, computed by the what-if engine (``stayer.whatif``).

Details and rationale: docs/notes.md, ``stayer/audit/scenarios.py``.
"""

from __future__ import annotations

import asyncio
import functools
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson

from stayer.audit.analysis import SessionReport, money
from stayer.audit.calls import MAIN_CHAIN, SessionRef, open_log
from stayer.audit.document import Scenario, WhatIfEstimate
from stayer.errors import ConfigError
from stayer.messages import Message, ToolCall
from stayer.pricing import PriceBook
from stayer.settings import MAX_TOKENS, RunFlags, check_flags

#: Sessions replayed per scenario (the costliest): a replay tokenises the whole session.
MAX_SESSIONS = 3
_FILLER = " pad"  # one token per repetition in the tokenizers stayer counts with


def parse_scenario(spec: str) -> Scenario:
    """``model=ID,policy=P[,max_context=N]`` (each part optional); ConfigError names the flag."""
    from stayer.context.policies import make_policy
    from stayer.models.caching import provider_of

    parts: dict[str, str] = {}
    for item in filter(None, (p.strip() for p in spec.split(","))):
        key, sep, value = item.partition("=")
        if not sep or key not in ("model", "policy", "max_context") or not value:
            raise ConfigError(
                f"--what-if {spec!r}: expected model=ID,policy=P[,max_context=N] "
                "(e.g. model=claude-haiku-4-5,policy=auto)"
            )
        parts[key] = value
    if not parts:
        raise ConfigError(f"--what-if {spec!r}: give model=ID and/or policy=P")
    model = parts.get("model")
    if model is not None:
        model = model.split(":", 1)[1] if model.startswith("sim:") else model
        try:
            provider_of(model)
        except ConfigError:
            raise ConfigError(
                f"--what-if {spec!r}: unknown model family {model!r}; use a real model id "
                "such as claude-sonnet-4-5, gpt-5, deepseek-chat or gemini-2.5-flash"
            ) from None
    policy = parts.get("policy", "none")
    try:
        make_policy(policy)
    except ConfigError as e:
        raise ConfigError(f"--what-if {spec!r}: {e}") from None
    max_context = None
    if "max_context" in parts:
        try:
            max_context = int(parts["max_context"])
            check_flags(RunFlags, {"max_context": max_context})
        except ValueError:  # ConfigError included
            raise ConfigError(
                f"--what-if {spec!r}: max_context must be a whole number of tokens, 1 to {MAX_TOKENS:,}"
            ) from None
    return Scenario(model, policy, max_context)


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(
            str(b.get("text", "")) if isinstance(b, dict) else str(b)
            for b in content
            if not isinstance(b, dict)
            or b.get("type") in (None, "text", "input_text", "output_text")
        )
    return ""


def _lines(path: Path) -> Iterator[dict[str, Any]]:
    opened = open_log(path)
    if opened is None:  # gone, or no longer a regular file, since it was audited
        return
    with opened[0] as f:
        for line in f:
            try:
                d = orjson.loads(line)
            except orjson.JSONDecodeError:
                continue
            if isinstance(d, dict):
                yield d


class _Builder:
    """Collects turns and observations in the order the log has them."""

    def __init__(self) -> None:
        self.instruction: list[str] = []
        self.turns: list[tuple[list[str], list[ToolCall]]] = []
        self.observations: dict[str, str] = {}
        self.last_call: str | None = None

    def user_text(self, text: str) -> None:
        if not text:
            return
        if not self.turns:
            self.instruction.append(text)
        elif self.last_call is not None:
            self.observations[self.last_call] = (
                self.observations.get(self.last_call, "") + "\n\n" + text
            )

    def assistant(self, text: str, calls: list[ToolCall], new_turn: bool) -> None:
        if new_turn or not self.turns:
            self.turns.append(([], []))
        texts, have = self.turns[-1]
        if text:
            texts.append(text)
        known = {c.id for c in have}
        have.extend(c for c in calls if c.id not in known)

    def observation(self, call_id: str, text: str) -> None:
        self.observations[call_id] = self.observations.get(call_id, "") + text
        self.last_call = call_id

    def messages(self) -> list[Message]:
        return [Message("assistant", "\n".join(t), tuple(c)) for t, c in self.turns if c]


def _claude_code(path: Path) -> _Builder:
    b = _Builder()
    current: str | None = None
    for d in _lines(path):
        if d.get("isSidechain") is True or d.get("type") not in ("user", "assistant"):
            continue
        msg = d.get("message")
        if not isinstance(msg, dict):
            continue
        content = msg.get("content")
        if d["type"] == "assistant":
            if msg.get("model") == "<synthetic>":
                continue
            blocks = content if isinstance(content, list) else []
            calls = [
                ToolCall(str(x.get("id")), str(x.get("name")), json.dumps(x.get("input") or {}))
                for x in blocks
                if isinstance(x, dict) and x.get("type") == "tool_use"
            ]
            mid = msg.get("id")
            b.assistant(_text(blocks), calls, new_turn=mid != current)
            current = mid
        elif isinstance(content, list) and any(
            isinstance(x, dict) and x.get("type") == "tool_result" for x in content
        ):
            for x in content:
                if isinstance(x, dict) and x.get("type") == "tool_result":
                    b.observation(str(x.get("tool_use_id")), _text(x.get("content")))
        elif not d.get("isMeta"):
            b.user_text(_text(content))
            current = None
    return b


def _codex(path: Path) -> _Builder:
    b = _Builder()
    in_turn = False
    for d in _lines(path):
        p = d.get("payload")
        if d.get("type") != "response_item" or not isinstance(p, dict):
            continue
        kind = p.get("type")
        if kind == "message" and p.get("role") == "user":
            b.user_text(_text(p.get("content")))
            in_turn = False
        elif kind == "message" and p.get("role") == "assistant":
            b.assistant(_text(p.get("content")), [], new_turn=not in_turn)
            in_turn = True
        elif kind in ("function_call", "custom_tool_call", "local_shell_call"):
            call_id = str(p.get("call_id") or p.get("id"))
            args = p.get("arguments") or p.get("input") or json.dumps(p.get("action") or {})
            b.assistant(
                "",
                [ToolCall(call_id, str(p.get("name") or "shell"), str(args))],
                new_turn=not in_turn,
            )
            in_turn = True
        elif kind in ("function_call_output", "custom_tool_call_output", "local_shell_call_output"):
            out = p.get("output")
            b.observation(str(p.get("call_id")), out if isinstance(out, str) else json.dumps(out))
            in_turn = False
    return b


def session_trace(report: SessionReport, ref: SessionRef, counter: Any) -> Any:
    """The engine's ``Trace`` for one audited session (see the module docstring)."""
    from stayer.context.layout import Context
    from stayer.whatif import BASH, Trace, load_trace

    if ref.source == "stayer":
        return load_trace(os.path.dirname(ref.paths[0]))
    if ref.source not in ("claude-code", "codex"):
        raise ConfigError(
            f"session {ref.id}: what-if replays Claude Code, Codex and stayer sessions, "
            f"not {ref.source} logs"
        )
    paths = [Path(p) for p in ref.paths]
    main = next(
        (p for p in paths if not p.stem.startswith("agent-") and p.parent.name != "subagents"),
        None,
    )
    if main is None:
        raise ConfigError(f"session {ref.id}: only sub-agent files; nothing to replay")
    built = _claude_code(main) if ref.source == "claude-code" else _codex(main)
    turns = built.messages()
    if not turns:
        raise ConfigError(f"session {ref.id}: no tool-calling turns to replay")
    names = sorted({c.name for t in turns for c in t.tool_calls})
    from stayer.messages import ToolSpec

    tools = [ToolSpec(n, f"Recorded tool {n}.", {"type": "object"}) for n in names] or [BASH]
    instruction = "\n\n".join(built.instruction)
    pinned = Context("", tools, instruction, counter).tokens
    first = report.first_main_context
    system = _FILLER * max(first - pinned, 0)
    return Trace(f"{ref.source}:{ref.id}", system, instruction, turns, built.observations, tools)


def _main_model(report: SessionReport) -> str:
    main = report.main_models
    return max(main, key=main.__getitem__) if main else next(iter(report.by_model))


def run_what_ifs(
    reports: list[SessionReport],
    refs: dict[tuple[str, str], SessionRef],
    scenarios: list[Scenario],
    book: PriceBook,
) -> list[WhatIfEstimate]:
    """The ``what_if`` entries of the audit document, for the costliest sessions."""
    from stayer.context.policies import make_policy
    from stayer.tokens import MessageCounter, TiktokenCounter
    from stayer.whatif import replay

    counter = MessageCounter(TiktokenCounter())
    out: list[WhatIfEstimate] = []
    ranked = sorted(reports, key=lambda r: r.total.cost_units, reverse=True)[:MAX_SESSIONS]
    for report in ranked:
        ref = refs.get((report.source, report.ref_id))
        main_tally = report.by_chain.get(MAIN_CHAIN)
        actual = money(report.total.cost)
        main = money(main_tally.cost if main_tally else None)
        entry = functools.partial(
            WhatIfEstimate,
            session=report.id,
            actual_cost_usd=actual,
            actual_main_chain_cost_usd=main,
        )

        try:
            if ref is None:
                raise ConfigError(f"session {report.id}: its files are not known")
            trace = session_trace(report, ref, counter)
            own = _main_model(report).removeprefix("sim:")
            if ":" in own:
                own = own.split(":", 1)[1]
            baseline = asyncio.run(
                replay(trace, own, make_policy("none"), prices=book)  # its own tokenizer
            )
        except (ConfigError, ValueError, OSError) as e:
            out += [entry(scenario=s, error=str(e)) for s in scenarios]
            continue
        for s in scenarios:
            try:
                result = asyncio.run(
                    replay(
                        trace,
                        s.model or own,
                        make_policy(s.policy),
                        prices=book,
                        max_context=s.max_context,
                    )
                )
            except (ConfigError, ValueError) as e:
                out.append(entry(scenario=s, baseline_cost_usd=baseline.cost_usd, error=str(e)))
                continue
            out.append(
                entry(
                    scenario=s,
                    baseline_cost_usd=baseline.cost_usd,
                    model=result.model,
                    policy=result.policy,
                    cost_usd=result.cost_usd,
                    requests=result.requests,
                    cache_hit_ratio=result.cache_hit_ratio,
                    peak_context_tokens=result.peak_context_tokens,
                    compactions=result.compactions,
                    note=(
                        "estimate: the recorded actions replayed through the what-if engine; "
                        "baseline_cost_usd is the same replay with the session's own model and no "
                        "policy, so compare cost_usd with it, not with actual_cost_usd"
                        + (
                            ""
                            if ref.source == "stayer"
                            else "; system prompt and tool schemas "
                            "stood in by filler of the first call's size; sub-agent calls not replayed"
                        )
                    ),
                )
            )
    return out

"""What a simulated model does: the ``--sim-policy`` choices.

* ``oracle`` — runs the task's ``solution/solve.sh`` through bash, then submits.
* ``synthetic:steps=N,obs_tokens=T,out_tokens=U`` — N steps of real commands of a known
  shape, for cost experiments; asked to wrap up, it submits a summary.
* ``replay:PATH`` — the assistant turns of a recorded stayer run, in order.
* ``script:FILE`` — a YAML list of turns: ``{text: STR}``, ``{tool: NAME, input: OBJ}``
  (the request's own tool), or a list of such calls; past the end ``Done.``.
* ``echo`` — a short text answer quoting the last user text.
* ``team`` — the entry agent hands the task to the first peer and waits for its report;
  an agent handed work runs the oracle; alone it is ``oracle``.

Each policy in detail: ``docs/internals.md#models-sim-policies``.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from stayer.errors import ConfigError
from stayer.messages import Message, ToolCall
from stayer.models.base import ModelRequest
from stayer.models.sim import SimPolicy
from stayer.settings import MAX_STEPS, read_text
from stayer.tokens import TokenCounter

# Each is one token (with its leading space) in the common BPE vocabularies, so a filler
# of N words is about N tokens.
FILLER_WORDS = [
    "alpha",
    "delta",
    "echo",
    "golf",
    "hotel",
    "india",
    "mike",
    "november",
    "uniform",
    "whiskey",
]


def filler(tokens: int, rng: random.Random) -> str:
    """About ``tokens`` tokens of deterministic text (for synthetic workloads)."""
    return " ".join(rng.choice(FILLER_WORDS) for _ in range(max(tokens, 0)))


def _step(request: ModelRequest) -> int:
    return 1 + sum(1 for m in request.messages if m.role == "assistant")


def _call(step: int, name: str, **args: object) -> ToolCall:
    return ToolCall(id=f"call_{step}_{name}", name=name, arguments=json.dumps(args))


def _submit(step: int, text: str) -> Message:
    return Message(
        role="assistant", content=text, tool_calls=(_call(step, "submit", summary=text),)
    )


def _wrap_up_requested(request: ModelRequest) -> bool:
    """The harness asked for a final summary (``stayer.guard.wrapup``; kind ``wrap_up``)."""
    return any(m.kind == "wrap_up" for m in request.messages)


@dataclass
class OraclePolicy:
    solution: str  # the text of solution/solve.sh

    def next_message(self, request: ModelRequest) -> Message:
        step = _step(request)
        if step == 1:
            delimiter = "STAYER_ORACLE_EOF"
            while delimiter in self.solution:
                delimiter += "_"
            command = f"bash <<'{delimiter}'\n{self.solution.rstrip()}\n{delimiter}"
            return Message(
                role="assistant",
                content="Running the reference solution.",
                tool_calls=(_call(step, "bash", command=command),),
            )
        return _submit(step, "Reference solution applied.")


@dataclass
class TeamPolicy:
    solution: str | None

    def next_message(self, request: ModelRequest) -> Message:
        step = _step(request)
        task = next((m.content for m in request.messages if m.kind == "task"), "")
        tools = {t.name: t for t in request.tools}
        if _wrap_up_requested(request):
            return _submit(step, "Wrapping up: the work so far is in /app.")
        head, _, _ = task.partition("\n")
        if head.startswith(("Handoff from ", "Message from ")):
            return self._worker(step)
        if "handoff" not in tools:
            return OraclePolicy(self.solution or "true").next_message(request)
        peer = sorted(tools["handoff"].parameters["properties"]["to"]["enum"])[0]
        if step == 1:
            return Message(
                role="assistant",
                content=f"Handing the task to {peer}.",
                tool_calls=(_call(step, "handoff", to=peer, brief=task),),
            )
        said = [m.content for m in request.messages if m.role in ("tool", "user")]
        report = next((c for c in said if f"[report {peer}#" in c), None)
        if report is not None:
            return _submit(
                step, f"The team finished. {peer} reported:\n{report.partition(chr(10))[2]}"
            )
        return Message(
            role="assistant",
            content=f"Waiting for {peer}.",
            tool_calls=(_call(step, "wait_for_message", **{"from": peer, "timeout": 600}),),
        )

    def _worker(self, step: int) -> Message:
        if step == 1 and self.solution is not None:
            return OraclePolicy(self.solution).next_message(ModelRequest("", [], []))
        return _submit(step, "Applied the reference solution in /app.")


@dataclass
class SyntheticPolicy:
    steps: int
    obs_tokens: int
    out_tokens: int
    counter: TokenCounter
    seed: int = 0

    def _filler(self, step: int, tokens: int) -> str:
        return filler(tokens, random.Random(self.seed * 100_003 + step))

    def _command(self, step: int) -> str:
        line = f"step {step} record 00000: " + " ".join(FILLER_WORDS)
        per_line = max(self.counter.count(line + "\n"), 1)
        lines = max(self.obs_tokens // per_line, 1)
        words = " ".join(FILLER_WORDS)
        return (
            f'for i in $(seq -w 1 {lines}); do echo "step {step} record $i: {words}"; done'
            # Relative to the working directory, /app: with --sandbox local there is no /app.
            f" | tee -a synthetic.log"
        )

    def next_message(self, request: ModelRequest) -> Message:
        step = _step(request)
        if step > self.steps:
            return _submit(step, "Synthetic workload finished.")
        if _wrap_up_requested(request):
            done = sum(1 for m in request.messages for c in m.tool_calls if c.name == "bash")
            return _submit(
                step,
                f"DONE: {done} of {self.steps} synthetic steps; each appended its records to "
                f"/app/synthetic.log. REMAINING: steps {done + 1} to {self.steps}. STATE: "
                f"/app/synthetic.log holds the records of steps 1 to {done}; nothing else changed.",
            )
        call = _call(step, "bash", command=self._command(step))
        overhead = self.counter.count(f"assistant\n\nbash {call.arguments}") + 4
        return Message(
            role="assistant",
            content=self._filler(step, self.out_tokens - overhead),
            tool_calls=(call,),
        )


@dataclass
class ReplayPolicy:
    turns: list[Message]

    @classmethod
    def load(cls, path: Path) -> ReplayPolicy:
        file = path / "trajectory.jsonl" if path.is_dir() else path
        if not file.is_file():
            raise ConfigError(
                f"--sim-policy replay:{path}: no recorded run there (expected a run directory or its trajectory.jsonl)"
            )
        turns = []
        for n, line in enumerate(read_text(file, "--sim-policy replay:").splitlines(), 1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
                if not isinstance(rec, dict):
                    raise TypeError(f"expected an object, got {type(rec).__name__}")
                if rec.get("role") != "assistant":
                    continue
                calls = tuple(_recorded_call(c) for c in rec.get("tool_calls") or [])
                turns.append(
                    Message(
                        role="assistant", content=str(rec.get("content") or ""), tool_calls=calls
                    )
                )
            except (ValueError, KeyError, TypeError, AttributeError, RecursionError) as e:
                raise ConfigError(f"{file}:{n}: not a stayer trajectory record ({e})") from None
        return cls(turns)

    def next_message(self, request: ModelRequest) -> Message:
        step = _step(request)
        if step <= len(self.turns):
            return self.turns[step - 1]
        return _submit(step, "Replay finished.")


@dataclass(frozen=True)
class ScriptTurn:
    text: str = ""
    calls: tuple[tuple[str, str], ...] = ()  # (tool name, JSON arguments)


_SEARCH = "toolu_sim_search_"  # the ids of the searches a script's policy adds


class ScriptError(ConfigError):
    """A script's turn that this request cannot be answered with (a tool it does not offer)."""


@dataclass
class ScriptPolicy:
    turns: list[ScriptTurn]
    source: str = "script"

    @classmethod
    def load(cls, path: Path) -> ScriptPolicy:
        import yaml

        what = "--sim-policy script:"
        try:
            data = yaml.safe_load(read_text(path, what))
        except yaml.YAMLError as e:
            raise ConfigError(f"{what}{path}: not YAML ({str(e).splitlines()[0]})") from None
        if not isinstance(data, list) or not data:
            raise ConfigError(f"{what}{path}: expected a non-empty list of turns")
        return cls(
            [_script_turn(item, f"{path}: turn {n}") for n, item in enumerate(data, 1)], str(path)
        )

    def next_message(self, request: ModelRequest) -> Message:
        searched = [
            m
            for m in request.messages
            if m.role == "assistant" and m.tool_calls and m.tool_calls[0].id.startswith(_SEARCH)
        ]
        step = _step(request) - len(searched)
        if step > len(self.turns):
            return Message(role="assistant", content="Done.")
        turn = self.turns[step - 1]
        offered = {t.name for t in request.tools}
        hidden = [n for n, _ in turn.calls if n not in offered]
        if hidden and "tool_search" in offered:
            # Lazy MCP tools: search for the tools first (a turn of its own), then call
            # them through tool_search, as a model that reads its description would.
            last = next((m for m in reversed(request.messages) if m.role == "assistant"), None)
            if (
                last is None
                or not last.tool_calls
                or not last.tool_calls[0].id.startswith(f"{_SEARCH}{step}_")
            ):
                return Message(
                    role="assistant",
                    content="",
                    tool_calls=tuple(
                        ToolCall(f"{_SEARCH}{step}_{k}", "tool_search", json.dumps({"query": n}))
                        for k, n in enumerate(hidden)
                    ),
                )
            turn = ScriptTurn(
                turn.text,
                tuple(
                    (n, a)
                    if n in offered
                    else ("tool_search", json.dumps({"call": n, "arguments": json.loads(a)}))
                    for n, a in turn.calls
                ),
            )
        for name, _ in turn.calls:
            if name not in offered:
                raise ScriptError(
                    f"{self.source}: turn {step} calls tool {name!r}, which the request does "
                    f"not offer (it offers: {', '.join(sorted(offered)) or 'no tools'})"
                )
        calls = tuple(
            ToolCall(id=f"toolu_sim_{step}_{k}", name=name, arguments=args)
            for k, (name, args) in enumerate(turn.calls)
        )
        return Message(role="assistant", content=turn.text, tool_calls=calls)


def _script_call(item: object, where: str) -> tuple[str, str]:
    if not isinstance(item, dict) or set(item) - {"tool", "input"} or "tool" not in item:
        raise ConfigError(f"{where}: a tool call is {{tool: NAME, input: OBJECT}}")
    name, args = item["tool"], item.get("input", {})
    if not isinstance(name, str) or not name:
        raise ConfigError(f"{where}: tool must be a tool's name")
    if not isinstance(args, dict):
        raise ConfigError(f"{where}: input must be an object (the tool's arguments)")
    return name, json.dumps(args, ensure_ascii=False)


def _script_turn(item: object, where: str) -> ScriptTurn:
    if isinstance(item, list):
        if not item:
            raise ConfigError(f"{where}: a list of tool calls must not be empty")
        return ScriptTurn(calls=tuple(_script_call(c, where) for c in item))
    if isinstance(item, dict) and "tool" in item:
        return ScriptTurn(calls=(_script_call(item, where),))
    if isinstance(item, dict) and set(item) == {"text"} and isinstance(item["text"], str):
        return ScriptTurn(text=item["text"])
    raise ConfigError(
        f"{where}: expected {{text: STR}}, {{tool: NAME, input: OBJECT}} or a list of tool calls"
    )


@dataclass
class EchoPolicy:
    def next_message(self, request: ModelRequest) -> Message:
        said = next((m.content for m in reversed(request.messages) if m.role == "user"), "")
        said = " ".join(said.split())
        return Message(role="assistant", content=f"echo: {said[:200]}" if said else "echo")


# One synthetic observation or reply is at most a million tokens: beyond any context window.
_SYNTHETIC_MAX = {
    "steps": MAX_STEPS,
    "obs_tokens": 1_000_000,
    "out_tokens": 1_000_000,
    "seed": 2**63,
}


def _recorded_call(c: dict[str, Any]) -> ToolCall:
    args = c["arguments"]
    return ToolCall(
        str(c["id"]), str(c["name"]), args if isinstance(args, str) else json.dumps(args)
    )


def parse_policy(spec: str | None, *, solution: str | None, counter: TokenCounter) -> SimPolicy:
    """Build a policy from a ``--sim-policy`` spec; the default is ``oracle`` when the task
    has a solution."""
    if spec is None:
        if solution is None:
            raise ConfigError(
                "--sim-policy: the task has no solution/solve.sh, so there is no oracle; "
                "pass --sim-policy synthetic:steps=N,obs_tokens=T,out_tokens=U or replay:PATH"
            )
        spec = "oracle"
    name, _, arg = spec.partition(":")
    if name == "oracle":
        if solution is None:
            raise ConfigError("--sim-policy oracle: the task has no solution/solve.sh")
        return OraclePolicy(solution)
    if name == "team":
        return TeamPolicy(solution)
    if name == "synthetic":
        allowed = {"steps", "obs_tokens", "out_tokens", "seed"}
        values: dict[str, int] = {"steps": 10, "obs_tokens": 1000, "out_tokens": 200, "seed": 0}
        for part in filter(None, arg.split(",")):
            key, eq, val = part.partition("=")
            if key not in allowed or not eq:
                raise ConfigError(
                    f"--sim-policy {spec}: unknown or malformed {part!r}; "
                    "expected synthetic:steps=N,obs_tokens=T,out_tokens=U"
                )
            try:
                values[key] = int(val)
            except ValueError:
                raise ConfigError(
                    f"--sim-policy {spec}: {key} must be an integer, got {val!r}"
                ) from None
            if values[key] < 0 or (key == "steps" and values[key] < 1):
                raise ConfigError(f"--sim-policy {spec}: {key} must be positive")
            if values[key] > _SYNTHETIC_MAX[key]:
                raise ConfigError(
                    f"--sim-policy {spec}: {key} must be at most {_SYNTHETIC_MAX[key]:,}"
                )
        return SyntheticPolicy(
            values["steps"], values["obs_tokens"], values["out_tokens"], counter, values["seed"]
        )
    if name == "replay":
        if not arg:
            raise ConfigError("--sim-policy replay:PATH needs the path of a recorded run")
        return ReplayPolicy.load(Path(arg))
    if name == "script":
        if not arg:
            raise ConfigError("--sim-policy script:FILE needs the path of a YAML script")
        return ScriptPolicy.load(Path(arg))
    if name == "echo" and not arg:
        return EchoPolicy()
    raise ConfigError(
        f"--sim-policy {spec}: unknown policy {name!r}; use oracle, team, "
        "synthetic:steps=N,obs_tokens=T,out_tokens=U, replay:PATH, script:FILE or echo"
    )

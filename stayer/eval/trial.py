"""One task, one model, one run: workspace → agent → verifier → result.

Everything the run needs is validated before the first byte is written, so bad input
leaves nothing behind. The run's files live in ``$STAYER_HOME/runs/<run_id>/``:
``workspace/`` (mounted at /app), ``trajectory.jsonl`` (every message, replayable with
``--sim-policy replay:PATH``) and ``result.json`` (the ``--json`` document).
"""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

from stayer.agent import SYSTEM_PROMPT, Agent, LedgerEntry, Limits, RunResult
from stayer.context.layout import Context, MessageCounter
from stayer.context.policies import ContextPolicy, make_policy
from stayer.context.tokens import TiktokenCounter
from stayer.errors import ConfigError
from stayer.eval.task import Task, load_task
from stayer.eval.verify import verify
from stayer.models.base import Message, Model
from stayer.models.registry import make_real_model, split_spec
from stayer.models.sim import SimModel
from stayer.models.sim_policies import parse_policy
from stayer.pricing import PriceBook
from stayer.sandbox import KINDS as SANDBOX_KINDS
from stayer.sandbox import make_sandbox
from stayer.sandbox.bwrap import check_bwrap
from stayer.tools import default_tools
from stayer.tools.base import ToolContext


def stayer_home() -> Path:
    return Path(os.environ.get("STAYER_HOME") or ".stayer")


@dataclass(frozen=True)
class RunConfig:
    task_dir: str
    model: str
    max_steps: int = 50
    max_cost: Decimal | None = None
    run_id: str | None = None
    base_url: str | None = None
    sim_policy: str | None = None
    sim_latency: float = 0.0
    sandbox: str = "bwrap"
    output_token_budget: int = 4096
    command_timeout: float = 120.0
    service_tier: str | None = None
    policy: str = "auto"
    max_context: int | None = None


@dataclass
class PreparedRun:
    config: RunConfig
    task: Task
    model: Model
    counter: MessageCounter
    prices: PriceBook
    run_id: str
    run_dir: Path
    policy: ContextPolicy


def prepare(config: RunConfig, prices: PriceBook | None = None) -> PreparedRun:
    """Validate the whole run; raises ConfigError and writes nothing on bad input."""
    if config.max_steps < 1:
        raise ConfigError(f"--max-steps {config.max_steps}: must be at least 1")
    if config.max_cost is not None and config.max_cost <= 0:
        raise ConfigError(f"--max-cost {config.max_cost}: must be a positive amount in USD")
    if config.sim_latency < 0:
        raise ConfigError(f"--sim-latency {config.sim_latency}: must be zero or more seconds")
    if config.sandbox not in SANDBOX_KINDS:
        raise ConfigError(f"--sandbox {config.sandbox}: unknown sandbox; choose one of {', '.join(SANDBOX_KINDS)}")
    if config.sandbox == "bwrap":
        check_bwrap()  # fails with how-to-fix before anything is written
    if config.max_context is not None and config.max_context < 1:
        raise ConfigError(f"--max-context {config.max_context}: must be a positive number of tokens")
    policy = make_policy(config.policy)
    task = load_task(config.task_dir)
    prices = prices or PriceBook.load()
    counter = MessageCounter(TiktokenCounter())
    kind, model_id = split_spec(config.model)
    model: Model
    if kind == "sim":
        if config.base_url:
            raise ConfigError("--base-url: only meaningful for openai-chat: models")
        behaviour = parse_policy(config.sim_policy, solution=task.solution, counter=counter.counter)
        model = SimModel(model_id, behaviour, counter, latency_s=config.sim_latency)
    else:
        if config.sim_policy:
            raise ConfigError(f"--sim-policy: only meaningful for sim: models, not {config.model}")
        model = make_real_model(config.model, base_url=config.base_url)
    if config.max_cost is not None and not prices.knows(model.model_id, model.provider):
        raise ConfigError(
            f"--max-cost: no price data for {config.model}, so a cost cap cannot be enforced; "
            "add its prices to stayer-prices.toml or drop --max-cost"
        )
    run_id = config.run_id or datetime.now(UTC).strftime("%Y%m%d-%H%M%S-") + uuid.uuid4().hex[:6]
    if not run_id.replace("-", "").replace("_", "").replace(".", "").isalnum():
        raise ConfigError(f"--run-id {run_id!r}: use letters, digits, '-', '_' and '.' only")
    if config.max_context is not None:
        pinned = pinned_tokens(task.instruction, counter)
        if config.max_context <= pinned:
            raise ConfigError(
                f"--max-context {config.max_context}: below the pinned prefix (system prompt, tools, "
                f"task) of {pinned:,} tokens"
            )
    run_dir = stayer_home() / "runs" / run_id
    if run_dir.exists():
        raise ConfigError(f"--run-id {run_id}: a run with this id already exists in {run_dir}")
    return PreparedRun(config, task, model, counter, prices, run_id, run_dir, policy)


def pinned_tokens(instruction: str, counter: MessageCounter) -> int:
    """Tokens of the stable prefix a run starts with: system prompt, tool schemas, task."""
    tools = [t.spec for t in default_tools(counter.counter)]
    return Context(SYSTEM_PROMPT, tools, instruction, counter).tokens


async def execute(
    prepared: PreparedRun,
    on_step: Callable[[LedgerEntry], None] | None = None,
) -> dict[str, Any]:
    """Run the agent on the task, verify, and return the ``--json`` result document."""
    p, cfg, task = prepared, prepared.config, prepared.task
    workspace = p.run_dir / "workspace"
    p.run_dir.mkdir(parents=True)
    started = datetime.now(UTC)
    # An interrupted run keeps its workspace and trajectory for inspection.
    task.materialise(workspace)
    agent_sandbox = make_sandbox(
        cfg.sandbox, workspace, allow_net=task.allow_internet, memory_mb=task.memory_mb
    )
    tool_ctx = ToolContext(
        sandbox=agent_sandbox,
        workspace=str(workspace),
        output_token_budget=cfg.output_token_budget,
        command_timeout=cfg.command_timeout,
    )
    with (p.run_dir / "trajectory.jsonl").open("w") as trajectory:

        def record(m: Message) -> None:
            trajectory.write(json.dumps(_message_record(m)) + "\n")
            trajectory.flush()

        agent = Agent(
            p.model,
            default_tools(p.counter.counter),
            p.prices,
            tool_ctx,
            p.counter,
            Limits(cfg.max_steps, cfg.max_cost, service_tier=cfg.service_tier, max_context=cfg.max_context),
            on_step=on_step,
            on_message=record,
            policy=p.policy,
        )
        result = await agent.run(task.instruction, p.run_id)
    verdict = None
    if result.status != "error":
        verifier_sandbox = make_sandbox(cfg.sandbox, workspace, allow_net=task.allow_internet)
        verdict = await verify(task, verifier_sandbox)
    doc = result_document(p, result, verdict, started)
    tmp = p.run_dir / "result.json.tmp"
    tmp.write_text(json.dumps(doc, indent=2))
    tmp.replace(p.run_dir / "result.json")
    return doc


def _message_record(m: Message) -> dict[str, Any]:
    rec: dict[str, Any] = {"role": m.role, "content": m.content}
    if m.tool_calls:
        rec["tool_calls"] = [{"id": c.id, "name": c.name, "arguments": c.arguments} for c in m.tool_calls]
    if m.tool_call_id:
        rec["tool_call_id"] = m.tool_call_id
    if m.is_error:
        rec["is_error"] = True
    if m.kind:
        rec["kind"] = m.kind
    return rec


def status_of(result: RunResult, reward: float | None) -> str:
    if result.status in ("error", "budget_exhausted"):
        return result.status
    return "succeeded" if reward is not None and reward >= 1 else "failed"


def result_document(p: PreparedRun, result: RunResult, verdict: Any, started: datetime) -> dict[str, Any]:
    u = result.usage
    reward = verdict.reward if verdict else None
    doc: dict[str, Any] = {
        "run_id": p.run_id,
        "task": p.task.name,
        "task_path": str(p.task.path),
        "model": p.config.model,
        "status": status_of(result, reward),
        "reward": reward,
        "steps": result.steps,
        "usage": {
            "input_tokens": u.input_tokens,
            "cache_read_tokens": u.cache_read_tokens,
            "cache_write_tokens": u.cache_write_tokens,
            "cache_write_5m_tokens": u.cache_write_5m_tokens,
            "cache_write_1h_tokens": u.cache_write_1h_tokens,
            "output_tokens": u.output_tokens,
            "reasoning_tokens": u.reasoning_tokens,
        },
        "cost_usd": "unknown" if result.cost_usd is None else str(result.cost_usd),
        "stop_reason": result.stop_reason,
        "policy": p.config.policy,
        "peak_context_tokens": result.peak_context_tokens,
        "compactions": sum(1 for e in result.ledger if e.compaction),
        "summary": result.summary,
        "error": result.error,
        "ledger": [e.to_dict() for e in result.ledger],
        "started": started.isoformat(),
        "finished": datetime.now(UTC).isoformat(),
        "run_dir": str(p.run_dir),
        "tokenizer": p.counter.counter.encoding_name if hasattr(p.counter.counter, "encoding_name") else None,
    }
    if verdict is not None:
        doc["rewards"] = verdict.rewards
        doc["verifier"] = {
            "exit_code": verdict.exec.exit_code if verdict.exec else None,
            "timed_out": verdict.exec.timed_out if verdict.exec else False,
            "error": verdict.error,
            "output_tail": (verdict.exec.stdout + verdict.exec.stderr)[-2000:] if verdict.exec else "",
        }
    return doc

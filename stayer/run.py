"""One task, one model, one run: workspace → agent → verifier → result (``stayer run``,
``stayer resume``, each eval trial and each run of the hosted service).

Everything the run needs is validated before the first byte is written, so bad input
leaves nothing behind. The run's files live in ``$STAYER_HOME/runs/<run_id>/``:
``workspace/`` (mounted at /app), ``trajectory.jsonl`` (every message, replayable with
``--sim-policy replay:PATH``) and ``result.json`` (the ``--json`` document). Every step is
journaled (``stayer.journal``), so ``execute`` can also continue a run that was killed.
``execute`` is also the one place that enforces the task's agent time limit, for ``stayer
run``, ``resume`` and every eval trial (the limit counts from the start of each process).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import os
import secrets
import sys
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any, Protocol

from stayer.agent import SYSTEM_PROMPT, Agent, LedgerEntry, Limits, RunResult
from stayer.context.layout import Context
from stayer.context.policies import ContextPolicy, make_policy
from stayer.context.summarizer import ModelSummarizer
from stayer.delegation import ChildAgents, ChildSettings
from stayer.environments.prepare import prepare_environment
from stayer.errors import ConfigError
from stayer.eval.task import Task, load_task
from stayer.eval.verify import Verdict, passes, verify
from stayer.guard.attribution import per_agent
from stayer.guard.breakers import GuardConfig, TreeFingerprint
from stayer.guard.budget import Budget
from stayer.journal import RunJournal, Store, lost_ledger_entries, open_store
from stayer.journal.backends import stayer_home
from stayer.journal.codec import message_record
from stayer.journal.replay import JournaledModel, JournaledProbe, JournaledTool, ReplayingSandbox
from stayer.journal.snapshot import clear_workspace
from stayer.ledger import ledger_order
from stayer.messages import Message
from stayer.models.base import Model
from stayer.models.caching import provider_of
from stayer.models.registry import known_sim_model, make_real_model, split_spec
from stayer.models.sim import SimModel
from stayer.models.sim_policies import parse_policy
from stayer.money import Usd
from stayer.paths import workspaces_root
from stayer.pricing import PriceBook
from stayer.records import to_json
from stayer.routing.setup import RoutingSetup, prepare_routing, require_prices
from stayer.run_config import RunConfig
from stayer.sandbox import IMAGE_KINDS, released
from stayer.sandbox import KINDS as SANDBOX_KINDS
from stayer.sandbox.bwrap import check_bwrap
from stayer.settings import RunSettings, check_flags
from stayer.teams.config import TeamSpec, load_team, team_from
from stayer.teams.runner import Team, TeamServices
from stayer.tokens import Counters, MessageCounter, TiktokenCounter
from stayer.tools import default_tools
from stayer.tools.base import Tool, ToolContext


def make_run_dir(run_dir: Path, *, exist_ok: bool) -> None:
    """Create ``run_dir``, and whatever is missing above it, private to its owner (0700).

    The workspace inside holds whatever the sandbox wrote, trajectories hold the task and
    the model's words: no other local user has business there. A run directory that
    exists (a resumed run, maybe made before this rule) is made private too; existing
    directories above it belong to the user and keep their mode."""
    for d in reversed(run_dir.parents):  # top down
        if not d.exists():
            d.mkdir(mode=0o700, exist_ok=True)  # another run may create it at the same time
    run_dir.mkdir(mode=0o700, exist_ok=exist_ok)
    os.chmod(run_dir, 0o700)  # mkdir's mode went through the umask


def new_workspace() -> Path:
    """A fresh, empty directory for a run's workspace, under :func:`workspaces_root`: the
    sandbox mounts it at /app, and its path (shown in /proc/self/mountinfo) names nothing
    of the host; the run directory's ``workspace`` links to it (:func:`link_workspace`)."""
    workspace = workspaces_root() / secrets.token_hex(12)
    workspace.mkdir(mode=0o700)
    return workspace


def link_workspace(run_dir: Path, workspace: Path) -> None:
    """``run_dir/workspace``: a link to ``workspace``, for people and tools to find it."""
    (run_dir / "workspace").symlink_to(workspace, target_is_directory=True)


def run_workspace(run_dir: Path) -> Path:
    """The workspace of the run in ``run_dir`` (made private if missing), for a resume:
    where its link points (made again if gone: the journal's snapshot restores it), a new
    one if there is no link, or ``run_dir/workspace`` itself for a run made before
    workspaces moved out of run directories."""
    make_run_dir(run_dir, exist_ok=True)
    link = run_dir / "workspace"
    if link.is_symlink():
        target = Path(os.readlink(link))
        if target.parent == workspaces_root() and target.name.isalnum():
            with contextlib.suppress(FileExistsError):
                target.mkdir(mode=0o700)
            if target.is_dir() and not target.is_symlink():
                return target
        link.unlink()  # not one of ours: never followed
    elif link.is_dir():
        return link
    workspace = new_workspace()
    link_workspace(run_dir, workspace)
    return workspace


def delete_run_dir(run_dir: Path) -> None:
    """Remove ``run_dir`` and the workspace its link points to (under
    :func:`workspaces_root`; a link elsewhere is removed, never followed), everything in
    them, read-only directories included."""
    link = run_dir / "workspace"
    if link.is_symlink():
        target = Path(os.readlink(link))
        ours = target.parent == workspaces_root() and target.name.isalnum()
        if ours and target.is_dir() and not target.is_symlink():
            clear_workspace(target)
            target.rmdir()
    clear_workspace(run_dir)
    run_dir.rmdir()


def _progress(line: str) -> None:
    """Building an image takes minutes: say what is happening (stderr, never stdout)."""
    print(line, file=sys.stderr, flush=True)


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
    store: Store | None = None  # where the run is journaled
    close_store: bool = False  # opened by prepare(), so execute() closes it
    routing: RoutingSetup | None = None  # from --config
    team: TeamSpec | None = None  # from --team
    team_models: dict[str, Model] = dataclasses.field(default_factory=dict)  # per agent of the team
    # The journal lease a new run is created under (a worker's claim): owner id and TTL.
    lease_owner: str | None = None
    lease_ttl_s: float | None = None
    sandbox_source: str = "default"  # who chose config.sandbox (Task.kind_source)


def prepare(
    config: RunConfig,
    prices: PriceBook | None = None,
    *,
    store: Store | None = None,
    resume: bool = False,
) -> PreparedRun:
    """Validate the whole run; raises ConfigError and writes nothing on bad input.

    ``store`` is the journal to use (default: ``open_store``, opened last, once everything
    else is valid); callers running many runs at once should share one. ``resume`` prepares
    an existing run, for ``execute(..., journal=RunJournal.reopen(…))``."""
    check_flags(RunSettings, {k: getattr(config, k) for k in RunSettings.model_fields})
    if config.sandbox is not None and config.sandbox not in SANDBOX_KINDS:
        raise ConfigError(
            f"--sandbox {config.sandbox}: unknown sandbox; choose one of {', '.join(SANDBOX_KINDS)}"
        )
    policy = make_policy(config.policy)
    task = load_task(config.task_dir)
    chosen_by = task.kind_source(config.sandbox)
    config = replace(config, sandbox=task.kind(config.sandbox))
    try:
        if config.sandbox in ("bwrap", "bwrap-image"):
            check_bwrap()  # fails with how-to-fix before anything is written
        if config.sandbox in IMAGE_KINDS:
            # Built now (or found in the cache): a Dockerfile that cannot be built is bad
            # input, reported before anything is written.
            environment = prepare_environment(
                config.sandbox, task.path / "environment", log=_progress
            )
            for note in environment.notes:
                _progress(f"note: {note}")
    except ConfigError as e:
        if chosen_by != "the task's Dockerfile":
            raise
        # Never silently on the host's system: the task said what it needs.
        why = str(e) if config.sandbox == "docker" else f"no Docker daemon answers; without: {e}"
        raise ConfigError(
            f"{task.dockerfile}: the task runs in its image, which cannot be built here "
            f"({why}); pass --sandbox bwrap to run it on the host's system instead"
        ) from None
    prices = prices or PriceBook.load()
    counters = Counters()  # each model counts with its own tokenizer, simulated or real
    team, team_models = None, {}
    if config.team_file or config.team is not None:
        team = (
            load_team(config.team_file)
            if config.team_file
            else team_from(config.team or {}, "team")
        )
        config = dataclasses.replace(config, model=config.model or team.agents[team.entry].model)
        team_models = team_models_for(team, config, task, counters, prices)
    elif not config.model:
        raise ConfigError(
            "--model: missing; name a model (e.g. sim:claude-sonnet-4-5), or a team with --team"
        )
    model = model_for(config.model, config, task, counters, prices)
    counter = counters.for_model(model.provider, model.model_id)
    routing = prepare_routing(
        config.config_file, config.model, lambda spec: build_model(spec, config, task, counters)
    )
    if config.max_cost is not None:
        require_prices(prices, model, config.service_tier, routing)
        for m in team_models.values():
            require_prices(prices, m, config.service_tier, None)
    run_id = config.run_id or datetime.now(UTC).strftime("%Y%m%d-%H%M%S-") + uuid.uuid4().hex[:6]
    if config.max_context is not None:
        pinned = pinned_tokens(task.instruction, counter)
        if config.max_context <= pinned:
            raise ConfigError(
                f"--max-context {config.max_context}: below the pinned prefix (system prompt, tools, "
                f"task) of {pinned:,} tokens"
            )
    run_dir = stayer_home() / "runs" / run_id
    if run_dir.exists() and not resume:
        raise ConfigError(f"--run-id {run_id}: a run with this id already exists in {run_dir}")
    opened = store is None
    store = store or open_store(stayer_home())
    assert store is not None
    if not resume and store.run(run_id) is not None:
        raise ConfigError(
            f"--run-id {run_id}: a run with this id already exists in {store.location}"
        )
    return PreparedRun(
        config,
        task,
        model,
        counter,
        prices,
        run_id,
        run_dir,
        policy,
        store,
        opened,
        routing,
        team,
        team_models,
        sandbox_source=chosen_by,
    )


def team_models_for(
    team: TeamSpec, config: RunConfig, task: Task, counters: Counters, prices: PriceBook
) -> dict[str, Model]:
    """Each agent's model, its own instance (a simulator keeps its own cache); simulated
    agents play ``--sim-policy`` (default ``team``)."""
    config = dataclasses.replace(config, sim_policy=config.sim_policy or "team")
    models = {}
    for name, agent in team.agents.items():
        try:
            models[name] = model_for(agent.model, config, task, counters, prices)
        except ConfigError as e:
            raise ConfigError(f"{config.team_file or 'team'}: agents.{name}.model: {e}") from None
    return models


def model_for(
    spec: str, config: RunConfig, task: Task, counters: Counters, prices: PriceBook
) -> Model:
    """``build_model``, refusing a ``sim:`` model that no price data knows (``check_model``)."""
    check_model(spec, prices)
    return build_model(spec, config, task, counters)


def priced_as(spec: str) -> tuple[str, str]:
    """The (provider, model id) that prices the model ``spec`` (with no ``--base-url``),
    found without building its adapter, so without the provider's API key."""
    kind, model_id = split_spec(spec)
    if kind == "sim":
        return provider_of(model_id), model_id
    if kind == "openai-chat":
        from stayer.models.openai import default_provider  # (the SDK: imported when needed)

        return default_provider(None), model_id
    return kind, model_id


def check_model(
    spec: str, prices: PriceBook, *, cap: str | None = None, field: str = "--model"
) -> None:
    """What a run refuses of its model before it starts, without building the model (the
    API checks requests with it): a malformed spec; a ``sim:`` model no price data knows
    (a typo such as ``sim:claude-sonet-4-5`` far more often than a model; it would be
    priced "unknown"); and, under the cost cap ``cap`` names, a model whose calls cannot be
    priced (``require_prices``). ConfigError's line starts with ``field`` and the spec."""
    try:
        provider, model_id = priced_as(spec)
    except ConfigError as e:
        raise ConfigError(f"{field} {str(e).removeprefix('--model ')}") from None
    if spec.startswith("sim:"):
        try:
            known_sim_model(model_id, prices)
        except ConfigError as e:
            raise ConfigError(f"{field} {str(e).removeprefix('--model ')}") from None
    if cap is not None and not prices.knows(model_id, provider):
        raise ConfigError(
            f"{field} {spec}: no price data for it, so {cap} cannot be enforced; "
            "add its prices to stayer-prices.toml or run it without a cap"
        )


def check_policies(
    policy: str, sim_policy: str | None, model: str, solution: str | None, *, api: bool = False
) -> None:
    """What a run refuses of its context policy and simulator policy before it starts
    (``make_policy``, ``build_model``'s ``parse_policy``), checked without building the
    run. ``api``: the ConfigError's line names the request's fields, not the flags."""

    def named(e: ConfigError, flag: str, field: str) -> ConfigError:
        if not api:
            return e
        rest = str(e).removeprefix(flag).lstrip(": ").replace(flag, field)
        return ConfigError(f"{field}: {rest}")

    try:
        make_policy(policy)
    except ConfigError as e:
        raise named(e, "--policy", "policy") from None
    if not model.startswith("sim:"):
        if sim_policy:
            raise named(
                ConfigError(f"--sim-policy: only meaningful for sim: models, not {model}"),
                "--sim-policy",
                "sim_policy",
            )
        return
    try:
        parse_policy(sim_policy, solution=solution, counter=TiktokenCounter())
    except ConfigError as e:
        raise named(e, "--sim-policy", "sim_policy") from None


def build_model(spec: str, config: RunConfig, task: Task, counters: Counters) -> Model:
    """The model ``spec`` names: a simulator playing ``--sim-policy``, or a real adapter.
    A simulator counts with its model's own tokenizer, as a real call is counted."""
    kind, model_id = split_spec(spec)
    if kind == "sim":
        if config.base_url:
            raise ConfigError("--base-url: only meaningful for openai-chat: models")
        counter = counters.for_model(provider_of(model_id), model_id)
        behaviour = parse_policy(config.sim_policy, solution=task.solution, counter=counter.counter)
        return SimModel(model_id, behaviour, counter, latency_s=config.sim_latency)
    if config.sim_policy:
        raise ConfigError(f"--sim-policy: only meaningful for sim: models, not {spec}")
    return make_real_model(spec, base_url=config.base_url)


def stop_detail(reason: str | None, breakers: list[dict[str, Any]]) -> str | None:
    """Why the run stopped, in the words of the limit or breaker that stopped it (the last
    trip of the stop reason: the one that began the wrap-up, or that ended the run)."""
    trip = next((b for b in reversed(breakers) if b.get("reason") == reason), None)
    return None if trip is None else str(trip.get("detail") or "") or None


def run_header(p: PreparedRun) -> dict[str, Any]:
    """What the journal records about a run up front: enough to prepare it again."""
    config = p.config.to_record()
    # Paths made absolute, so that a resume from another directory finds the same files.
    config["task_dir"] = str(Path(p.config.task_dir).resolve())
    if p.config.team_file:
        config["team_file"] = str(Path(p.config.team_file).resolve())
    if p.config.config_file:
        config["config_file"] = str(Path(p.config.config_file).resolve())
    if p.config.sim_policy and p.config.sim_policy.startswith("replay:"):
        config["sim_policy"] = "replay:" + str(
            Path(p.config.sim_policy.removeprefix("replay:")).resolve()
        )
    config["run_id"] = p.run_id
    return {
        "task": p.task.name,
        "task_path": str(p.task.path),
        "model": p.config.model,
        "config": config,
    }


def pinned_tokens(instruction: str, counter: MessageCounter) -> int:
    """Tokens of the stable prefix a run starts with: system prompt, tool schemas, task."""
    tools = [t.spec for t in default_tools(counter.counter)]
    return Context(SYSTEM_PROMPT, tools, instruction, counter).tokens


async def execute(
    prepared: PreparedRun,
    on_step: Callable[[LedgerEntry], None] | None = None,
    *,
    journal: RunJournal | None = None,
    controls: Controls | None = None,
) -> dict[str, Any]:
    """Run the agent on the task, verify, and return the ``--json`` result document.

    With ``journal`` (``RunJournal.reopen``), continue that run instead: the workspace comes
    back from its latest snapshot and the loop replays the journal up to where it stopped.
    ``controls``: what the runtime adds (people in the loop, pausing at the cap)."""
    try:
        return await _execute(prepared, on_step, journal, controls or Controls())
    finally:
        if prepared.close_store and prepared.store is not None:
            prepared.store.close()


async def _execute(
    p: PreparedRun,
    on_step: Callable[[LedgerEntry], None] | None,
    journal: RunJournal | None,
    controls: Controls,
) -> dict[str, Any]:
    cfg, task = p.config, p.task
    sandbox_kind = task.kind(cfg.sandbox)  # prepare() resolved it already: the same kind
    if journal is None:
        assert p.store is not None
        workspace = new_workspace()
        lease: dict[str, Any] = {"owner": p.lease_owner}
        if p.lease_ttl_s is not None:
            lease["ttl_s"] = p.lease_ttl_s
        journal = RunJournal.create(p.store, p.run_id, run_header(p), workspace, p.prices, **lease)
        make_run_dir(p.run_dir, exist_ok=False)
        link_workspace(p.run_dir, workspace)
        task.materialise(workspace, sandbox_kind)
        journal.take_snapshot(0)
    else:
        make_run_dir(p.run_dir, exist_ok=True)
        journal.restore_workspace(lambda ws: task.materialise(ws, sandbox_kind))
    workspace = journal.workspace
    started = datetime.fromisoformat(journal.started)
    agent_sandbox = ReplayingSandbox(
        task.make_sandbox(
            sandbox_kind, workspace, **task.sandbox_limits(**cfg.sandbox_overrides())
        ),
        journal,
    )
    tool_ctx = ToolContext(
        sandbox=agent_sandbox,
        workspace=str(workspace),
        output_token_budget=cfg.output_token_budget,
        command_timeout=cfg.command_timeout,
    )
    # Rewritten from the start on resume: the replay emits every message again. The agent's
    # sandbox is gone, every process of it, when the loop ends (paused at its cap too), and
    # so before the verifier's sandbox starts.
    async with journal.leased(), released(agent_sandbox):
        with (p.run_dir / "trajectory.jsonl").open("w") as trajectory:

            def record(m: Message) -> None:
                trajectory.write(json.dumps(message_record(m)) + "\n")
                trajectory.flush()

            def step_done(entry: LedgerEntry) -> None:
                journal.on_step(entry)  # journaled first, then shown
                shown(entry)

            def shown(entry: LedgerEntry) -> None:
                for o in controls.observers:
                    o.on_step(entry)
                if on_step is not None:
                    on_step(entry)

            def on_event(kind: str, payload: dict[str, Any]) -> None:
                journal.on_event(kind, payload)
                for o in controls.observers:
                    o.on_event(kind, payload)

            def wrap_model(m: Model) -> Model:
                # Observers inside the journal: they see live calls, never replayed ones.
                for o in controls.observers:
                    m = o.model(m)
                return JournaledModel(m, journal)

            def wrap_tools(ts: list[Tool]) -> list[Tool]:
                for o in controls.observers:
                    ts = o.tools(ts)
                return [JournaledTool(t, journal) for t in ts]

            model = wrap_model(p.model)  # every call journaled, the summariser's included
            routing = p.routing
            router = (
                routing.router(model, wrap_model, p.prices, cfg.service_tier) if routing else None
            )
            tools = wrap_tools(default_tools(p.counter.counter))
            guard_config = routing.guard if routing else GuardConfig()
            budget = Budget(cfg.max_cost, top_up=controls.top_up(journal))
            limits = Limits(
                cfg.max_steps,
                cfg.max_cost,
                service_tier=cfg.service_tier,
                max_context=cfg.max_context,
                guard=guard_config.model_copy(update={"pause_at_cap": controls.pause_at_cap}),
            )
            agent: Agent | Team
            if p.team is not None:
                agent = team_for(p, journal, budget, limits, tool_ctx, shown, record, controls)
            else:
                agent = Agent(
                    model,
                    controls.gate(tools) if controls.gate else tools,
                    p.prices,
                    tool_ctx,
                    p.counter,
                    limits,
                    on_step=step_done,
                    on_message=record,
                    on_event=on_event,
                    policy=p.policy,
                    # A summarising policy with a real provider has the model write its summaries.
                    summarizer=None
                    if isinstance(p.model, SimModel)
                    else ModelSummarizer(router.role("summariser") if router else model, p.prices),
                    probe=JournaledProbe(TreeFingerprint(workspace), journal),
                    clock=journal.clock,
                    router=router,
                    inbox=controls.inbox.reader(journal) if controls.inbox else None,
                    budget=budget,
                )
                if routing and router and routing.subagents:
                    children = ChildAgents(
                        agent,
                        router.role("subagent"),
                        lambda: wrap_tools(default_tools(p.counter.counter)),
                        ChildSettings(**routing.subagents.model_dump()),
                    )
                    agent.add_tool(wrap_tools([children.tool()])[0])
            # The task's time limit for the agent, enforced here for `stayer run`, `resume`
            # and every eval trial alike: at the limit the loop is cancelled wherever it
            # is, which kills the command in flight and its sandbox.
            cut_short: list[LedgerEntry] = []
            limit = asyncio.timeout(task.agent_timeout_s)
            try:
                async with limit:
                    result = await agent.run(task.instruction, p.run_id)
            except TimeoutError:
                if not limit.expired():
                    raise
                result, cut_short = timed_out(agent, journal, task.agent_timeout_s)
            journal.flush()
    # Always verified: the tests decide success, however and wherever the agent stopped.
    verifier_sandbox = task.make_sandbox(sandbox_kind, workspace, allow_net=task.allow_internet)
    verdict = await verify(task, verifier_sandbox)
    extra = lost_ledger_entries(journal.lost) + cut_short
    doc = result_document(p, result, verdict, started, extra)
    journal.finish(doc)
    write_result(p.run_dir, doc)
    return doc


def team_for(
    p: PreparedRun,
    journal: RunJournal,
    budget: Budget,
    limits: Limits,
    tool_ctx: ToolContext,
    on_step: Callable[[LedgerEntry], None],
    on_message: Callable[[Message], None],
    controls: Controls,
) -> Team:
    """The run's team (``--team``): its threads journal themselves; the run's observers
    watch them as they would a single agent."""
    assert p.team is not None

    def observe_model(m: Model) -> Model:
        for o in controls.observers:
            m = o.model(m)
        return m

    def observe_tools(ts: list[Tool]) -> list[Tool]:
        for o in controls.observers:
            ts = o.tools(ts)
        return ts

    def on_event(kind: str, payload: dict[str, Any]) -> None:
        for o in controls.observers:
            o.on_event(kind, payload)

    workspace = Path(tool_ctx.workspace)
    services = TeamServices(
        prices=p.prices,
        counter=p.counter,
        tool_context=tool_ctx,
        budget=budget,
        limits=limits,
        models=p.team_models,
        tools=lambda: default_tools(p.counter.counter),
        policy=lambda: make_policy(p.config.policy),
        journal=journal,
        probe=lambda j: JournaledProbe(TreeFingerprint(workspace), j) if j is not None else None,
        observe_model=observe_model,
        observe_tools=observe_tools,
        on_step=on_step,
        on_message=on_message,
        on_event=on_event,
    )
    return Team(p.team, services)


class RunObserver(Protocol):
    """Watches a run from outside the loop (telemetry): wraps its model and tools inside
    the journal, so it sees live calls and never replayed ones, and hears its steps and
    events."""

    def model(self, inner: Model) -> Model: ...

    def tools(self, tools: list[Tool]) -> list[Tool]: ...

    def on_step(self, entry: LedgerEntry) -> None: ...

    def on_event(self, kind: str, payload: dict[str, Any]) -> None: ...


@dataclass
class Controls:
    """What whoever runs the run (the CLI, the runtime) adds to it."""

    gate: Callable[[list[Tool]], list[Tool]] | None = None  # wraps the (journaled) tools
    inbox: Inbox | None = None  # what people say to the agent
    pause_at_cap: bool = False  # a call the cap cannot afford raises BudgetReached
    cap: Callable[[], Decimal | None] | None = None  # the run's cap now (raised while it paused)
    observers: list[RunObserver] = dataclasses.field(default_factory=list)

    def top_up(self, journal: RunJournal) -> Callable[[Decimal | None], Decimal | None] | None:
        """The budget's source of a raised cap, read through the journal at the point the
        run paused: a resumed run replays the raise where it happened."""
        if self.cap is None:
            return None
        source = self.cap

        def raised(current: Decimal | None) -> Decimal | None:
            def larger(value: str | None) -> bool:
                return value is not None and (current is None or Decimal(value) > current)

            def read() -> str | None:
                cap = source()
                return None if cap is None else str(cap)

            value = journal.read_outside(read, keep=larger)
            return None if value is None else Decimal(value)

        return raised


class Inbox:
    """Messages people send a running agent (``fetch(after)`` → ``[{"n", "content"}]``,
    numbered from 1), delivered at the agent's next step. What each step received is
    journaled, so a resumed run replays the same messages at the same steps and then
    continues with the ones it has not seen."""

    def __init__(self, fetch: Callable[[int], list[dict[str, Any]]]) -> None:
        self.fetch = fetch

    def reader(self, journal: RunJournal) -> Callable[[], list[Message]]:
        seen = 0

        def read() -> list[Message]:
            nonlocal seen
            got = journal.read_outside(lambda: self.fetch(seen))
            seen = max((int(m["n"]) for m in got), default=seen)
            return [Message("user", str(m["content"]), kind="person") for m in got]

        return read


def timed_out(
    agent: Agent | Team, journal: RunJournal, limit_s: float
) -> tuple[RunResult, list[LedgerEntry]]:
    """The result of a run stopped by the task's agent time limit: its finished steps, and
    the steps the stop cut short (their model calls were billed; a team's threads journal
    their own calls, so each thread stopped in mid-step has one), as ``budget_exhausted``
    with ``stop_reason`` ``agent_timeout``."""
    result = agent.result or RunResult(status="budget_exhausted")
    journals: list[RunJournal]
    if isinstance(agent, Team):
        journals = [t.journal for t in agent.threads.values() if t.journal is not None]
    else:
        journals = [journal]
    cuts = [cut for j in journals if (cut := j.cut_short()) is not None]
    result.steps += len(cuts)  # a cut step is the one after its journal's last finished step
    detail = f"the task's agent time limit of {limit_s:g} s ran out during step {result.steps + (not cuts)}"
    result.status, result.stop_reason = "budget_exhausted", "agent_timeout"
    result.breakers.append(
        {
            "agent": "main",
            "reason": "agent_timeout",
            "detail": detail,
            "step": result.steps,
            "action": "stop",
            "soft": False,
        }
    )
    result.summary = (
        result.summary or f"Stopped: {detail}. The workspace holds the work done until then."
    )
    return result, cuts


def write_result(run_dir: Path, doc: dict[str, Any]) -> None:
    tmp = run_dir / "result.json.tmp"
    tmp.write_text(json.dumps(doc, indent=2))
    tmp.replace(run_dir / "result.json")


def status_of(result: RunResult, verdict: Verdict | None) -> str:
    """succeeded whenever the tests pass, whatever limit the agent reached on the way; else
    error when the tests could not judge (or the agent errored), budget_exhausted when a
    limit stopped the agent, failed otherwise. Why the agent stopped is ``stop_reason``."""
    if verdict is not None and passes(verdict.reward):
        return "succeeded"
    if verdict is not None and verdict.infrastructure:
        return "error"
    if result.status in ("error", "budget_exhausted"):
        return result.status
    return "failed"


def result_document(
    p: PreparedRun,
    result: RunResult,
    verdict: Verdict | None,
    started: datetime,
    lost: Sequence[LedgerEntry] = (),
) -> dict[str, Any]:
    """The ``--json`` document. ``lost`` are ledger entries the loop did not make:
    ``lost_in_flight`` (model calls in flight at a crash) and ``cut_short`` (the step a time
    limit stopped): billed, so they count in the ledger, the usage and the cost."""
    u = result.usage
    cost = Usd(result.cost_usd)
    for entry in lost:
        u += entry.usage
        cost += entry.cost.total
    ledger = to_json(sorted([*result.ledger, *lost], key=ledger_order))
    reward = verdict.reward if verdict else None
    doc: dict[str, Any] = {
        "run_id": p.run_id,
        "task": p.task.name,
        "task_path": str(p.task.path),
        "model": p.config.model,
        "status": status_of(result, verdict),
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
        "cost_usd": str(cost),
        "stop_reason": result.stop_reason,
        "stop_detail": stop_detail(result.stop_reason, result.breakers),
        "policy": p.config.policy,
        "peak_context_tokens": result.peak_context_tokens,
        "compactions": sum(1 for e in result.ledger if e.compaction),
        "summary": result.summary,
        "breakers": result.breakers,
        "agents": per_agent(ledger),
        "error": result.error or (verdict.infrastructure if verdict else None),
        "ledger": ledger,
        "started": started.isoformat(),
        "finished": datetime.now(UTC).isoformat(),
        "run_dir": str(p.run_dir),
        "tokenizer": p.counter.counter.encoding_name
        if hasattr(p.counter.counter, "encoding_name")
        else None,
    }
    if verdict is not None:
        doc["rewards"] = verdict.rewards
        doc["verifier"] = verdict.to_dict()
    return doc

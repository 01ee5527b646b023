"""A run before it starts: validated, its models built, its directory and workspace named.

``prepare`` checks everything a run needs before the first byte is written (bad input is
a one-line ``ConfigError``, nothing left behind) and returns a ``PreparedRun`` for
``stayer.run.execute``. A run's files live in ``$STAYER_HOME/runs/<run_id>/``; its
workspace lives apart, under ``workspaces_root()``, linked from there. ``run_tools`` is
the one place a run's tools are assembled; ``mcp_offer`` adds its MCP servers' tools
(``run_mcp`` opens them).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import secrets
import sys
import uuid
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from stayer.agent import SYSTEM_PROMPT
from stayer.context.layout import Context
from stayer.context.policies import ContextPolicy, make_policy
from stayer.environments.prepare import prepare_environment
from stayer.errors import ConfigError
from stayer.eval.task import Task, load_task
from stayer.journal import Store, open_store
from stayer.journal.backends import stayer_home
from stayer.journal.snapshot import clear_workspace
from stayer.mcp.config import McpServer, run_servers
from stayer.mcp.lazy import MODES as MCP_MODES
from stayer.mcp.lazy import choose as choose_mcp_mode
from stayer.mcp.lazy import costs as mcp_costs
from stayer.mcp.tools import McpTools, reserved_names
from stayer.mcp.views import McpView
from stayer.models.base import Model
from stayer.models.caching import provider_of
from stayer.models.registry import known_sim_model, make_real_model, split_spec
from stayer.models.sim import SimModel
from stayer.models.sim_policies import parse_policy
from stayer.paths import workspaces_root
from stayer.pricing import PriceBook
from stayer.records import to_json
from stayer.routing.setup import RoutingSetup, prepare_routing, require_prices
from stayer.sandbox import IMAGE_KINDS
from stayer.sandbox import KINDS as SANDBOX_KINDS
from stayer.sandbox.base import Sandbox
from stayer.sandbox.bwrap import check_bwrap
from stayer.settings import RunFlags, RunSettings, check_flags
from stayer.teams.config import TeamSpec, load_team, team_from
from stayer.tokens import Counters, MessageCounter, TiktokenCounter
from stayer.tools import default_tools
from stayer.tools.base import Tool


def run_tools(counter: MessageCounter) -> list[Tool]:
    """Every tool a run offers its agent (each team agent, each sub-agent): assembled here
    only, so that the pinned prefix ``prepare`` checks is the one the run sends."""
    return default_tools(counter.counter)


def run_mcp(p: PreparedRun, sandbox: Sandbox) -> McpTools:
    """The run's MCP servers (``[mcp]``, ``mcp_servers``), connected by ``async with``;
    a stdio server runs in ``sandbox`` unless trusted to run on the host."""
    counter = p.counter.counter
    return McpTools(
        p.mcp_servers, sandbox, counter, reserved_names(counter), public_only=p.mcp_public_only
    )


def mcp_offer(p: PreparedRun, mcp: McpTools) -> str:
    """``--mcp-tools``, ``auto`` decided (``stayer.mcp.lazy.choose``): ``eager`` puts every
    MCP tool in the prompt, ``lazy`` one ``tool_search``."""
    if not mcp.tools:
        return "eager"
    pinned = pinned_tokens(p.task.instruction, p.counter)
    rates = p.prices.rates(p.model.model_id, p.model.provider, p.config.service_tier, pinned)
    priced = (
        None
        if rates is None
        else mcp_costs(mcp.tools, p.counter.counter, rates, p.config.max_steps, pinned)
    )
    return choose_mcp_mode(p.config.mcp_tools, priced)


def mcp_view(mcp: McpTools, mode: str, wrap: Callable[[list[Any]], list[Any]]) -> McpView:
    """One agent's tools of the run's MCP servers, offered as ``mode`` says, each passed
    through ``wrap`` (the agent's journal): every agent of a run has its own view."""
    return McpView(mcp, mode, wrap)


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
    config: RunSettings
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
    mcp_servers: dict[str, McpServer] = dataclasses.field(default_factory=dict)
    # The servers whose URL must resolve to public addresses at each connection: the
    # run's own (``mcp_servers``) unless ``config.allow_private_mcp``.
    mcp_public_only: frozenset[str] = frozenset()

    def new_policy(self) -> ContextPolicy:
        """A fresh context policy of the run's kind (a team's agents each have their own)."""
        return make_policy(self.config.policy)


def prepare(
    config: RunSettings,
    prices: PriceBook | None = None,
    *,
    store: Store | None = None,
    resume: bool = False,
) -> PreparedRun:
    """Validate the whole run; raises ConfigError and writes nothing on bad input.

    ``store`` is the journal to use (default: ``open_store``, opened last, once everything
    else is valid); callers running many runs at once should share one. ``resume`` prepares
    an existing run, for ``execute(..., journal=RunJournal.reopen(…))``."""
    check_flags(RunFlags, {k: getattr(config, k) for k in RunFlags.model_fields})
    if config.sandbox is not None and config.sandbox not in SANDBOX_KINDS:
        raise ConfigError(
            f"--sandbox {config.sandbox}: unknown sandbox; choose one of {', '.join(SANDBOX_KINDS)}"
        )
    policy = make_policy(config.policy)
    if config.mcp_tools not in MCP_MODES:
        raise ConfigError(f"--mcp-tools {config.mcp_tools}: choose one of {', '.join(MCP_MODES)}")
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
    mcp_servers = run_servers(
        task.mcp_servers,
        str(task.path / "task.toml"),
        routing.config.mcp.servers if routing else {},
        config.config_file,
        config.mcp_servers,
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
        mcp_servers=mcp_servers,
        mcp_public_only=frozenset(() if config.allow_private_mcp else (config.mcp_servers or {})),
    )


def team_models_for(
    team: TeamSpec, config: RunSettings, task: Task, counters: Counters, prices: PriceBook
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
    spec: str, config: RunSettings, task: Task, counters: Counters, prices: PriceBook
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


def build_model(spec: str, config: RunSettings, task: Task, counters: Counters) -> Model:
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


def run_header(p: PreparedRun) -> dict[str, Any]:
    """What the journal records about a run up front: enough to prepare it again."""
    c = p.config
    # Paths made absolute, so that a resume from another directory finds the same files.
    config = replace(
        c,
        task_dir=str(Path(c.task_dir).resolve()),
        team_file=c.team_file and str(Path(c.team_file).resolve()),
        config_file=c.config_file and str(Path(c.config_file).resolve()),
        sim_policy="replay:" + str(Path(c.sim_policy.removeprefix("replay:")).resolve())
        if c.sim_policy and c.sim_policy.startswith("replay:")
        else c.sim_policy,
        run_id=p.run_id,
    )
    return {
        "task": p.task.name,
        "task_path": str(p.task.path),
        "model": p.config.model,
        "config": to_json(config),  # read back as ``from_json(config, RunSettings)``
        # Where each MCP server runs: "sandbox", "host" (trust = "host") or "remote" (HTTP).
        "mcp_servers": {name: s.where for name, s in sorted(p.mcp_servers.items())},
    }


def pinned_tokens(instruction: str, counter: MessageCounter) -> int:
    """Tokens of the stable prefix a run starts with: system prompt, tool schemas, task."""
    tools = [t.spec for t in run_tools(counter)]
    return Context(SYSTEM_PROMPT, tools, instruction, counter).tokens

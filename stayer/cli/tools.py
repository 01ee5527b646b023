"""``stayer tools list``: every tool the agent of a run would see, where it comes from, and
what its schema costs in prompt tokens for the run's model, with the total: the number to
know before adding an MCP server. Servers are those of ``--task``'s ``task.toml`` and
``--config``'s ``stayer.toml``; each is started (a stdio one in a sandbox over a copy of
the task's workspace, unless ``trust = "host"``) to list its tools, then stopped."""

from __future__ import annotations

import asyncio
import shutil
import tempfile
from pathlib import Path
from typing import Annotated, Any

import typer

from stayer.choices import DEFAULT_MCP_TOOLS
from stayer.cli.common import JsonFlag, bad_input, console, emit_json, stderr, sub_app
from stayer.cli.options import ConfigOption, McpToolsOption
from stayer.errors import ConfigError
from stayer.records import Record, to_json

tools_app = sub_app("tools", "The tools an agent sees: stayer's own and its MCP servers'.")

DEFAULT_MODEL = "sim:claude-sonnet-4-5"


class ToolRow(Record):
    """A tool in ``stayer tools list --json``: ``in_prompt``, its schema is in every
    prompt; else ``tool_search`` loads it."""

    name: str
    source: str  # stayer, or the MCP server's name
    tokens: int
    in_prompt: bool


class ToolsFound(Record):
    """``stayer tools list --json``."""

    model: str
    servers: dict[str, str]  # each MCP server: where it runs
    mcp_tools: str | None  # the mode --mcp-tools came to; None without servers
    mcp_costs_usd: dict[str, str] | None  # each mode's cost over 50 steps, where priced
    tools: list[ToolRow]
    total_tokens: int  # of the schemas in every prompt


@tools_app.command("list")
def list_command(
    task: Annotated[
        str | None, typer.Option("--task", help="A task directory (its task.toml's [mcp]).")
    ] = None,
    config_file: ConfigOption = None,
    model: Annotated[
        str | None,
        typer.Option(
            "--model",
            help="Count tokens as this model does (default: the config's "
            f"models.main, else {DEFAULT_MODEL}).",
        ),
    ] = None,
    mcp_tools: McpToolsOption = DEFAULT_MCP_TOOLS,
    json_out: JsonFlag = False,
) -> None:
    """Each tool: name, source (stayer or the server), schema tokens; and the total, with
    the tools offered as --mcp-tools says (auto: as a run of 50 steps would have them).

    \b
    Example:  stayer tools list --task examples/hello-file --config stayer.toml
    """
    from stayer.mcp.client import McpStartError
    from stayer.mcp.lazy import MODES

    if mcp_tools not in MODES:
        bad_input(f"--mcp-tools {mcp_tools}: choose one of {', '.join(MODES)}")
    try:
        found = asyncio.run(gather(task, config_file, model, mcp_tools))
    except ConfigError as e:
        bad_input(str(e))
    except McpStartError as e:
        stderr().print(f"error: {e}", markup=False, highlight=False, soft_wrap=True)
        raise typer.Exit(1) from None
    if json_out:
        emit_json(to_json(found))
        return
    from stayer.tables import Col, FitTable, print_table, say

    table = FitTable(
        Col("tool", whole=True),
        Col("source"),
        Col("tokens", number=True),
        Col("in prompt", drop=1),
        box=None,
    )
    for t in found.tools:
        table.add_row(t.name, t.source, f"{t.tokens:,}", "yes" if t.in_prompt else "on search")
    out = console()
    print_table(out, table)
    say(out, f"{len(found.tools)} tools, {found.total_tokens:,} schema tokens in every prompt")
    mode = f"; --mcp-tools {mcp_tools}: {found.mcp_tools}" if found.servers else ""
    say(out, f"counted for {found.model}{mode}")


async def gather(
    task_dir: str | None, config_file: str | None, spec: str | None, mode: str = "auto"
) -> ToolsFound:
    """The ``--json`` document: the model counted for, each tool (``in_prompt``: its
    schema is in every prompt; else loaded by ``tool_search``), the prompt's total, and
    the MCP mode ``mode`` comes to (``auto``: the cheaper over 50 steps)."""
    from stayer.eval.task import load_task
    from stayer.mcp.config import run_servers
    from stayer.mcp.lazy import ToolSearch, choose, costs
    from stayer.mcp.tools import McpTools, reserved_names
    from stayer.prepare import pinned_tokens, priced_as, run_tools
    from stayer.pricing import PriceBook
    from stayer.settings import load_config
    from stayer.tokens import Counters, canonical_tools

    config = load_config(config_file) if config_file else None
    task = load_task(task_dir) if task_dir else None
    spec = spec or (config.models.main if config else None) or DEFAULT_MODEL
    provider, model_id = priced_as(spec)
    counter = Counters().for_model(provider, model_id)
    servers = run_servers(
        task.mcp_servers if task else {},
        str(Path(task_dir or ".") / "task.toml"),
        dict(config.mcp.servers) if config else {},
        config_file,
        None,
    )
    workspace = Path(tempfile.mkdtemp(prefix="stayer-tools-"))
    sandbox: Any = None
    try:
        if any(s.where == "sandbox" for s in servers.values()):
            sandbox = _sandbox(task, workspace)
        async with McpTools(
            servers, sandbox, counter.counter, reserved_names(counter.counter)
        ) as mcp:
            tools: list[tuple[Any, str, bool]] = [(t, "stayer", True) for t in run_tools(counter)]
            priced = None
            if mcp.tools:
                pinned = pinned_tokens(task.instruction if task else "", counter)
                rates = PriceBook.load().rates(model_id, provider, None, pinned)
                if rates is not None:
                    priced = costs(mcp.tools, counter.counter, rates, 50, pinned)
                mode = choose(mode, priced)
                if mode == "lazy":
                    tools.append((ToolSearch(mcp.tools), "stayer", True))
            tools += [(t, t.source, mode == "eager") for t in mcp.tools]
    finally:
        if sandbox is not None:
            await sandbox.close()
        shutil.rmtree(workspace, ignore_errors=True)
    rows = [
        ToolRow(t.spec.name, source, counter.text(canonical_tools([t.spec])), shown)
        for t, source, shown in sorted(tools, key=lambda row: row[0].spec.name)
    ]
    prompt = sorted((t.spec for t, _, shown in tools if shown), key=lambda s: s.name)
    return ToolsFound(
        model=spec,
        servers={n: s.where for n, s in sorted(servers.items())},
        mcp_tools=mode if servers else None,
        mcp_costs_usd=None if priced is None else {k: str(v) for k, v in priced.items()},
        tools=rows,
        total_tokens=counter.text(canonical_tools(prompt)),
    )


def _sandbox(task: Any, workspace: Path) -> Any:
    """The sandbox a run of ``task`` would have (over a fresh copy of its workspace), or
    bwrap over an empty one without a task."""
    if task is None:
        from stayer.sandbox.bwrap import BwrapSandbox, check_bwrap

        check_bwrap()
        return BwrapSandbox(workspace)
    from stayer.environments.prepare import prepare_environment
    from stayer.sandbox import IMAGE_KINDS

    kind = task.kind(None)
    if kind in IMAGE_KINDS:
        prepare_environment(kind, task.path / "environment", log=lambda line: None)
    task.materialise(workspace, kind)
    return task.make_sandbox(kind, workspace, **task.sandbox_limits())

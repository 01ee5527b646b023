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

from stayer.cli.common import JsonFlag, app, bad_input, console, emit_json, stderr, sub_app
from stayer.errors import ConfigError

tools_app = sub_app("The tools an agent sees: stayer's own and its MCP servers'.")
app.add_typer(tools_app, name="tools")

DEFAULT_MODEL = "sim:claude-sonnet-4-5"


@tools_app.command("list")
def list_command(
    task: Annotated[
        str | None, typer.Option("--task", help="A task directory (its task.toml's [mcp]).")
    ] = None,
    config_file: Annotated[
        str | None, typer.Option("--config", help="A stayer.toml (its [mcp.servers]).")
    ] = None,
    model: Annotated[
        str | None,
        typer.Option(
            "--model",
            help="Count tokens as this model does (default: the config's "
            f"models.main, else {DEFAULT_MODEL}).",
        ),
    ] = None,
    json_out: JsonFlag = False,
) -> None:
    """Each tool: name, source (stayer or the server), schema tokens; and the total.

    \b
    Example:  stayer tools list --task examples/hello-file --config stayer.toml
    """
    from stayer.mcp.client import McpStartError

    try:
        found = asyncio.run(gather(task, config_file, model))
    except ConfigError as e:
        bad_input(str(e))
    except McpStartError as e:
        stderr().print(f"error: {e}", markup=False, highlight=False, soft_wrap=True)
        raise typer.Exit(1) from None
    if json_out:
        emit_json(found)
        return
    from stayer.tables import Col, FitTable, print_table, say

    table = FitTable(Col("tool", whole=True), Col("source"), Col("tokens", number=True), box=None)
    for t in found["tools"]:
        table.add_row(t["name"], t["source"], f"{t['tokens']:,}")
    out = console()
    print_table(out, table)
    say(
        out,
        f"{len(found['tools'])} tools, {found['total_tokens']:,} tokens of schemas in every "
        f"prompt ({found['model']})",
    )


async def gather(task_dir: str | None, config_file: str | None, spec: str | None) -> dict[str, Any]:
    """The ``--json`` document: the model counted for, each tool, the total."""
    from stayer.config import load_config
    from stayer.eval.task import load_task
    from stayer.mcp.config import run_servers
    from stayer.mcp.tools import McpTools, reserved_names
    from stayer.run import priced_as
    from stayer.tokens import Counters, canonical_tools
    from stayer.tools import default_tools

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
            tools = [(t, "stayer") for t in default_tools(counter.counter)]
            tools += [(t, t.source) for t in mcp.tools]
    finally:
        if sandbox is not None:
            await sandbox.close()
        shutil.rmtree(workspace, ignore_errors=True)
    rows = [
        {
            "name": t.spec.name,
            "source": source,
            "tokens": counter.text(canonical_tools([t.spec])),
        }
        for t, source in sorted(tools, key=lambda pair: pair[0].spec.name)
    ]
    return {
        "model": spec,
        "servers": {n: s.where for n, s in sorted(servers.items())},
        "tools": rows,
        "total_tokens": counter.text(
            canonical_tools(sorted((t.spec for t, _ in tools), key=lambda s: s.name))
        ),
    }


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

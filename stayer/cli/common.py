"""What every ``stayer`` command shares: the Typer app, exit codes, bad-input and JSON output.

Contracts (DESIGN.md): every command takes ``--json`` and then prints exactly one JSON
document on stdout, with progress and logs on stderr. Exit codes: 0 ok, 1 the run or check
failed, 2 bad input (one line naming the file, field or flag), 3 budget exhausted.
"""

from __future__ import annotations

import sys
from decimal import Decimal, InvalidOperation
from typing import Annotated, Any, NoReturn

import typer
from rich.console import Console

# Start-up time matters (``stayer --help``, ``stayer runs``): command modules import only
# typer and this module at the top, and everything else inside the command.
# Plain (click) help: no ``<bool>`` tags on flags, and no import of Rich's Markdown renderer.
HELP_SETTINGS: dict[str, Any] = {
    "add_completion": False,
    "no_args_is_help": True,
    "rich_markup_mode": None,
    "pretty_exceptions_enable": False,
    "context_settings": {"help_option_names": ["-h", "--help"], "max_content_width": 100},
}


def sub_app(help: str) -> typer.Typer:
    """A command group (``stayer sandbox …``) that looks like the main app."""
    return typer.Typer(help=help, **HELP_SETTINGS)


app = sub_app(
    "Run long-horizon LLM agents that finish the job within budget.\n\n"
    "\b\nStart with:\n"
    "  stayer doctor      can stayer run here? what to fix if not\n"
    "  stayer run examples/hello-file --model sim:claude-sonnet-4-5\n"
    "  stayer COMMAND -h  a command's options, with an example"
)


def _print_version(value: bool) -> None:
    if value:
        from stayer import __version__

        print(f"stayer {__version__}")
        raise typer.Exit()


@app.callback()
def _main(
    version: Annotated[
        bool,
        typer.Option("--version", callback=_print_version, is_eager=True, help="Print the version and exit."),
    ] = False,
) -> None:
    """Options of ``stayer`` itself (the help text is the app's)."""


EXIT_OK, EXIT_FAILED, EXIT_BAD_INPUT, EXIT_BUDGET = 0, 1, 2, 3

JsonFlag = Annotated[bool, typer.Option("--json", help="Print one JSON document on stdout.")]


def stderr() -> Console:
    return Console(stderr=True)


def bad_input(message: str) -> NoReturn:
    stderr().print(f"[bold red]error:[/] {message}", highlight=False, soft_wrap=True)
    raise typer.Exit(EXIT_BAD_INPUT)


def parse_decimal(value: str | None, flag: str) -> Decimal | None:
    if value is None:
        return None
    try:
        d = Decimal(value)
    except InvalidOperation:
        bad_input(f"{flag} {value!r}: not a number")
    if not d.is_finite():
        bad_input(f"{flag} {value!r}: not a finite number")
    return d


def emit_json(doc: Any) -> None:
    # orjson: the standard encoder falls back to pure Python once ``indent`` is set, which
    # made printing a large audit report a third of the command's time.
    import orjson

    out = orjson.dumps(doc, option=orjson.OPT_INDENT_2 | orjson.OPT_NON_STR_KEYS)
    sys.stdout.buffer.write(out + b"\n")
    sys.stdout.flush()




def dash(value: Any) -> str:
    """A value for people: "—" where there is none (never "None")."""
    return "—" if value is None or value == "" else str(value)


def usd(value: Decimal | str | None) -> str:
    """Money for people, one precision everywhere: ``$0.012345``; "unknown" (no price
    data) and "—" (no figure) as such."""
    if value is None:
        return "—"
    if value == "unknown":
        return "unknown"
    return f"${Decimal(value):,.6f}"


def step_notes(entry: dict[str, Any]) -> list[str]:
    """What happened at a ledger entry besides the call: a cache break and its reason, a
    compaction, a model switch."""
    notes = []
    brk = entry.get("cache_break")
    if brk:
        detail = f" ({brk['detail']})" if brk.get("detail") else ""
        notes.append(f"cache break: {brk['reason']}{detail}")
    comp = entry.get("compaction")
    if comp:
        notes.append(
            f"compacted {comp['tokens_before']:,} → {comp['tokens_after']:,} tokens ({comp['reason']})"
        )
    route = entry.get("route")
    if route and route.get("switched"):
        notes.append(f"switched to {route['model']} ({route['reason']})")
    return notes


def parse_since(value: str | None, flag: str = "--since") -> float | None:
    """A UTC date (``YYYY-MM-DD`` or ``YYYYMMDD``) as a timestamp; bad input otherwise."""
    from datetime import UTC, datetime

    if value is None:
        return None
    for fmt in ("%Y-%m-%d", "%Y%m%d"):
        try:
            return datetime.strptime(value, fmt).replace(tzinfo=UTC).timestamp()
        except ValueError:
            continue
    bad_input(f"{flag} {value!r}: expected a date as YYYY-MM-DD or YYYYMMDD (UTC)")

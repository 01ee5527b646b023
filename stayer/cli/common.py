"""What every ``stayer`` command shares: the Typer app, exit codes, bad-input and JSON output.

Contracts (DESIGN.md): every command takes ``--json`` and then prints exactly one JSON
document on stdout, with progress and logs on stderr. Exit codes: 0 ok, 1 the run or check
failed, 2 bad input (one line naming the file, field or flag), 3 budget exhausted.
"""

from __future__ import annotations

import os
import sqlite3
import sys
from decimal import Decimal, InvalidOperation
from pathlib import Path
from typing import Annotated, Any, NoReturn

import typer
from rich.console import Console
from rich.text import Text
from typer import exceptions as typer_errors
from typer._click import exceptions as click_errors  # Typer's own click; no public alias
from typer.core import TyperGroup

from stayer.errors import ConfigError


class StayerGroup(TyperGroup):
    """The ``stayer`` command group: every error a person can cause ends as one line.

    Typer would print a usage error as a boxed paragraph, and an OS or journal-store error
    (a read-only ``--out``, a full disk, a database gone mid-run) as a traceback; here
    each becomes ``error: …`` on one line naming the flag or file, exit 2."""

    def main(self, *args: Any, standalone_mode: bool = True, **kwargs: Any) -> Any:
        if not standalone_mode:
            return super().main(*args, standalone_mode=False, **kwargs)
        try:
            code = super().main(*args, standalone_mode=False, **kwargs)
        except click_errors.NoArgsIsHelpError as e:
            e.show()  # the help text, not an error
            sys.exit(EXIT_BAD_INPUT)
        except click_errors.ClickException as e:
            where = f" (see `{e.ctx.command_path} --help`)" if getattr(e, "ctx", None) else ""
            error_line(e.format_message() + where)
            sys.exit(EXIT_BAD_INPUT)
        except typer_errors.Abort:
            error_line("aborted")
            sys.exit(EXIT_FAILED)
        except ConfigError as e:  # bad input found past a command's own checks
            error_line(str(e))
            sys.exit(EXIT_BAD_INPUT)
        except Exception as e:
            if not (isinstance(e, OSError) or is_store_error(e)):
                raise  # a bug: its traceback is what a report needs
            error_line(environment_error(e))
            sys.exit(EXIT_BAD_INPUT)
        sys.exit(code or 0)


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


def sub_app(help: str, **extra: Any) -> typer.Typer:
    """A command group (``stayer sandbox …``) that looks like the main app."""
    return typer.Typer(help=help, **HELP_SETTINGS, **extra)


app = sub_app(
    "Run long-horizon LLM agents that finish the job within budget.\n\n"
    "\b\nStart with:\n"
    "  stayer doctor      can stayer run here? what to fix if not\n"
    "  stayer run examples/hello-file --model sim:claude-sonnet-4-5\n"
    "  stayer COMMAND -h  a command's options, with an example",
    cls=StayerGroup,
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


def console(*, stderr: bool = False) -> Console:
    """A console for stayer's own output. User text goes to it as ``rich.text.Text``, never
    inside markup (``rich.markup.escape`` loses a backslash before ``[``); emoji codes stay
    text, so that ``--policy mask:-1:`` is not printed as a thumbs-down."""
    return Console(stderr=stderr, emoji=False)


def stderr() -> Console:
    return console(stderr=True)


def error_line(message: str) -> None:
    # Text, not markup: the message quotes what the user typed, brackets and all.
    one_line = " ".join(message.split())
    stderr().print(Text.assemble(("error:", "bold red"), " ", one_line), highlight=False, soft_wrap=True)


def bad_input(message: str) -> NoReturn:
    error_line(message)
    raise typer.Exit(EXIT_BAD_INPUT)


def check_writable_dir(path: Path, flag: str) -> None:
    """A directory a command will write into at its end (``--out``): refused up front when it
    cannot be, so that no work is done whose results could not be kept."""
    if path.exists() and not path.is_dir():
        bad_input(f"{flag} {path}: exists and is not a directory")
    existing = path
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir() or not os.access(existing, os.W_OK | os.X_OK):
        bad_input(f"{flag} {path}: cannot write there ({existing} is read-only or not a directory)")


def is_store_error(e: BaseException) -> bool:
    """An error of the journal's database driver (SQLite or PostgreSQL: connection lost,
    disk full), as opposed to a bug. psycopg is optional, so it is known by its module."""
    return isinstance(e, sqlite3.Error) or type(e).__module__.split(".")[0] == "psycopg"


def environment_error(e: BaseException) -> str:
    """What went wrong outside stayer, in one line naming the file when there is one."""
    if isinstance(e, OSError):
        name = e.filename if e.filename is not None else ""
        return f"{name}: {e.strerror or e}" if name else f"{e.strerror or e}"
    return f"journal store: {type(e).__name__}: {e}"


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

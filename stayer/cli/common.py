"""What every ``stayer`` command shares: the Typer app, exit codes, bad-input and JSON output.

Contracts (DESIGN.md): every command takes ``--json`` and then prints exactly one JSON
document on stdout, with progress and logs on stderr. Exit codes: 0 ok, 1 the run or check
failed, 2 bad input (one line naming the file, field or flag), 3 budget exhausted.
"""

from __future__ import annotations

import sys
from decimal import Decimal, InvalidOperation
from typing import Annotated, Any, NoReturn

import orjson
import typer
from rich.console import Console

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    help="Run long-horizon LLM agents that finish the job within budget.",
    pretty_exceptions_enable=False,
)

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
    out = orjson.dumps(doc, option=orjson.OPT_INDENT_2 | orjson.OPT_NON_STR_KEYS)
    sys.stdout.buffer.write(out + b"\n")
    sys.stdout.flush()



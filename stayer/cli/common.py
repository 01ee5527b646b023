"""What every ``stayer`` command shares: the Typer app, exit codes, bad-input and JSON output.

Contracts (DESIGN.md): every command takes ``--json`` and then prints exactly one JSON
document on stdout, with progress and logs on stderr. Exit codes: 0 ok, 1 the run or check
failed, 2 bad input (one line naming the file, field or flag), 3 budget exhausted.
"""

from __future__ import annotations

import inspect
import re
import sys
from collections.abc import Callable, Coroutine, Iterator, Mapping
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, NoReturn, TypeVar

import typer
from typer.core import TyperCommand, TyperGroup
from typer.main import get_command

from stayer.errors import ConfigError
from stayer.money import Usd

# Rich is imported where output is rendered: a command that prints JSON never loads it.
if TYPE_CHECKING:
    from rich.console import Console

T = TypeVar("T")


class StayerGroup(TyperGroup):
    """The ``stayer`` command group: every error a person can cause ends as one line.

    Typer would print a usage error as a boxed paragraph, and an OS or journal-store error
    (a read-only ``--out``, a full disk, a database gone mid-run) as a traceback; here
    each becomes ``error: …`` on one line naming the flag or file, exit 2."""

    def main(self, *args: Any, standalone_mode: bool = True, **kwargs: Any) -> Any:
        kwargs["standalone_mode"] = False
        # One name, however started (``python -m stayer.cli`` too): usage lines and the
        # shell completion (``_STAYER_COMPLETE``) are those of the ``stayer`` command.
        kwargs.setdefault("prog_name", "stayer")
        if not standalone_mode:
            return super().main(*args, **kwargs)
        try:
            code = super().main(*args, **kwargs)
        except typer.TyperException as e:  # Typer's usage errors (click's) are these
            ctx = getattr(e, "ctx", None)  # usage errors carry the command they are about
            if ctx is not None and e.format_message() == ctx.get_help():
                typer.echo(e.format_message(), err=True, color=ctx.color)  # no arguments
                sys.exit(EXIT_BAD_INPUT)
            where = f" (see `{ctx.command_path} --help`)" if ctx else ""
            error_line(e.format_message() + where)
            sys.exit(EXIT_BAD_INPUT)
        except typer.Abort:
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

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        # typer passes none: see StayerApp. Looked up, never changed, so a Mapping serves.
        self.commands = LazyCommands(app.deferred)  # type: ignore[assignment]
        read_plainly(self)

    def parse_args(self, ctx: Any, args: list[str]) -> list[str]:
        read_plainly(self)  # Typer adds --install/--show-completion after __init__
        return super().parse_args(ctx, args)

    def format_commands(self, ctx: Any, formatter: Any) -> None:
        # The listing in ``stayer --help`` from each command's help text, without building it.
        commands: LazyCommands = self.commands  # type: ignore[assignment]
        names = list(commands)
        limit = formatter.width - 6 - max(map(len, names))
        with formatter.section("Commands"):
            formatter.write_dl([(name, commands.short_help(name, limit)) for name in names])


# A click command as Typer builds it (TyperCommand or TyperGroup; Typer names no base).
Command = Any


class LazyCommands(Mapping[str, Command]):
    """The root group's commands by name, each turned into a click command only when it is
    looked up. Typer builds a command by reading its signature and type hints, a few
    milliseconds each; ``stayer runs`` or ``stayer --help`` needs at most one of twenty."""

    def __init__(self, holders: dict[str, typer.Typer]) -> None:
        self.holders = holders  # name → a Typer app holding just that command or group
        self.built: dict[str, Command] = {}

    def __getitem__(self, name: str) -> Command:
        if name not in self.built:
            group = get_command(self.holders[name])
            self.built[name] = read_plainly(group.commands[name])  # type: ignore[attr-defined]
        return self.built[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self.holders)

    def __len__(self) -> int:
        return len(self.holders)

    def short_help(self, name: str, limit: int) -> str:
        """What click would list for ``name`` (its ``short_help``, else its help's first
        sentence cut to ``limit``), read from the registration."""
        holder = self.holders[name]
        if holder.registered_commands:
            info = holder.registered_commands[0]
            short, text = info.short_help, info.help or inspect.getdoc(info.callback) or ""
        else:
            sub = holder.registered_groups[0].typer_instance
            assert sub is not None
            short, text = None, str(sub.info.help)
        # A command of just that help (no parameters: cheap) says it as click would.
        listed = TyperCommand(name, help=inspect.cleandoc(text), short_help=short)
        return listed.get_short_help_str(limit)


def plain_reading(param: Any, reading: Callable[..., Any]) -> None:
    """Have ``param`` read by ``reading(parameter_info, annotation, typers=…)`` (a
    ``PlainValue``) instead of by Typer. The one place that reaches into Typer: its
    parameters keep their reading in ``_runtime_param``, built by ``typer._coercion``, and
    Typer has no public hook for it. Where a Typer has neither, ``param`` is left to Typer:
    what is read and said stays the same, only pydantic is imported to read it."""
    try:
        from typer._coercion import build_runtime_param
    except ImportError:
        return
    descriptor = getattr(param, "type_descriptor", None)
    if descriptor is None or getattr(param, "_runtime_param", 0) is not None:
        return
    param._runtime_param = reading(
        descriptor.parameter_info,
        descriptor.annotation,
        typers=lambda: build_runtime_param(descriptor),
    )


@dataclass(frozen=True)
class PlainValue:
    """How a ``str``, ``int`` or ``bool`` option is read. Typer reads every value (an absent
    ``--help``'s too) through a pydantic TypeAdapter, and importing pydantic costs as much
    again as typer and Rich together: ``stayer runs`` would take twice as long for it. A
    string is kept, a flag's bool too, and plain ASCII digits are an int as pydantic reads
    them when they are within the option's ``min``/``max``; anything else goes to Typer's
    own reading, so that what is accepted and what is said about the rest stay exactly
    Typer's."""

    parameter_info: Any
    annotation: Any
    typers: Callable[[], Any]  # Typer's own reading of this parameter, built when needed

    def coerce(self, value: Any, param: Any, ctx: typer.Context) -> Any:
        # As Typer's own reading begins: nothing given, and a list given as one string.
        many = param.multiple or param.nargs == -1
        if value is None:
            return () if many else None
        if many and isinstance(value, str):
            raise typer.BadParameter("Value must be an iterable.", ctx=ctx, param=param)
        return self._coerce_value(value, param, ctx)

    def _coerce_value(self, value: Any, param: Any, ctx: typer.Context) -> Any:
        if type(value) is self.annotation:
            return value  # a string for a string, or a default
        if self.annotation is int and isinstance(value, str) and _PLAIN_INT.fullmatch(value):
            number = int(value)
            low, high = self.parameter_info.min, self.parameter_info.max
            if (low is None or number >= low) and (high is None or number <= high):
                return number
            # Out of the option's range: Typer says so (or clamps, where it is told to).
        return self.typers()._coerce_value(value, param, ctx)


_PLAIN_INT = re.compile(r"[+-]?[0-9]{1,18}")  # no spaces, underscores or other digits: Typer's


def read_plainly(command: Command) -> Command:
    """``command`` (and a group's commands) with its ``str``, ``int`` and ``bool`` options
    read by ``PlainValue``. Typers that read values otherwise (no ``type_descriptor``) are
    left be."""
    # click makes the help option when it is first asked for, with the context's names.
    names = HELP_SETTINGS["context_settings"]["help_option_names"]
    help_option = command.get_help_option(typer.Context(command, help_option_names=names))
    for param in [*command.params, *filter(None, [help_option])]:
        descriptor = getattr(param, "type_descriptor", None)
        if descriptor is not None and descriptor.annotation in (str, int, bool):
            plain_reading(param, PlainValue)
    if not isinstance(command, StayerGroup):  # its commands are read plainly when built
        for sub in getattr(command, "commands", {}).values():
            read_plainly(sub)
    return command


class StayerApp(typer.Typer):
    """The ``stayer`` app. Its commands and groups are registered as on any Typer app, each
    in a Typer of its own that ``LazyCommands`` builds only when the command is used."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.deferred: dict[str, typer.Typer] = {}

    def command(self, name: str | None = None, **kwargs: Any) -> Callable[[Any], Any]:
        def register(f: Callable[..., Any]) -> Callable[..., Any]:
            holder = _holder()
            holder.command(name, **kwargs)(f)
            # Typer's name for a command: the function's, lower case, ``_`` as ``-``.
            self._defer(name or f.__name__.lower().replace("_", "-"), holder, before_groups=True)
            return f

        return register

    def add_typer(self, typer_instance: typer.Typer, *, name: str, **kwargs: Any) -> None:  # type: ignore[override]
        holder = _holder()
        holder.add_typer(typer_instance, name=name, **kwargs)
        self._defer(name, holder, before_groups=False)

    def _defer(self, name: str, holder: typer.Typer, *, before_groups: bool) -> None:
        # Listed as Typer lists them: commands first, then groups, each in the order made.
        if not before_groups:
            self.deferred[name] = holder
            return
        groups = {n: h for n, h in self.deferred.items() if h.registered_groups}
        for n in groups:
            del self.deferred[n]
        self.deferred.update({name: holder, **groups})


def _holder() -> typer.Typer:
    """A Typer app with a callback, so that Typer makes it a group even for one command."""
    holder = typer.Typer(
        rich_markup_mode=None, pretty_exceptions_enable=False, add_completion=False
    )
    holder.callback()(_no_options)
    return holder


def _no_options() -> None:
    """The holder group's callback: the root app's callback is the one that runs."""


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


def sub_app(name: str, help: str, **extra: Any) -> typer.Typer:
    """The command group ``stayer NAME …``, registered on the app and looking like it."""
    group = typer.Typer(help=help, **{**HELP_SETTINGS, **extra})
    app.add_typer(group, name=name)
    return group


app = StayerApp(
    help="Run long-horizon LLM agents that finish the job within budget.\n\n"
    "\b\nStart with:\n"
    "  stayer doctor      can stayer run here? what to fix if not\n"
    "  stayer run examples/hello-file --model sim:claude-sonnet-4-5\n"
    "  stayer COMMAND -h  a command's options, with an example",
    cls=StayerGroup,
    **{**HELP_SETTINGS, "add_completion": True},  # --install-completion, --show-completion
)


def _print_version(value: bool) -> None:
    if value:
        from stayer._version import __version__

        print(f"stayer {__version__}")
        raise typer.Exit()


@app.callback()
def _main(
    version: Annotated[
        bool,
        typer.Option(
            "--version", callback=_print_version, is_eager=True, help="Print the version and exit."
        ),
    ] = False,
) -> None:
    """Options of ``stayer`` itself (the help text is the app's)."""


EXIT_OK, EXIT_FAILED, EXIT_BAD_INPUT, EXIT_BUDGET = 0, 1, 2, 3
EXIT_INTERRUPTED = 130  # the shell's status for a process stopped by Ctrl-C (128 + SIGINT)

# The options that several commands take are stayer.cli.options's; --json is every one's.
JsonFlag = Annotated[bool, typer.Option("--json", help="Print one JSON document on stdout.")]


def run_async(main: Callable[[], Coroutine[Any, Any, T]]) -> T:
    """``asyncio.run(main())``, with Ctrl-C held back until the event loop runs ``main``.

    Python raises KeyboardInterrupt wherever the main thread is when the signal comes; in
    the moment between making the coroutine and the loop's own Ctrl-C handler, that is
    inside the loop's construction (a half-made loop, a traceback from its ``__del__``,
    "coroutine was never awaited"). Held back, it always arrives as the loop's
    cancellation of ``main``, which ends as KeyboardInterrupt once ``main`` has unwound."""
    import asyncio
    import signal
    import threading

    hold = threading.current_thread() is threading.main_thread()

    async def body() -> T:
        if hold:  # the loop's handler is in place now: let a pending Ctrl-C in
            signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
        return await main()

    if hold:
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        return asyncio.run(body())
    finally:
        if hold:
            signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})


def console(*, stderr: bool = False) -> Console:
    """A console for stayer's own output. User text goes to it as ``rich.text.Text``, never
    inside markup (``rich.markup.escape`` loses a backslash before ``[``); emoji codes stay
    text, so that ``--policy mask:-1:`` is not printed as a thumbs-down."""
    from rich.console import Console

    return Console(stderr=stderr, emoji=False)


def stderr() -> Console:
    return console(stderr=True)


def error_line(message: str) -> None:
    from rich.text import Text

    # Text, not markup: the message quotes what the user typed, brackets and all.
    one_line = " ".join(message.split())
    stderr().print(
        Text.assemble(("error:", "bold red"), " ", one_line), highlight=False, soft_wrap=True
    )


def bad_input(message: str) -> NoReturn:
    error_line(message)
    raise typer.Exit(EXIT_BAD_INPUT)


def check_writable_dir(path: Path, flag: str) -> None:
    """``stayer.paths.check_writable_dir``: bad input (exit 2) when ``path`` cannot be
    written."""
    from stayer.paths import check_writable_dir as check

    try:
        check(path, flag)
    except ConfigError as e:
        bad_input(str(e))


def is_store_error(e: BaseException) -> bool:
    """An error of the journal's database driver (SQLite or PostgreSQL: connection lost,
    disk full), as opposed to a bug. psycopg is optional, so it is known by its module."""
    # Both by module, so that no command pays for importing a driver it does not use.
    return type(e).__module__.split(".")[0] in ("sqlite3", "psycopg")


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
    return "—" if value is None else Usd.parse(value).format()


def step_notes(entry: dict[str, Any]) -> list[str]:
    """What happened at a ledger entry besides the call: a cache break and its reason, a
    compaction, a model switch."""
    notes = []
    if entry.get("kind") == "lost_in_flight":
        notes.append("lost in flight at a crash (billed; estimated)")
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


def serve_app(app: Any, host: str, port: int, what: str) -> None:
    """Listen on ``host``:``port`` (0: a free port) before saying where on stderr
    (``stayer WHAT on http://HOST:PORT · …``, which scripts wait for), then serve ``app``."""
    import socket

    import uvicorn
    from rich.markup import escape

    try:
        sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(2048)
    except OSError as e:
        bad_input(f"--host {host} --port {port}: cannot listen there ({e.strerror or e})")
    where = f"[{host}]" if ":" in host else host
    head, _, rest = what.partition(" · ")
    stderr().print(
        f"stayer {escape(head)} on http://{escape(where)}:{sock.getsockname()[1]}"
        + (f" · {escape(rest)}" if rest else ""),
        highlight=False,
        soft_wrap=True,
    )
    config = uvicorn.Config(app, log_level="warning", timeout_keep_alive=30)
    uvicorn.Server(config).run(sockets=[sock])

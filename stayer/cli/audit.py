"""``stayer audit``: why an agent's budget burned, from the logs other agents already write."""

from __future__ import annotations

import gc
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import typer
from typer.core import TyperCommand

from stayer.cli.common import (
    JsonFlag,
    PlainValue,
    app,
    bad_input,
    console,
    emit_json,
    parse_since,
    plain_reading,
    stderr,
)
from stayer.cli.options import since_option
from stayer.errors import ConfigError


@dataclass(frozen=True)
class _PlainList(PlainValue):
    """``PlainValue`` for a ``Path`` and a list of paths or strings: Typer would read them
    through pydantic, whose import alone costs a tenth of a second; it gives ``Path(text)``
    for each, as here. Anything else goes to Typer's own reading."""

    def _coerce_value(self, value: Any, param: Any, ctx: typer.Context) -> Any:
        kind = self.annotation
        if kind is Path and type(value) is str:
            return Path(value)
        if isinstance(value, tuple | list) and all(type(v) is str for v in value):
            if kind == list[Path]:
                return [Path(v) for v in value]
            if kind == list[str]:
                return list(value)
        return self.typers()._coerce_value(value, param, ctx)


class _AuditCommand(TyperCommand):
    """``stayer audit``, whose paths and lists are read by ``_PlainList``."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        for param in self.params:
            descriptor = getattr(param, "type_descriptor", None)
            if descriptor is not None and descriptor.annotation in (Path, list[Path], list[str]):
                plain_reading(param, _PlainList)


@app.command(cls=_AuditCommand)
def audit(
    paths: Annotated[
        list[Path] | None,
        typer.Argument(
            help="Log files or directories (Claude Code, Codex, stayer runs, SWE-agent, "
            "mini-swe-agent, OpenHands, ATIF). "
            "Default: ~/.claude/projects, $CLAUDE_CONFIG_DIR, ~/.codex/sessions, $STAYER_HOME/runs."
        ),
    ] = None,
    since: Annotated[str | None, since_option("calls")] = None,
    group: Annotated[
        str, typer.Option("--group", help="Rows of the table: session, day (UTC) or model.")
    ] = "session",
    html: Annotated[
        Path | None,
        typer.Option(
            "--html", help="Also write a self-contained HTML report with plots per session."
        ),
    ] = None,
    what_if: Annotated[
        list[str] | None,
        typer.Option(
            "--what-if",
            help="model=ID,policy=P[,max_context=N]: estimate the costliest sessions under another "
            "model or context policy (repeatable).",
        ),
    ] = None,
    jobs: Annotated[
        int | None, typer.Option("--jobs", help="Worker processes (default: all cores).")
    ] = None,
    json_out: JsonFlag = False,
) -> None:
    """Costs, cache breaks and context growth per session, from agents' own logs.

    \b
    Example:  stayer audit --since 2026-01-01 --html audit.html --what-if model=claude-haiku-4-5,policy=auto
    """
    from stayer.audit.costing import load_steps, save_steps
    from stayer.audit.document import GROUPS, build, render
    from stayer.audit.engine import FORMATS, analyse_all, default_paths, discover
    from stayer.paths import cache_root
    from stayer.pricing import PriceBook

    if group not in GROUPS:
        bad_input(f"--group {group!r}: expected one of {', '.join(GROUPS)}")
    if jobs is not None:  # (None always passes; the check imports pydantic)
        from stayer.settings import ListSettings, check_flags

        try:
            check_flags(ListSettings, {"jobs": jobs})
        except ConfigError as e:
            bad_input(str(e))
    since_ts = parse_since(since)
    for p in paths or ():
        if not p.exists():
            bad_input(f"{p}: no such file or directory")
    if html is not None:
        if html.is_dir() or not html.parent.is_dir():
            bad_input(f"--html {html}: expected a file path in an existing directory")
        if not os.access(html.parent, os.W_OK | os.X_OK) or (
            html.exists() and not os.access(html, os.W_OK)
        ):
            bad_input(f"--html {html}: cannot write there (read-only)")
    try:
        book = PriceBook.load()
        if what_if:
            from stayer.audit.scenarios import parse_scenario

            scenarios = [parse_scenario(spec) for spec in what_if]
    except ConfigError as e:
        bad_input(str(e))

    # Reading makes no reference cycles (what it reads is freed by reference counting), so
    # the cyclic collector is off meanwhile: it would only walk the many objects again and
    # again. What is kept after is frozen, out of later collections' way.
    gc.disable()
    try:
        found = discover(paths or default_paths())
        if found.unrecognised:
            names = ", ".join(str(p) for p in found.unrecognised[:3])
            bad_input(f"{names}: not a log stayer audit reads ({FORMATS})")
        if paths and found.unread:
            root, example = found.unread[0]
            bad_input(
                f"{root}: no log stayer audit reads in it (such as {example}; reads: {FORMATS})"
            )
        if paths and not found.refs:
            where = ", ".join(str(p) for p in paths)
            _note(f"no agent logs found under {where} (reads: {FORMATS})", style="yellow")
        if found.restated:
            _note(
                f"left out {len(found.restated)} ATIF trajectory file(s) whose sessions' own "
                "logs are audited too (the same calls)"
            )
        # Prices compiled by earlier audits (a cache: see stayer.audit.costing).
        steps_file = cache_root() / "audit-prices.marshal"
        fingerprint = book.fingerprint()
        steps = load_steps(steps_file, fingerprint)
        known = len(steps)
        report = build(
            analyse_all(
                found.refs,
                book,
                since=since_ts,
                keep_series=html is not None,
                jobs=jobs,
                compiled_steps=steps,
                with_json=json_out,
            ),
            group,
        )
    finally:
        gc.freeze()
        gc.enable()
    if len(steps) != known:
        save_steps(steps_file, fingerprint, steps)
    if what_if:
        from stayer.audit.scenarios import run_what_ifs

        _note("what-if: replaying the costliest sessions (estimates)…")
        refs = {(r.source, r.id): r for r in found.refs}
        report.what_if = run_what_ifs(report.sessions, refs, scenarios, book)
    if html is not None:
        from stayer.audit.html import write_html

        tmp = html.with_name(html.name + f".{os.getpid()}.tmp")
        try:
            tmp.write_text(write_html(report), encoding="utf-8")
            tmp.replace(html)
        finally:
            tmp.unlink(missing_ok=True)
        _note(f"wrote {html}")
    if json_out:
        emit_json(report.to_json())
        if _may_be_terminal():  # a person is watching; a pipe gets just the document
            err = stderr()
            if err.is_terminal:
                render(report, err)
    else:
        render(report, console())


# Rich, and a Console, only where something is shown: an audit piped as JSON never
# imports it (a twentieth of the command's start-up).


def _note(message: str, style: str | None = None) -> None:
    from rich.text import Text

    stderr().print(Text(message, style=style or ""))


def _may_be_terminal() -> bool:
    """Whether rich could take stderr for a terminal (its ``Console.is_terminal`` reads
    these, and nothing else outside a notebook)."""
    return sys.stderr.isatty() or "TTY_COMPATIBLE" in os.environ or "FORCE_COLOR" in os.environ

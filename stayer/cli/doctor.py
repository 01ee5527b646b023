"""``stayer doctor``: whether stayer can run on this machine, and what to do when it cannot."""

from __future__ import annotations

import typer

from stayer.cli.common import EXIT_FAILED, EXIT_OK, JsonFlag, app, emit_json


@app.command()
def doctor(json_out: JsonFlag = False) -> None:
    """Check the sandbox (which bwrap, its version), user namespaces, the journal, price data,
    the tokenizer and optional extras; say what to do about each problem.

    Exit 1 when a required check fails.

    \b
    Example:  stayer doctor
    """
    from rich.console import Console
    from rich.markup import escape

    from stayer.doctor import run_checks

    checks = run_checks()
    ok = all(c.ok for c in checks if c.required)
    if json_out:
        emit_json({"ok": ok, "checks": [c.to_dict() for c in checks]})
    console = Console(stderr=json_out)
    for c in checks:
        mark = "[green]ok[/]  " if c.ok else "[red]FAIL[/]" if c.required else "[yellow]--[/]  "
        console.print(
            f"{mark} {escape(f'{c.name:<16}')} {escape(c.detail)}", highlight=False, soft_wrap=True
        )
        if c.fix:
            console.print(
                f"     {'':<16} [bold]→[/] {escape(c.fix)}", highlight=False, soft_wrap=True
            )
    verdict = "ready" if ok else "not ready: fix the FAIL lines above"
    console.print(f"stayer {'[green]' if ok else '[red]'}{verdict}[/]", highlight=False)
    raise typer.Exit(EXIT_OK if ok else EXIT_FAILED)

"""``stayer images``: the Docker-free builder's cached layers (``--sandbox bwrap-image``),
listed and pruned. Each layer is a whole root filesystem: without pruning the cache
(``$STAYER_CACHE``, else ``~/.cache/stayer``) grows with every changed Dockerfile."""

from __future__ import annotations

import re
from typing import Annotated, Any

import typer

from stayer.cli.common import JsonFlag, bad_input, console, dash, emit_json, stderr, sub_app
from stayer.cli.options import DryRunOption, older_than_option

images_app = sub_app("images", "List and prune the cached layers of images built without Docker.")

_DURATION = re.compile(r"(\d+(?:\.\d+)?)([smhdw])")
_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
_SIZE = re.compile(r"(\d+(?:\.\d+)?)\s*([kmgt]?)(?:i?b)?", re.IGNORECASE)
_BYTES = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}


def parse_duration(value: str, flag: str) -> float:
    """``90s``, ``30m``, ``12h``, ``7d``, ``2w`` or a sum of them (``1d12h``): seconds."""
    text = value.strip().lower()
    parts = list(_DURATION.finditer(text))
    if not text or "".join(m.group(0) for m in parts) != text:
        bad_input(f"{flag} {value!r}: expected a duration such as 30m, 12h, 7d or 1d12h")
    return sum(float(m.group(1)) * _SECONDS[m.group(2)] for m in parts)


def parse_size(value: str, flag: str) -> int:
    """``500M``, ``10G``, ``1.5GiB``, ``2T`` or plain bytes (units of 1024)."""
    m = _SIZE.fullmatch(value.strip())
    if m is None:
        bad_input(f"{flag} {value!r}: expected a size such as 500M, 10G or 1.5GiB")
    return int(float(m.group(1)) * _BYTES[m.group(2).lower()])


def _human(n: int) -> str:
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024:
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{size:.1f} TiB"


def _cache() -> Any:
    from stayer.paths import cache_root

    return cache_root()


@images_app.command("list")
def list_command(json_out: JsonFlag = False) -> None:
    """Each cached layer: id, the Dockerfile and step that made it, size, last use.

    \b
    Example:  stayer images list --json
    """
    from stayer.environments.layers import list_layers
    from stayer.records import to_json

    cache = _cache()
    found = list_layers(cache)
    total = sum(layer.size_bytes for layer in found)
    if json_out:
        emit_json(
            {
                "cache": str(cache),
                "layers": to_json([layer.doc() for layer in found]),
                "total_bytes": total,
            }
        )
        return
    from stayer.tables import Col, FitTable, print_table, say

    table = FitTable(
        Col("id", whole=True),
        Col("size", number=True),
        Col("last used (UTC)", number=True),
        Col("in use", drop=3),
        Col("made by", drop=1),
        Col("image of", drop=2),
        box=None,
    )
    for layer in found:
        made_by = f"{layer.dockerfile} {layer.step}" if layer.dockerfile else None
        used = layer.doc().last_used
        table.add_row(
            layer.id,
            _human(layer.size_bytes),
            dash(used and used[:16].replace("T", " ")),
            "yes" if layer.in_use else "",
            dash(made_by),
            dash(", ".join(layer.images)),
        )
    out = console()
    print_table(out, table)
    say(out, f"{len(found)} layers, {_human(total)} in {cache}")


@images_app.command("prune")
def prune_command(
    older_than: Annotated[str | None, older_than_option("Remove images not used")] = None,
    keep_bytes: Annotated[
        str | None,
        typer.Option(
            "--keep-bytes",
            metavar="SIZE",
            help="Keep the most recently used images while they fit in SIZE (500M, 10G).",
        ),
    ] = None,
    everything: Annotated[
        bool, typer.Option("--all", help="Remove every layer not in use.")
    ] = False,
    dry_run: DryRunOption = False,
    json_out: JsonFlag = False,
) -> None:
    """Remove the least recently used layers that no kept image needs.

    An image is the last layer of a build (or a layer nothing was built on); it needs its
    own layer and those it was built on. A layer in use (by a build or a run of another
    process) is never removed.

    \b
    Example:  stayer images prune --older-than 14d --keep-bytes 20G
    """
    from rich.text import Text

    from stayer.environments.layers import prune

    if older_than is None and keep_bytes is None and not everything:
        bad_input("images prune: say what to remove with --older-than, --keep-bytes or --all")
    if everything and (older_than is not None or keep_bytes is not None):
        bad_input("--all: removes every layer; it takes no --older-than or --keep-bytes")
    seconds = None if older_than is None else parse_duration(older_than, "--older-than")
    size = None if keep_bytes is None else parse_size(keep_bytes, "--keep-bytes")
    err = stderr()
    cache = _cache()
    done = prune(
        cache,
        older_than=seconds,
        keep_bytes=size,
        everything=everything,
        dry_run=dry_run,
        log=lambda line: err.print(Text(line)),
    )
    if json_out:
        emit_json(
            {
                "cache": str(cache),
                "dry_run": dry_run,
                "removed": [layer.id for layer in done.removed],
                "freed_bytes": done.freed_bytes,
                "kept": [layer.id for layer in done.kept],
                "in_use": [layer.id for layer in done.in_use],
                "leftovers": done.leftovers,
            }
        )
        return
    verb = "would remove" if dry_run else "removed"
    out = console()
    for layer in done.removed:
        out.print(Text(f"{verb} {layer.id} ({_human(layer.size_bytes)})"))
    for layer in done.in_use:
        out.print(Text(f"kept {layer.id}: in use"))
    out.print(
        Text(
            f"{verb} {len(done.removed)} layers ({_human(done.freed_bytes)}); "
            f"kept {len(done.kept)}, {len(done.in_use)} in use"
        )
    )

"""``read_file``, ``write_file``, ``edit_file``: file access for the model, through the sandbox.

The host never opens these paths itself. Every read and write is a ``cat``/``sed`` inside the
sandbox, so a symlink the agent planted (``/app/link -> /etc/passwd``) resolves in the
sandbox's view of the filesystem, where everything outside ``/app`` and ``/tmp`` is
read-only or absent, and cannot reach the host. Paths are given as ``/app/...`` or relative
to ``/app``; commands run with cwd ``/app`` and address the file relatively, which also works
under the local backend (where ``/app`` is only a name for the workspace).
"""

from __future__ import annotations

import posixpath
import shlex
from typing import Any, TypeVar

import msgspec

from stayer.messages import ToolSpec
from stayer.tokens import TokenCounter
from stayer.tools.base import ToolContext, ToolResult, TypedTool

DEFAULT_LIMIT = 2000  # lines per read_file call
MAX_LINE_CHARS = 2000  # longer lines (minified code, data) are cut in the listing

_PATH_PROP = {
    "type": "string",
    "description": "File path: absolute under /app, or relative to /app.",
}


def _file_parameters(properties: dict[str, Any], required: list[str]) -> dict[str, Any]:
    """The JSON schema of a file tool's arguments: ``path``, then the tool's own, no others."""
    return {
        "type": "object",
        "properties": {"path": _PATH_PROP, **properties},
        "required": ["path", *required],
        "additionalProperties": False,
    }


class PathError(ValueError):
    """A path the file tools refuse; the message is meant for the model."""


def app_relative(path: str) -> str:
    """``path`` as a normalised path relative to ``/app``; PathError if it leaves ``/app``."""
    if not path or not path.strip():
        raise PathError("path is empty")
    if "\0" in path:
        raise PathError("path contains a NUL byte")
    norm = posixpath.normpath(path)
    if norm.startswith("/"):
        if norm == "/app":
            return "."
        if not norm.startswith("/app/"):
            raise PathError(f"{path} is outside /app; these tools only access files under /app")
        return norm[len("/app/") :]
    if norm == ".." or norm.startswith("../"):
        raise PathError(f"{path} is outside /app; these tools only access files under /app")
    return norm


def _shown(rel: str) -> str:
    return "/app" if rel == "." else f"/app/{rel}"


def _q(rel: str) -> str:
    # "./" keeps a name that starts with "-" from being read as an option, even where "--"
    # is not supported.
    return shlex.quote(rel if rel.startswith("/") else f"./{rel}")


def _stderr(res: Any) -> str:
    return (res.stderr.strip() or res.stdout.strip() or f"exit code {res.exit_code}")[:2000]


async def _read_whole(ctx: ToolContext, rel: str) -> str | ToolResult:
    """The file's text, or a ToolResult error saying why it cannot be edited as text."""
    res = await ctx.sandbox.exec(f"cat -- {_q(rel)}", timeout=ctx.command_timeout, cwd="/app")
    if res.timed_out:
        return ToolResult(f"reading {_shown(rel)} timed out", is_error=True)
    if res.exit_code != 0:
        return ToolResult(f"cannot read {_shown(rel)}: {_stderr(res)}", is_error=True)
    if res.truncated:
        return ToolResult(
            f"{_shown(rel)} is too large for edit_file; use bash (sed, python) instead",
            is_error=True,
        )
    if "\0" in res.stdout or "\ufffd" in res.stdout:
        return ToolResult(
            f"{_shown(rel)} is not UTF-8 text; edit_file would corrupt it, use bash instead",
            is_error=True,
        )
    return res.stdout


async def _write_whole(ctx: ToolContext, rel: str, content: str) -> ToolResult | None:
    """Write ``content`` to ``rel`` (creating parent directories); None on success."""
    parent = posixpath.dirname(rel) or "."
    res = await ctx.sandbox.exec(
        f"mkdir -p -- {_q(parent)} && cat > {_q(rel)}",
        timeout=ctx.command_timeout,
        stdin=content.encode("utf-8"),
        cwd="/app",
    )
    if res.timed_out:
        return ToolResult(f"writing {_shown(rel)} timed out", is_error=True)
    if res.exit_code != 0:
        return ToolResult(f"cannot write {_shown(rel)}: {_stderr(res)}", is_error=True)
    return None


class FileArgs(msgspec.Struct, kw_only=True):
    path: str


class ReadArgs(FileArgs, kw_only=True):
    offset: int | None = None
    limit: int | None = None


class WriteArgs(FileArgs, kw_only=True):
    content: str


class EditArgs(FileArgs, kw_only=True):
    old_string: str
    new_string: str
    replace_all: bool = False


A = TypeVar("A", bound=FileArgs)


class FileTool(TypedTool[A]):
    """A tool whose ``path`` argument names a file under /app: the path is checked here,
    once for every such tool; each error the tool reports starts with its name."""

    async def run(self, args: A, ctx: ToolContext) -> ToolResult:
        try:
            rel = app_relative(args.path)
        except PathError as e:
            return self.error(str(e))
        return await self.on_file(rel, args, ctx)

    async def on_file(self, rel: str, args: A, ctx: ToolContext) -> ToolResult:
        """The tool's work on ``rel`` (relative to /app, already checked)."""
        raise NotImplementedError

    def error(self, message: str) -> ToolResult:
        return ToolResult(f"{self.spec.name}: {message}", is_error=True)


class ReadFileTool(FileTool[ReadArgs]):
    """Numbered lines of a text file, a window at a time, cut to the output budget."""

    def __init__(self, counter: TokenCounter) -> None:
        self.counter = counter
        self.spec = ToolSpec(
            name="read_file",
            description=(
                "Read a text file under /app and return its lines numbered from 1, like cat -n. "
                f"At most `limit` lines (default {DEFAULT_LIMIT}) starting at line `offset` "
                "(default 1) are returned, and fewer if they do not fit the output budget; the "
                "result then says which offset to pass to continue. Lines longer than "
                f"{MAX_LINE_CHARS} characters are cut. Use it instead of cat, head or tail "
                "to look at files, including saved command outputs."
            ),
            parameters=_file_parameters(
                {
                    "offset": {
                        "type": "integer",
                        "minimum": 1,
                        "description": "First line to return, counting from 1.",
                    },
                    "limit": {
                        "type": "integer",
                        "minimum": 1,
                        "description": "Maximum number of lines to return.",
                    },
                },
                required=[],
            ),
        )

    async def on_file(self, rel: str, args: ReadArgs, ctx: ToolContext) -> ToolResult:
        offset = args.offset or 1
        limit = args.limit or DEFAULT_LIMIT
        last = offset + limit  # one line past the window: tells us whether more follow
        # sed stops reading at `last`, so a window near the top of a huge file is cheap.
        res = await ctx.sandbox.exec(
            f"if [ -d {_q(rel)} ]; then echo 'is a directory' >&2; exit 1; fi; "
            f"sed -n '{offset},{last}p;{last}q' -- {_q(rel)}",
            timeout=ctx.command_timeout,
            cwd="/app",
        )
        shown = _shown(rel)
        if res.timed_out:
            return self.error(f"reading {shown} timed out")
        if res.exit_code != 0:
            return self.error(f"cannot read {shown}: {_stderr(res)}")
        if "\0" in res.stdout:
            return self.error(
                f"{shown} is a binary file; inspect it with bash (xxd, file, strings)"
            )
        # Split on "\n" only, as sed counts lines (splitlines would also split on \r, \f...).
        lines = res.stdout.split("\n")
        if lines[-1] == "":
            lines.pop()
        more = len(lines) > limit
        lines = lines[:limit]
        if not lines:
            if offset == 1:
                return ToolResult(f"({shown} is empty)")
            return ToolResult(f"({shown} has fewer than {offset} lines)")
        numbered = []
        for n, line in enumerate(lines, start=offset):
            if len(line) > MAX_LINE_CHARS:
                line = line[:MAX_LINE_CHARS] + f" [... {len(line) - MAX_LINE_CHARS} chars cut]"
            numbered.append(f"{n:6}\t{line}")
        text = "\n".join(numbered)
        end = offset + len(numbered) - 1
        tokens = self.counter.encode(text)
        if len(tokens) > ctx.output_token_budget:
            head = self.counter.decode(tokens[: ctx.output_token_budget])
            kept = max(head.count("\n"), 1)  # whole lines only; always make progress
            text = "\n".join(numbered[:kept])
            end = offset + kept - 1
            more = True
        if more:
            text += (
                f"\n[showing lines {offset}-{end}; the file continues: "
                f"call read_file with offset={end + 1}]"
            )
        return ToolResult(text)


class WriteFileTool(FileTool[WriteArgs]):
    """Create or overwrite a file with exactly the given content."""

    spec = ToolSpec(
        name="write_file",
        description=(
            "Create a file under /app, or overwrite it entirely, with exactly `content`; "
            "missing parent directories are created. To change part of an existing file use "
            "edit_file instead, which does not require repeating the whole file."
        ),
        parameters=_file_parameters(
            {"content": {"type": "string", "description": "The complete new file content."}},
            required=["content"],
        ),
    )

    async def on_file(self, rel: str, args: WriteArgs, ctx: ToolContext) -> ToolResult:
        if rel == ".":
            return self.error("/app is a directory, give a file path")
        content = args.content
        err = await _write_whole(ctx, rel, content)
        if err is not None:
            return self.error(err.output)
        n_bytes = len(content.encode("utf-8"))
        n_lines = content.count("\n") + (1 if content and not content.endswith("\n") else 0)
        return ToolResult(f"wrote {n_bytes} bytes ({n_lines} lines) to {_shown(rel)}")


class EditFileTool(FileTool[EditArgs]):
    """Exact string replacement in a text file: the cheap way to change a large file."""

    spec = ToolSpec(
        name="edit_file",
        description=(
            "Edit a text file under /app by replacing an exact string: `old_string` must "
            "occur in the file exactly as given (including whitespace and indentation) and, "
            "unless `replace_all` is true, exactly once; include enough surrounding lines to "
            "make it unique. It is replaced by `new_string`. Read the file first so that the "
            "text matches. To create a file use write_file."
        ),
        parameters=_file_parameters(
            {
                "old_string": {"type": "string", "description": "Exact text to replace."},
                "new_string": {"type": "string", "description": "Text to put in its place."},
                "replace_all": {
                    "type": "boolean",
                    "description": "Replace every occurrence instead of requiring exactly one.",
                },
            },
            required=["old_string", "new_string"],
        ),
    )

    async def on_file(self, rel: str, args: EditArgs, ctx: ToolContext) -> ToolResult:
        old, new, replace_all = args.old_string, args.new_string, args.replace_all
        if not old:
            return self.error("old_string is empty; to create or overwrite a file use write_file")
        if old == new:
            return self.error("old_string and new_string are the same")
        text = await _read_whole(ctx, rel)
        if isinstance(text, ToolResult):
            return self.error(text.output)
        shown = _shown(rel)
        count = text.count(old)
        if count == 0:
            return self.error(
                f"old_string not found in {shown}; it must match exactly, including "
                "whitespace and indentation (read the file again to check)"
            )
        if count > 1 and not replace_all:
            return self.error(
                f"old_string occurs {count} times in {shown}; include more "
                "surrounding text to make it unique, or set replace_all to true"
            )
        line = text[: text.index(old)].count("\n") + 1
        err = await _write_whole(ctx, rel, text.replace(old, new))
        if err is not None:
            return self.error(err.output)
        what = f"{count} occurrences" if count > 1 else f"1 occurrence at line {line}"
        return ToolResult(f"edited {shown}: replaced {what}")

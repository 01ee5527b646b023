"""The ``memory`` tool: notes the agent keeps outside the context window.

Notes are appended to ``/app/.stayer/memory.md`` (so they persist with the workspace and
its snapshots, and the journal records every call), and the tool's replies are of the
``note`` retention class: context compaction never rewrites them, so what the agent chose
to remember is present verbatim however often old tool output is elided.
"""

from __future__ import annotations

import msgspec

from stayer.messages import ToolSpec
from stayer.tools.base import ToolContext, ToolResult, TypedTool

MEMORY_FILE = ".stayer/memory.md"


class MemoryArgs(msgspec.Struct, kw_only=True):
    action: str
    note: str | None = None


class MemoryTool(TypedTool[MemoryArgs]):
    spec = ToolSpec(
        name="memory",
        description=(
            "Save or read notes that must survive context compaction: decisions, findings, "
            "the plan, what remains to do. Old tool output may later be replaced by a stub in "
            "your context, but notes saved here stay verbatim. action='save' appends `note`; "
            "action='read' returns all notes."
        ),
        parameters={
            "type": "object",
            "properties": {
                "action": {"type": "string", "enum": ["save", "read"]},
                "note": {"type": "string", "description": "The note to save (action='save')."},
            },
            "required": ["action"],
            "additionalProperties": False,
        },
    )

    async def run(self, args: MemoryArgs, ctx: ToolContext) -> ToolResult:
        action = args.action
        if action == "save":
            note = (args.note or "").strip()
            if not note:
                return ToolResult("memory save needs a non-empty `note`", is_error=True)
            res = await ctx.sandbox.exec(
                f"mkdir -p .stayer && cat >> {MEMORY_FILE}",
                stdin=f"- {note}\n".encode(),
                timeout=ctx.command_timeout,
                cwd="/app",
            )
            if res.exit_code != 0:
                return ToolResult(
                    f"cannot save the note: {res.stderr.strip()[:500]}", is_error=True
                )
            return ToolResult(f"saved note: {note}", kind="note")
        if action == "read":
            res = await ctx.sandbox.exec(
                f"cat {MEMORY_FILE} 2>/dev/null || true", timeout=ctx.command_timeout, cwd="/app"
            )
            return ToolResult(res.stdout or "(no notes yet)", kind="note")
        return ToolResult(f"unknown action {action!r}; use 'save' or 'read'", is_error=True)

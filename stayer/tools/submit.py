"""The ``submit`` tool: the agent says it is done; the loop ends after this step."""

from __future__ import annotations

import msgspec

from stayer.messages import ToolSpec
from stayer.tools.base import ToolContext, ToolResult, TypedTool


class SubmitArgs(msgspec.Struct, kw_only=True):
    summary: str | None = None


class SubmitTool(TypedTool[SubmitArgs]):
    """Ends the episode. Verification happens outside, so this only records the summary."""

    spec = ToolSpec(
        name="submit",
        description=(
            "Call this once when the task is complete and the workspace in /app is in its "
            "final state; the episode ends after this call and your work is then checked. "
            "Do not call it while work remains. Optionally give a short summary of what you "
            "did and anything left unresolved."
        ),
        parameters={
            "type": "object",
            "properties": {
                "summary": {
                    "type": "string",
                    "description": "A few sentences on what was done.",
                }
            },
            "required": [],
            "additionalProperties": False,
        },
    )

    async def run(self, args: SubmitArgs, ctx: ToolContext) -> ToolResult:
        summary = (args.summary or "").strip()
        return ToolResult(
            "submitted" + (f": {summary}" if summary else ""), submitted=True, kind="result"
        )

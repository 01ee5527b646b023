"""The ``submit`` tool: the agent says it is done; the loop ends after this step."""

from __future__ import annotations

from typing import Any

from stayer.messages import ToolSpec
from stayer.tools.base import ToolContext, ToolResult


class SubmitTool:
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

    async def __call__(self, args: dict[str, Any], ctx: ToolContext) -> ToolResult:
        summary = str(args.get("summary") or "").strip()
        return ToolResult(
            "submitted" + (f": {summary}" if summary else ""), submitted=True, kind="result"
        )

"""The ``bash`` tool: one shell command in the sandbox, output cut to the context budget."""

from __future__ import annotations

import msgspec

from stayer.messages import ToolSpec
from stayer.tokens import TokenCounter, truncate_middle
from stayer.tools.base import ToolContext, ToolResult, TypedTool

# Saves stdin as the next free .stayer/outputs/<n>.txt and prints the path it used. Runs in
# the sandbox (not by the host opening the path) so that a .stayer symlink planted by the
# agent cannot redirect the write outside the workspace; numbering continues across tool
# instances and resumed runs because it looks at what is already there. ``set -C`` refuses
# to overwrite a file that appeared in between.
_SAVE = (
    "mkdir -p .stayer/outputs && cd .stayer/outputs && n=1 && "
    'while [ -e "$n.txt" ]; do n=$((n+1)); done && set -C && cat > "$n.txt" && '
    'echo "$PWD/$n.txt"'
)


class BashArgs(msgspec.Struct, kw_only=True):
    command: str


class BashTool(TypedTool[BashArgs]):
    """Runs ``command`` with ``/bin/bash -c`` via the sandbox, stderr merged into stdout."""

    def __init__(self, counter: TokenCounter) -> None:
        self.counter = counter
        self.spec = ToolSpec(
            name="bash",
            description=(
                "Run a shell command with /bin/bash -c in the sandbox, working directory /app "
                "(the task workspace). Every call starts a fresh shell: cd, exported variables "
                "and background processes do not carry over to the next call, so chain steps "
                "with && or put them in a script. The result is stdout and stderr interleaved, "
                "then the exit code. The command is killed, with everything it started, after "
                "a time limit, so do not start servers or watchers that never exit. Very long "
                "output is cut in the middle and the full text is saved to a file under "
                "/app/.stayer/outputs/ whose path is given, to read in parts with read_file "
                "or search with grep. Prefer read_file, write_file and edit_file for files."
            ),
            parameters={
                "type": "object",
                "properties": {
                    "command": {
                        "type": "string",
                        "description": "The shell command or script to run.",
                    }
                },
                "required": ["command"],
                "additionalProperties": False,
            },
            effects="sandboxed",  # restorable unless the sandbox has the network
        )

    async def run(self, args: BashArgs, ctx: ToolContext) -> ToolResult:
        command = args.command
        if not command.strip():
            return ToolResult("bash: the command is empty", is_error=True)
        # A first line `exec 2>&1` interleaves stderr with stdout in order, as in a terminal,
        # without wrapping (and so changing the meaning of) the model's own text.
        res = await ctx.sandbox.exec(
            "exec 2>&1\n" + command, timeout=ctx.command_timeout, cwd="/app"
        )
        body = res.stdout + res.stderr
        if res.timed_out:
            tail = f"[timed out after {ctx.command_timeout:g} s: the command and all its child processes were killed]"
        else:
            tail = f"[exit code: {res.exit_code}]"
        if not body:
            body = "(no output)\n"
        elif not body.endswith("\n"):
            body += "\n"
        text = body + tail
        if res.truncated:
            text += "\n[output exceeded the sandbox capture limit; its middle was dropped]"
        text = await self._fit(text, ctx)
        return ToolResult(text, is_error=res.timed_out)

    async def _fit(self, text: str, ctx: ToolContext) -> str:
        """``text`` if it fits the budget; otherwise head + tail and where the rest is."""
        budget = ctx.output_token_budget
        # Cheap exit: a token is never shorter than one UTF-8 byte.
        if (
            len(text.encode("utf-8", errors="replace")) <= budget
            or self.counter.count(text) <= budget
        ):
            return text
        saved = await ctx.sandbox.exec(
            _SAVE,
            timeout=ctx.command_timeout,
            stdin=text.encode("utf-8", errors="replace"),
            cwd="/app",
        )
        if saved.exit_code == 0 and saved.stdout.strip():
            note = f"full output saved to {saved.stdout.strip()}"
        else:
            note = "the full output could not be saved: " + (
                saved.stderr.strip() or f"exit {saved.exit_code}"
            )
        cut, _ = truncate_middle(text, budget, self.counter, note=note)
        return cut

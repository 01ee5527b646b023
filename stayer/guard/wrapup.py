"""Wrap-up: the last steps of a run that hit a limit, and the summary it ends with.

A hard stop that throws the work away (an empty submission) is the worst outcome of a
budget: the next run starts blind. So at a soft threshold the agent is told to stop
starting work and to report; a slice of the budget reserved from the start pays for at
most ``wrapup_steps`` such calls. If the model still produces nothing usable, the summary
is built from the trajectory: never an empty result.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from decimal import Decimal

from stayer.messages import Message, tool_outcomes

WRAP_UP_KIND = "wrap_up"  # Message.kind of the instruction (models can key on it)
FILE_TOOLS = ("write_file", "edit_file")
# A submission shorter than this (after "submitted") carries no state worth keeping.
MIN_SUMMARY_CHARS = 20


def instruction(reason: str, detail: str, steps_left: int) -> Message:
    text = (
        f"[stayer wrap-up] This run is ending ({reason}: {detail}). You have at most {steps_left} "
        "more step(s) and a small reserved budget. Do not start new work. Call `submit` now with "
        "a summary in three parts — DONE: what you completed; REMAINING: what is left to do; "
        "STATE: the current state of the workspace (files changed, what passes or fails)."
    )
    return Message(role="user", content=text, kind=WRAP_UP_KIND)


def usable(summary: str) -> bool:
    return len(summary.removeprefix("submitted").strip(": \n")) >= MIN_SUMMARY_CHARS


def summary_from_trajectory(
    messages: Sequence[Message], reason: str, detail: str, steps: int, spent: Decimal | None
) -> str:
    """What the run did, from its messages: the last actions and their outcome, files
    touched, and where it stopped."""
    tool_results = [m for m in messages if m.role == "tool"]
    digest = list(tool_outcomes(tool_results[-10:], messages))
    files: list[str] = []
    for m in messages:
        for c in m.tool_calls:
            if c.name in FILE_TOOLS:
                try:
                    path = json.loads(c.arguments).get("path")
                except (ValueError, AttributeError):
                    path = None
                if isinstance(path, str) and path not in files:
                    files.append(path)
    cost = "" if spent is None else f", ${spent:.6f} spent"
    lines = [f"Stopped before the task was finished ({reason}: {detail})."]
    lines.append(
        f"DONE: {steps} step(s){cost}; the last actions:"
        if digest
        else f"DONE: {steps} step(s){cost}; no tool was run."
    )
    lines += digest
    lines.append(
        "REMAINING: the agent did not submit the task as complete; what is left is unknown to the "
        "harness — continue from the state below and verify."
    )
    state = (
        f"files written or edited: {', '.join(files)}"
        if files
        else "no file was written with the file tools"
    )
    last = next(
        (m for m in reversed(messages) if m.role == "assistant" and m.content.strip()), None
    )
    if last is not None:
        state += f"; the agent's last words: {last.content.strip()[:300]}"
    lines.append(f"STATE: {state}.")
    return "\n".join(lines)

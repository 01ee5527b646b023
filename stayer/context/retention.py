"""Retention classes: what a compaction may do to each message.

* ``pinned`` — system prompt, tool schemas, the task: the stable prefix, never touched.
* ``keep`` — what the agent decided and learned: its own turns (reasoning, actions),
  notes saved with the memory tool, tool errors, the final submission. Never rewritten, so
  it is present verbatim after any number of compactions.
* ``evictable`` — tool output: large, re-derivable, and saved in the workspace, so it can
  be replaced by a stub that names the file holding it.
* ``ephemeral`` — nudges and other loop chatter: dropped to a stub at the next compaction.
"""

from __future__ import annotations

from enum import StrEnum

from stayer.messages import Message


class Retention(StrEnum):
    PINNED = "pinned"
    KEEP = "keep"
    EVICTABLE = "evictable"
    EPHEMERAL = "ephemeral"


# Message.kind values set by the loop and the tools.
KEEP_KINDS = frozenset({"note", "decision", "result", "error", "summary"})
EPHEMERAL_KINDS = frozenset({"nudge"})


def retention_of(m: Message) -> Retention:
    if m.kind == "task":
        return Retention.PINNED
    if m.kind in EPHEMERAL_KINDS:
        return Retention.EPHEMERAL
    if (
        m.role == "tool"
        and not m.is_error
        and m.kind not in KEEP_KINDS
        and not m.kind.startswith("elided")
    ):
        return Retention.EVICTABLE
    return Retention.KEEP

"""Provider-neutral histories for property tests of the adapters' request encoding."""

from __future__ import annotations

from hypothesis import strategies as st

from stayer.models.base import Message, ToolCall

TEXTS = st.sampled_from(["", "  ", "plain", "ünïcode ✓", 'quote " and \\ slash', "x" * 50])


@st.composite
def histories(draw: st.DrawFn) -> list[Message]:
    history = []
    for i in range(draw(st.integers(0, 12))):
        kind = draw(st.sampled_from(["user", "assistant", "tool", "tool-no-id"]))
        if kind == "assistant":
            calls = tuple(
                ToolCall(
                    f"c{i}.{k}",
                    "bash",
                    draw(st.sampled_from(['{"command": "ls"}', "not json", "", "[1]"])),
                )
                for k in range(draw(st.integers(0, 2)))
            )
            history.append(Message("assistant", draw(TEXTS), calls))
        elif kind == "tool":
            history.append(
                Message("tool", draw(TEXTS), tool_call_id=f"c{i}", is_error=draw(st.booleans()))
            )
        elif kind == "tool-no-id":
            history.append(Message("tool", draw(TEXTS)))
        else:
            history.append(Message("user", draw(TEXTS)))
    return history

"""The rows the journal writes on its own paths (a tool call, an outside reading, a
resume, an agent event) keep the bytes the dicts they were built as wrote, and read back."""

from __future__ import annotations

import asyncio
import json

from stayer.events import SummaryFailed
from stayer.journal import open_store
from stayer.journal.log import load_log
from stayer.journal.replay import JournaledTool
from stayer.journal.session import RunJournal
from stayer.messages import ToolSpec
from stayer.pricing import PriceBook
from stayer.tools.base import ToolContext, ToolResult


class Echo:
    spec = ToolSpec("echo", "echo", {"type": "object"})

    async def __call__(self, args: dict, ctx: ToolContext) -> ToolResult:
        return ToolResult(f"é {args['x']}", kind="note", outcome="unknown")


def test_rows_of_a_tool_call_a_reading_an_event_and_a_resume(tmp_path) -> None:
    store = open_store(tmp_path / "home", "")
    (tmp_path / "ws").mkdir()
    header = {"task": "t", "model": "m"}
    journal = RunJournal.create(store, "rows", header, tmp_path / "ws", PriceBook.load())
    ctx = ToolContext(sandbox=None, workspace=str(tmp_path / "ws"))  # type: ignore[arg-type]
    done = asyncio.run(JournaledTool(Echo(), journal)({"x": 1}, ctx))
    assert journal.read_outside(lambda: {"b": [1.5, "ü"]}) == {"b": [1.5, "ü"]}
    journal.on_event(SummaryFailed(agent="main", model="m", error="x"))
    journal.flush()
    journal.release()
    row, log = RunJournal.load(store, "rows")
    RunJournal.reopen(store, row, log, tmp_path / "ws", PriceBook.load()).release()
    rows = store._read(
        "SELECT kind, data FROM stayer_events WHERE run_id = 'rows' ORDER BY seq", ()
    )
    output = json.loads(rows[2][1])["output"]
    payload = json.loads(rows[4][1])["payload"]
    assert rows[1:] == [
        ("tool_started", '{"t":0,"name":"echo"}'),
        (
            "tool_finished",
            f'{{"t":0,"name":"echo","output":"{output}","nested":false,"is_error":false,'
            '"submitted":false,"kind":"note","outcome":"unknown"}',
        ),
        ("observed", '{"i":0,"value":{"b":[1.5,"\\u00fc"]}}'),
        ("summary_failed", f'{{"i":0,"payload":"{payload}"}}'),
        ("resumed", f'{{"owner":"{json.loads(rows[5][1])["owner"]}","from_seq":5,"torn":0}}'),
    ]
    back = load_log(store, "rows")
    assert back.tools[0].result(ToolResult.text(back.blobs[output])) == done
    assert back.observations == {0: {"b": [1.5, "ü"]}}
    assert back.agent_events == {0: ("summary_failed", payload)} and back.header == header
    store.close()

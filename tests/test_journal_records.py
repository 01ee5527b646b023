"""The journal's records write the bytes the dicts they replaced wrote (key order too)."""

from __future__ import annotations

import json

from stayer.journal.codec import MessageRecord, canonical
from stayer.journal.log import ModelFinishedRecord
from stayer.messages import Message, ToolCall
from stayer.records import from_json, to_json
from stayer.usage import Usage


def test_a_message_is_written_as_before_and_reads_back_equal() -> None:
    plain = Message("user", "hi")
    full = Message("assistant", "é \ud800", (ToolCall("c1", "bash", '{"x":1}'),), "t", True, "note")
    assert json.dumps(to_json(MessageRecord.of(plain))) == '{"role": "user", "content": "hi"}'
    assert json.dumps(to_json(MessageRecord.of(full))) == (
        '{"role": "assistant", "content": "\\u00e9 \\ud800", "tool_calls": [{"id": "c1", '
        '"name": "bash", "arguments": "{\\"x\\":1}"}], "tool_call_id": "t", '
        '"is_error": true, "kind": "note"}'
    )
    assert canonical(Message("tool", "", (), "", False, "")) == b'{"content":"","role":"tool"}'
    for m in (plain, full):
        assert canonical(m) == canonical(MessageRecord.of(m))
        assert from_json(json.loads(canonical(m)), MessageRecord).message() == m


def test_a_model_finished_row_keeps_its_keys_in_order() -> None:
    rec = ModelFinishedRecord(
        n=2,
        message="ab",
        usage=Usage(10, output_tokens=3),
        raw_usage={"input_tokens": 10},
        model="gpt-5",
        latency_s=0.5,
    )
    row = to_json(rec)
    assert list(row) == [
        "n",
        "message",
        "usage",
        "raw_usage",
        "model",
        "latency_s",
        "stop_reason",
        "service_tier",
    ]
    assert row["usage"] == Usage(10, output_tokens=3).to_dict()
    old = {**row, "latency_s": 1}
    del old["stop_reason"], old["service_tier"]  # written before those fields existed
    back = from_json(old, ModelFinishedRecord)
    assert (back.latency_s, back.stop_reason, back.service_tier) == (1.0, "", None)

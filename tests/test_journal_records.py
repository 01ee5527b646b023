"""The journal's records write the bytes the dicts they replaced wrote (key order too)."""

from __future__ import annotations

import json

from stayer.events import Handoff, event_record
from stayer.journal import open_store
from stayer.journal.codec import MessageRecord, canonical
from stayer.journal.log import ModelFailedRecord, ModelFinishedRecord, SnapshotRecord, load_log
from stayer.journal.session import RunJournal
from stayer.ledger import OutcomeUnknown
from stayer.messages import Message, ToolCall
from stayer.pricing import PriceBook
from stayer.records import from_json, to_json
from stayer.routing.router import RouteRecord
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


def test_rows_of_several_kinds_are_stored_as_these_bytes(tmp_path) -> None:
    """The bytes of a few kinds of rows, as the store writes them (ASCII-escaped, no
    spaces, the keys in the order they were written; a thread's tag last)."""
    store = open_store(tmp_path / "home", "")
    header = {"task": "é", "model": "m"}
    journal = RunJournal.create(store, "pin", header, tmp_path / "ws", PriceBook.load())
    journal.record("model_failed", to_json(ModelFailedRecord(0, "boom ü")))
    unknown = OutcomeUnknown(step=1, tool="t", call_id="c", idempotency_key="k", sent_at="s")
    journal.outcome_unknown(unknown)
    journal.tags = {"thread": "w"}
    journal.record("model_failed", ModelFailedRecord(1, "x"))  # a record, tagged
    journal.record("thread_started", {"thread": "w", "message": 3}, durable=True)
    rows = store._read("SELECT kind, data FROM stayer_events WHERE run_id = 'pin' ORDER BY seq", ())
    assert rows == [
        ("run_created", '{"header":{"task":"\\u00e9","model":"m"}}'),
        ("model_failed", '{"n":0,"error":"boom \\u00fc"}'),
        (
            "outcome_unknown",
            '{"agent":"main","step":1,"tool":"t","call_id":"c","idempotency_key":"k","sent_at":"s"}',
        ),
        ("model_failed", '{"n":1,"error":"x","thread":"w"}'),
        ("thread_started", '{"thread":"w","message":3}'),
    ]
    store.close()


def test_a_routes_handoff_is_the_event_without_its_agent() -> None:
    handoff = Handoff(
        agent="lead",
        kind="handoff",
        chosen="summary",
        receiver_model="m",
        expected_steps=3,
        tokens={"brief": 1, "summary": 2, "full": 3},
        expected_cost_usd={"brief": "0.1", "summary": None},
        to="coder",
        asked=None,
        passed="summary",
    )
    kind, payload = event_record(handoff)
    del payload["agent"]
    route = to_json(RouteRecord(handoff=handoff.priced()))
    assert (kind, list(route["handoff"].items())) == ("handoff", list(payload.items()))
    assert from_json(route, RouteRecord).handoff == handoff.priced()


def test_snapshot_rows_are_written_as_before_and_read_back(tmp_path) -> None:
    store = open_store(tmp_path / "home", "")
    (tmp_path / "ws").mkdir()
    header = {"task": "t", "model": "m"}
    journal = RunJournal.create(store, "snap", header, tmp_path / "ws", PriceBook.load())
    journal.take_snapshot(1)
    team = SnapshotRecord(
        step=2, id="x", tools_done=0, model_calls=0, threads={"a": 3}, thread_steps={"a": 1}
    )
    journal.record("snapshot", team, durable=True)
    rows = store._read("SELECT data FROM stayer_events WHERE kind = 'snapshot' ORDER BY seq", ())
    own = rows[0][0]
    assert own.startswith('{"step":1,"id":"') and own.endswith('","tools_done":0,"model_calls":0}')
    assert rows[1][0] == (
        '{"step":2,"id":"x","tools_done":0,"model_calls":0,'
        '"threads":{"a":3},"thread_steps":{"a":1}}'
    )
    assert load_log(store, "snap").snapshots[1] == team
    store.close()

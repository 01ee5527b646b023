"""Side effects that happen once (issue 39): effects declarations, the call's idempotency
key, and the journal's rules for a side-effecting call on resume and on a takeover, in
process on SQLite and PostgreSQL. The kill -9 property test is test_effects_kill.py."""

from __future__ import annotations

import asyncio
import json
import uuid
from pathlib import Path
from types import SimpleNamespace

import pytest
from pg_server import database_fixture

from stayer.journal import LeaseLost, RunJournal, load_log, open_store
from stayer.journal.codec import canonical
from stayer.journal.effects import effect_log
from stayer.journal.replay import JournaledTool
from stayer.journal.run_report import run_report
from stayer.messages import Effects, ToolSpec
from stayer.pricing import PriceBook
from stayer.runtime.events import public_event
from stayer.tools.base import ToolContext, ToolResult
from stayer.tools.bash import BashTool
from stayer.tools.effects import CallRef, effects_of, from_mcp_annotations, side_effecting

pg_url = database_fixture()


def test_mcp_annotations_map_to_effects():
    assert from_mcp_annotations() == "destructive"  # the MCP spec's defaults
    assert from_mcp_annotations(read_only=True) == "read_only"
    assert from_mcp_annotations(read_only=True, destructive=True) == "read_only"
    assert from_mcp_annotations(idempotent=True) == "idempotent"
    assert from_mcp_annotations(destructive=True, idempotent=True) == "idempotent"
    assert from_mcp_annotations(destructive=False) == "additive"
    assert from_mcp_annotations(False, False, False) == "additive"
    assert [side_effecting(e) for e in ("read_only", "restorable", "idempotent")] == [
        False,
        False,
        True,
    ]
    assert side_effecting("additive") and side_effecting("destructive")


def test_bash_is_restorable_unless_the_sandbox_has_the_network():
    spec = BashTool(None).spec  # type: ignore[arg-type]
    assert effects_of(spec, SimpleNamespace(allow_net=False)) == "restorable"
    assert effects_of(spec, SimpleNamespace(allow_net=True)) == "destructive"
    assert effects_of(spec, object()) == "restorable"
    files = ToolSpec("read_file", "", {})
    assert effects_of(files, SimpleNamespace(allow_net=True)) == "restorable"


def test_the_idempotency_key_is_the_calls_alone():
    ref = CallRef("run-1", "main", 3, "call_a", 0)
    assert ref.idempotency_key == CallRef("run-1", "main", 3, "call_a", 0).idempotency_key
    assert ref.idempotency_key.startswith("stayer-") and len(ref.idempotency_key) == 47
    others = [
        CallRef("run-2", "main", 3, "call_a", 0),
        CallRef("run-1", "main/sub", 3, "call_a", 0),
        CallRef("run-1", "main", 4, "call_a", 0),
        CallRef("run-1", "main", 3, "call_b", 0),
        CallRef("run-1", "main", 3, "call_a", 1),
    ]
    assert len({ref.idempotency_key, *(o.idempotency_key for o in others)}) == 6


class Charge:
    """A side-effecting tool: each call it receives is one charge, with the key it got."""

    def __init__(self, effects: Effects = "additive") -> None:
        self.spec = ToolSpec(
            "charge",
            "charge",
            {"type": "object", "properties": {"n": {"type": "integer"}}},
            effects,
        )
        self.sent: list[tuple[int, str]] = []
        self.die = False  # the process dies with the call in flight

    async def __call__(self, args: dict, ctx: ToolContext) -> ToolResult:
        assert ctx.call is not None
        self.sent.append((args["n"], ctx.call.idempotency_key))
        if self.die:
            raise SystemExit  # not an Exception: nothing after it runs, as with kill -9
        return ToolResult(f"charged {args['n']}")


@pytest.fixture(params=["sqlite", "postgres"])
def store(request, tmp_path):
    url = request.getfixturevalue("pg_url") if request.param == "postgres" else ""
    s = open_store(tmp_path / "home", url)
    yield s
    s.close()


def call(tool, n: int, ctx: ToolContext, step: int = 1):  # noqa: ANN001, ANN201
    ref = CallRef("r", "main", step, f"c{n}")
    return asyncio.run(tool({"n": n}, ToolContext(ctx.sandbox, ctx.workspace, call=ref)))


def start(store, tmp_path: Path, run_id: str = "") -> tuple[RunJournal, ToolContext]:  # noqa: ANN001
    ws = tmp_path / "ws"
    ws.mkdir(exist_ok=True)
    run_id = run_id or f"r-{uuid.uuid4().hex[:8]}"  # PostgreSQL: one database for the module
    journal = RunJournal.create(store, run_id, {"task": "t", "model": "m"}, ws, PriceBook.load())
    journal.take_snapshot(0)
    return journal, ToolContext(sandbox=None, workspace=str(ws))  # type: ignore[arg-type]


def resume(store, tmp_path: Path, run_id: str) -> RunJournal:  # noqa: ANN001
    row, log = RunJournal.load(store, run_id)
    journal = RunJournal.reopen(store, row, log, tmp_path / "ws", PriceBook.load())
    journal.restore_workspace(lambda path: None)
    return journal


def crash(journal: RunJournal) -> None:
    """The process dies: whatever was not written is lost, the lease is free at once."""
    journal.store.release(journal.run_id, journal.owner)


@pytest.mark.parametrize("effects", ["additive", "destructive", "idempotent"])
def test_a_recorded_result_is_fed_back_never_sent_again(store, tmp_path, effects):
    """Whether the result reached the event journal (call 1) or only the effect log (call
    2, whose tool_finished was still buffered at the crash), even though both calls are
    after the restored snapshot, where a restorable tool would run again."""
    journal, ctx = start(store, tmp_path)
    charge = Charge(effects)
    tool = JournaledTool(charge, journal)
    first = call(tool, 1, ctx)
    journal.flush()
    second = call(tool, 2, ctx)
    crash(journal)  # call 2's tool_finished is lost with the process
    assert len(charge.sent) == 2

    again = resume(store, tmp_path, journal.run_id)
    tool = JournaledTool(charge, again)
    assert [call(tool, 1, ctx), call(tool, 2, ctx)] == [first, second]
    assert len(charge.sent) == 2  # neither sent again
    rows = effect_log(store).of_run(journal.run_id)
    assert [(r.state, r.sends, r.effects) for r in rows] == [("done", 1, effects)] * 2


def test_a_lost_result_of_an_idempotent_call_is_sent_again_with_the_same_key(store, tmp_path):
    journal, ctx = start(store, tmp_path)
    charge = Charge("idempotent")
    charge.die = True
    with pytest.raises(SystemExit):
        call(JournaledTool(charge, journal), 1, ctx)
    crash(journal)

    charge.die = False
    result = call(JournaledTool(charge, resume(store, tmp_path, journal.run_id)), 1, ctx)
    assert result.output == "charged 1" and not result.is_error
    assert len(charge.sent) == 2 and charge.sent[0] == charge.sent[1]  # the same key
    (row,) = effect_log(store).of_run(journal.run_id)
    assert (row.state, row.sends, row.key) == ("done", 2, charge.sent[0][1])


@pytest.mark.parametrize("effects", ["additive", "destructive"])
def test_a_lost_result_of_another_call_is_unknown_never_repeated(store, tmp_path, effects):
    journal, ctx = start(store, tmp_path)
    charge = Charge(effects)
    charge.die = True
    with pytest.raises(SystemExit):
        call(JournaledTool(charge, journal), 1, ctx)
    crash(journal)
    charge.die = False

    warned: list[str] = []
    again = resume(store, tmp_path, journal.run_id)
    again.warn = warned.append
    result = call(JournaledTool(charge, again), 1, ctx)
    assert result.is_error and "the outcome of this call is unknown" in result.output
    assert charge.sent[0][1] in result.output  # the key, to look the call up by
    assert len(charge.sent) == 1 and "not sent again" in warned[0]
    later = call(JournaledTool(charge, again), 2, ctx, step=2)  # the run goes on
    assert later.output == "charged 2"
    crash(again)

    # Resumed once more (the unknown answer's tool_finished was lost too): the same answer.
    third = resume(store, tmp_path, journal.run_id)
    tool = JournaledTool(charge, third)
    assert call(tool, 1, ctx) == result and call(tool, 2, ctx, step=2) == later
    assert len(charge.sent) == 2
    states = {r.key: r.state for r in effect_log(store).of_run(journal.run_id)}
    assert sorted(states.values()) == ["done", "unknown"]


def test_an_unknown_outcome_is_a_journal_record_written_once(store, tmp_path):
    """The run itself says it: one ``outcome_unknown`` record (tool, call id, key), even
    when the resume that decided it crashed before writing it (the effect log's row said
    ``unknown`` already) and the run is resumed twice more."""
    journal, ctx = start(store, tmp_path)
    charge = Charge("additive")
    charge.die = True
    with pytest.raises(SystemExit):
        call(JournaledTool(charge, journal), 1, ctx, step=3)
    crash(journal)
    charge.die = False
    key = charge.sent[0][1]
    # Decided unknown, then the process died before its events were written.
    deciding = resume(store, tmp_path, journal.run_id)
    deciding.warn = lambda line: None
    first = call(JournaledTool(charge, deciding), 1, ctx, step=3)
    assert first.outcome == "unknown"
    crash(deciding)
    assert load_log(store, journal.run_id).unknown == []
    for _ in range(2):  # answered from the effect log, then from the event journal
        again = resume(store, tmp_path, journal.run_id)
        assert call(JournaledTool(charge, again), 1, ctx, step=3) == first
        again.flush()
        crash(again)
    records = [e.data for e in store.events(journal.run_id) if e.kind == "outcome_unknown"]
    assert records == [
        {
            "agent": "main",
            "step": 3,
            "tool": "charge",
            "call_id": "c1",
            "idempotency_key": key,
            "sent_at": effect_log(store).get(journal.run_id, key).sent_at,
        }
    ]
    assert load_log(store, journal.run_id).unknown == records
    assert len(charge.sent) == 1
    # As `stayer report` and the runtime's event stream show it.
    report = run_report(store, store.run(journal.run_id))
    assert report["totals"]["outcome_unknown"] == 1 and report["outcome_unknown"] == records
    public = [public_event(journal.run_id, e, store.get_blob) for e in store.events(journal.run_id)]
    [event] = [p for p in public if p is not None and p.type == "outcome_unknown"]
    assert {k: v for k, v in event.data.items() if k not in ("run_id", "at")} == records[0]


def test_the_runtimes_ledger_lists_the_unknown_outcomes(tmp_path, monkeypatch):
    """``GET /v1/runs/{id}/ledger`` of a run (unfinished) whose call's outcome is unknown."""
    pytest.importorskip("fastapi")
    from service_helpers import copy_tasks
    from starlette.testclient import TestClient

    from stayer.runtime.api import create_app

    monkeypatch.delenv("STAYER_DB", raising=False)
    app = create_app(tmp_path / "home", copy_tasks(tmp_path / "tasks", "hello-file"))
    db = app.state.databases.get()
    client = TestClient(app, headers={"Authorization": f"Bearer {db.create_tenant('acme')}"})
    run = client.post("/v1/runs", json={"task": "hello-file", "model": "sim:claude-sonnet-4-5"})
    run_id = run.json()["id"]
    assert client.get(f"/v1/runs/{run_id}/ledger").json()["outcome_unknown"] == []
    journal, ctx = start(db.store, tmp_path, run_id)  # the run, as a worker journals it
    charge = Charge("destructive")
    charge.die = True
    with pytest.raises(SystemExit):
        call(JournaledTool(charge, journal), 1, ctx)
    crash(journal)
    again = resume(db.store, tmp_path, run_id)
    again.warn = lambda line: None
    assert call(JournaledTool(charge, again), 1, ctx).outcome == "unknown"
    again.flush()
    [shown] = client.get(f"/v1/runs/{run_id}/ledger").json()["outcome_unknown"]
    assert (shown["tool"], shown["call_id"]) == ("charge", "c1")
    assert shown["idempotency_key"] == charge.sent[0][1]


def test_a_worker_that_lost_the_run_sends_nothing(store, tmp_path):
    """The runtime's takeover: a stalled worker's lease expired and another took the run.
    The new one is told the in-flight call's outcome is unknown; the old one can no longer
    commit an intent, so it sends nothing."""
    old, ctx = start(store, tmp_path)
    charge = Charge("additive")
    charge.die = True
    with pytest.raises(SystemExit):
        call(JournaledTool(charge, old), 1, ctx)
    charge.die = False
    # The old worker stalls; its lease expires and another worker claims the run.
    row, log = RunJournal.load(store, old.run_id)
    store.claim(old.run_id, "worker-2", 30.0, lambda owner: True)
    new = RunJournal.reopen(store, row, log, tmp_path / "ws", PriceBook.load(), owner="worker-2")
    assert call(JournaledTool(charge, new), 1, ctx).is_error

    with pytest.raises(LeaseLost):
        call(JournaledTool(charge, old), 2, ctx, step=2)
    assert len(charge.sent) == 1
    assert [r.state for r in effect_log(store).of_run(old.run_id)] == ["unknown"]


def test_restorable_and_read_only_tools_keep_their_replay(store, tmp_path):
    """Nothing changes for tools whose effects stay in the workspace: no effect rows, and
    a call after the restored snapshot runs again to rebuild the workspace."""
    journal, ctx = start(store, tmp_path)
    charge = Charge("restorable")
    tool = JournaledTool(charge, journal)
    call(tool, 1, ctx)
    journal.flush()
    crash(journal)
    call(JournaledTool(charge, resume(store, tmp_path, journal.run_id)), 1, ctx)
    assert len(charge.sent) == 2 and effect_log(store).of_run(journal.run_id) == []


def test_pruning_a_run_deletes_its_effect_rows(store, tmp_path):
    journal, ctx = start(store, tmp_path)
    call(JournaledTool(Charge(), journal), 1, ctx)
    journal.finish({"status": "failed", "steps": 1, "cost_usd": "0"})
    assert len(effect_log(store).of_run(journal.run_id)) == 1
    assert store.delete_runs([journal.run_id]).runs == [journal.run_id]
    assert effect_log(store).of_run(journal.run_id) == []


class Echo(Charge):
    """A side-effecting tool whose result is whatever text it was given."""

    def __init__(self, text: str) -> None:
        super().__init__("additive")
        self.text = text

    async def __call__(self, args: dict, ctx: ToolContext) -> ToolResult:
        await super().__call__(args, ctx)
        return ToolResult(self.text, is_error=True)


@pytest.mark.parametrize(
    "text",
    ["nul\x00byte", "lone \ud800 surrogate", "x" * 3_000_000 + "é"],
    ids=["nul", "surrogate", "huge"],
)
def test_an_odd_result_is_kept_as_the_tool_gave_it(store, tmp_path, text):
    """A result the call's effect log must not lose: a NUL (which PostgreSQL's text
    refuses), a lone surrogate (from a tool's JSON; not UTF-8), megabytes. Fed back on
    resume exactly, from the effect log and from the event journal."""
    journal, ctx = start(store, tmp_path)
    echo = Echo(text)
    tool = JournaledTool(echo, journal)
    first = call(tool, 1, ctx)
    journal.flush()
    second = call(tool, 2, ctx)
    assert first.output == second.output == text
    crash(journal)  # call 2's tool_finished is lost: only the effect log has its result
    tool = JournaledTool(echo, resume(store, tmp_path, journal.run_id))
    assert [call(tool, 1, ctx), call(tool, 2, ctx)] == [first, second]
    assert len(echo.sent) == 2


def test_another_runs_rows_never_answer_a_resumed_run(store, tmp_path):
    """Two runs of one store (the runtime's tenants share it), one with an odd id, whose
    calls carry the same key: each run's resume reads its own rows only."""
    first, ctx = start(store, tmp_path)
    ws = tmp_path / "ws"
    odd = "r-'; DROP TABLE stayer_effects; --\u00e9 /..\\%_"
    second = RunJournal.create(store, odd, {"task": "t", "model": "m"}, ws, PriceBook.load())
    second.take_snapshot(0)
    charge = Charge("additive")
    assert call(JournaledTool(charge, first), 1, ctx).output == "charged 1"
    crash(first)
    charge.die = True
    with pytest.raises(SystemExit):
        call(JournaledTool(charge, second), 1, ctx)  # the same CallRef, hence key
    crash(second)
    charge.die = False

    assert call(JournaledTool(charge, resume(store, tmp_path, odd)), 1, ctx).is_error
    fed = call(JournaledTool(charge, resume(store, tmp_path, first.run_id)), 1, ctx)
    assert fed.output == "charged 1" and len(charge.sent) == 2
    states = {r.run_id: r.state for r in effect_log(store).of_run(odd)}
    assert states == {odd: "unknown"}
    assert [r.state for r in effect_log(store).of_run(first.run_id)] == ["done"]


def test_arguments_that_are_not_utf8_are_keyed_not_fatal(store, tmp_path):
    """A model's arguments may decode to a lone surrogate (``"\\ud800"`` in its JSON): the
    call is still keyed, sent once and fed back on resume, like any other."""
    journal, ctx = start(store, tmp_path)
    charge = Charge("additive")
    tool = JournaledTool(charge, journal)
    ref = CallRef("r", "main", 1, "c1")
    args = {"n": 1, "note": "lone \ud800 surrogate"}
    assert json.loads(canonical(args)) == args  # the journal's codec keeps it
    first = asyncio.run(tool(args, ToolContext(ctx.sandbox, ctx.workspace, call=ref)))
    assert first.output == "charged 1"
    crash(journal)
    tool = JournaledTool(charge, resume(store, tmp_path, journal.run_id))
    again = asyncio.run(tool(args, ToolContext(ctx.sandbox, ctx.workspace, call=ref)))
    assert again == first and len(charge.sent) == 1

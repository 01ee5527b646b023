"""``stayer.runtime.client.Client`` against a live server: its answers are typed records
read by attribute, with what the API's JSON says."""

from __future__ import annotations

from decimal import Decimal
from pathlib import Path

from service_helpers import Env, copy_tasks, start_server

from stayer.ledger import LedgerEntry
from stayer.runtime.actions import ActionView, WaitCost
from stayer.runtime.client import ApiError, Client, RunView, SseEvent

SIM = "sim:claude-sonnet-4-5"


def test_the_client_reads_runs_ledgers_events_and_actions_as_records(tmp_path: Path) -> None:
    env = Env(tmp_path / "home")
    server = start_server(env, copy_tasks(tmp_path / "tasks", "hello-file"), "--workers", "1")
    try:
        key = env.tenant("acme")["api_key"]
        with Client(server.url, key) as c:
            run = c.wait(c.create_run(task="hello-file", model=SIM).id, timeout_s=120)
            assert isinstance(run, RunView) and run.status == "succeeded" and run.steps >= 1
            ledger = c.ledger(run.id)
            assert all(isinstance(e, LedgerEntry) for e in ledger) and len(ledger) == run.steps
            assert sum(e.cost.total for e in ledger) == Decimal(run.cost_usd)
            assert run.usage.input_tokens == sum(e.usage.input_tokens for e in ledger)
            assert [r.id for r in c.runs(status="succeeded").data] == [run.id]
            events = list(c.events(run.id))
            assert all(isinstance(e, SseEvent) for e in events)
            assert events[0].id == "0" and events[-1].data["status"] == "succeeded"

            asked = c.create_run(task="hello-file", model=SIM, confirm_tools=["bash"])
            waiting = c.wait(asked.id, lambda r: r.status in ("requires_action", "failed"))
            action = waiting.pending_action
            assert isinstance(action, ActionView) and action.call_id == "act-1"
            assert action.tool == "bash" and isinstance(action.wait_cost, WaitCost)
            decided = c.decide(asked.id, "act-1", "reject", "not now")
            assert decided.pending_action is None
            try:
                c.decide(asked.id, "act-1", "approve")
            except ApiError as e:
                assert e.status == 409
            else:
                raise AssertionError("a second decision on act-1 was accepted")
    finally:
        server.process.kill()

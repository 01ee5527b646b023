"""The API's response bodies that hold records (a pending action, the outcome_unknown of
a ledger) document the records' fields in /openapi.json, with their JSON names."""

from __future__ import annotations

from pathlib import Path

from stayer.runtime.api import create_app


def test_openapi_shows_the_fields_of_the_records_in_responses(tmp_path: Path) -> None:
    schemas = create_app(tmp_path / "home", tmp_path).openapi()["components"]["schemas"]
    pending = schemas["RunOut"]["properties"]["pending_action"]["anyOf"][0]
    assert {"call_id", "tool", "arguments", "wait_cost"} <= set(pending["properties"])
    wait_cost = pending["properties"]["wait_cost"]["anyOf"][0]
    assert "cost_if_cache_expires_usd" in wait_cost["properties"]
    action = schemas["ActionList"]["properties"]["data"]["items"]
    assert action["required"][:2] == ["call_id", "tool"]
    unknown = schemas["Ledger"]["properties"]["outcome_unknown"]["items"]
    assert {"step", "tool", "call_id", "idempotency_key", "sent_at"} <= set(unknown["required"])

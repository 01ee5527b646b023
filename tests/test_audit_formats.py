"""``stayer audit`` on other agents' logs: SWE-agent ``.traj``, mini-swe-agent
``.traj.json``, OpenHands event lists and ATIF ``trajectory.json``, checked against the
totals those logs record of themselves (re-read here with plain ``json``), on the real
files of the shared corpus (../shared/corpus; skipped when it is not there)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from stayer.audit.document import build
from stayer.audit.engine import analyse_all, discover
from stayer.audit.html import write_html
from stayer.pricing import PriceBook

ROOT = Path(__file__).resolve().parent.parent
# ../shared next to the checkout, or next to the folder holding it (a worktree under wt/)
CORPUS = next(
    (
        d / "shared" / "corpus"
        for d in (ROOT.parent, ROOT.parent.parent)
        if (d / "shared" / "corpus").is_dir()
    ),
    ROOT.parent / "shared" / "corpus",
)
HARBOR = CORPUS / "claude-code" / "xdotli__harbor-datagen"
BOOK = PriceBook()
needs_corpus = pytest.mark.skipif(not CORPUS.is_dir(), reason=f"corpus not found at {CORPUS}")


def audit_report(*paths: Path) -> Any:
    found = discover(paths)
    return build(analyse_all(found.refs, BOOK, keep_series=True, jobs=1))


def audit(*paths: Path) -> dict[str, Any]:
    return audit_report(*paths).to_json()


def only(doc: dict[str, Any]) -> dict[str, Any]:
    assert len(doc["sessions"]) == 1, [s["id"] for s in doc["sessions"]]
    return doc["sessions"][0]


def recorded(session: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {r["field"]: r for r in session["recorded"]}


def stayer(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, HOME=str(cwd), STAYER_HOME=str(cwd / ".stayer"), COLUMNS="80")
    env["STAYER_CACHE"] = str(cwd / ".cache" / "stayer")
    return subprocess.run(
        [sys.executable, "-m", "stayer.cli", "audit", *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=cwd,
        timeout=120,
    )


# --- SWE-agent: totals only, in info.model_stats --------------------------------------------


@needs_corpus
@pytest.mark.parametrize(
    "name",
    [
        "6e44b9__sweagenttestrepo-1c2844.traj",
        "pydicom__pydicom-1458.traj",
        "swe-agent__test-repo-i1.traj",
    ],
)
def test_swe_agent_traj_matches_its_model_stats(name: str) -> None:
    path = CORPUS / "swe-agent" / name
    log = json.loads(path.read_text())
    stats = log["info"]["model_stats"]
    s = only(audit(path))
    assert s["source"] == "swe-agent" and s["id"] == name.removesuffix(".traj")
    assert s["calls"] == stats["api_calls"]
    assert s["usage"]["input_tokens"] == stats["tokens_sent"]
    assert s["usage"]["output_tokens"] == stats["tokens_received"]
    checks = recorded(s)
    for field in ("api_calls", "tokens_sent", "tokens_received"):
        c = checks[f"info.model_stats.{field}"]
        assert c["logged"] == stats[field] == c["audited"] and c["matches"], c
    cost = checks["info.model_stats.instance_cost"]
    assert Decimal(cost["logged"]) == Decimal(repr(stats["instance_cost"]))
    model = (log.get("replay_config") or {}).get("agent", {}).get("model", {}).get("name")
    if model is None:  # SWE-agent's older files name no model: no price, and it says so
        assert s["cost_usd"] == "unknown" and "names no model" in cost["why"]
    else:  # priced by genai-prices; SWE-agent's own table gave another figure: both shown
        rates = BOOK.rates(model, None, None, stats["tokens_sent"])
        assert rates is not None
        want = (stats["tokens_sent"] * rates.input + stats["tokens_received"] * rates.output) / (
            10**6
        )
        assert Decimal(s["cost_usd"]) == want
        assert cost["audited"] == s["cost_usd"] and not cost["matches"]
        assert "its own table" in cost["why"] and f"{model} ${rates.input} in" in cost["why"]


# --- mini-swe-agent: usage per response, instance_cost ---------------------------------------


@needs_corpus
@pytest.mark.parametrize(
    "name",
    [
        "django__django-11119.traj.json",
        "django__django-13590.traj.json",
        "mwaskom__seaborn-3069.traj.json",
    ],
)
def test_mini_swe_agent_traj_matches_its_usage_and_cost(name: str) -> None:
    path = CORPUS / "swe-agent" / "mini-swe-agent" / name
    log = json.loads(path.read_text())
    kept = [
        m["extra"]["response"]["usage"]
        for m in log["messages"]
        if m["role"] == "assistant" and m.get("extra", {}).get("response")
    ]
    rejected = sum(
        1
        for m in log["messages"]
        if m["role"] == "user" and m.get("extra", {}).get("interrupt_type")
    )
    stats = log["info"]["model_stats"]
    s = only(audit(path))
    assert s["source"] == "mini-swe-agent" and s["id"] == log["instance_id"]
    assert s["calls"] == len(kept)
    assert s["usage"]["input_tokens"] == sum(u["prompt_tokens"] for u in kept)
    assert s["usage"]["cache_read_tokens"] == sum(
        u["prompt_tokens_details"]["cached_tokens"] for u in kept
    )
    assert s["usage"]["output_tokens"] == sum(u["completion_tokens"] for u in kept)
    # The cost: genai-prices' rates for gpt-5-mini give the log's own instance_cost.
    assert abs(Decimal(s["cost_usd"]) - Decimal(repr(stats["instance_cost"]))) < Decimal("1e-9")
    checks = recorded(s)
    assert checks["info.model_stats.instance_cost"]["matches"]
    # api_calls also counts the replies the agent rejected, of which the log keeps no usage.
    calls = checks["info.model_stats.api_calls"]
    assert calls["logged"] == stats["api_calls"] == len(kept) + rejected and not calls["matches"]
    assert calls["why"].startswith(f"{rejected} calls whose reply the agent rejected")


# --- OpenHands: one response per id, the same response on several events ---------------------


@needs_corpus
@pytest.mark.parametrize("name", ["basic.json", "basic_gui_mode.json", "wrong_initial_state.json"])
def test_openhands_events_match_their_responses_usage(name: str) -> None:
    path = CORPUS / "openhands" / name
    responses: dict[str, dict[str, Any]] = {}
    for e in json.loads(path.read_text()):
        r = (e.get("tool_call_metadata") or {}).get("model_response")
        if r:
            responses.setdefault(r["id"], r)
    assert responses
    s = only(audit(path))
    assert s["source"] == "openhands" and s["id"] == name.removesuffix(".json")
    assert s["calls"] == len(responses)
    usages = [r["usage"] for r in responses.values()]
    assert s["usage"]["input_tokens"] == sum(u["prompt_tokens"] for u in usages)
    assert s["usage"]["cache_read_tokens"] == sum(u["cache_read_input_tokens"] for u in usages)
    assert s["usage"]["cache_write_tokens"] == sum(u["cache_creation_input_tokens"] for u in usages)
    assert s["usage"]["output_tokens"] == sum(u["completion_tokens"] for u in usages)
    model = {r["model"] for r in responses.values()}
    assert [m["model"] for m in s["models"]] == sorted(model)
    rates = BOOK.rates(next(iter(model)), None, None, 0)
    assert rates is not None
    want = sum(
        (
            (u["prompt_tokens"] - u["cache_read_input_tokens"] - u["cache_creation_input_tokens"])
            * rates.input
            + u["cache_read_input_tokens"] * rates.cache_read
            + u["cache_creation_input_tokens"] * rates.cache_write_5m
            + u["completion_tokens"] * rates.output
        )
        for u in usages
    ) / Decimal(10**6)
    assert Decimal(s["cost_usd"]) == want
    assert s["recorded"] == []  # these logs record no totals (no llm_metrics)


def test_openhands_llm_metrics_are_the_reference(tmp_path: Path) -> None:
    """Newer OpenHands logs carry accumulated metrics: the audit is checked against them."""
    usage = {
        "prompt_tokens": 3000,
        "completion_tokens": 100,
        "prompt_tokens_details": {"cached_tokens": 2000},
        "cache_read_input_tokens": 2000,
        "cache_creation_input_tokens": 500,
    }
    response = {"id": "r1", "created": 1738046713, "model": "claude-3-5-sonnet-20241022"}
    events = [
        {"id": 0, "timestamp": "2025-01-27T22:44:56", "source": "user", "action": "message"},
        {
            "id": 1,
            "timestamp": "2025-01-27T22:45:13",
            "source": "agent",
            "action": "run",
            "tool_call_metadata": {"model_response": {**response, "usage": usage}},
            "llm_metrics": {
                "accumulated_cost": 0.99,
                "accumulated_token_usage": {
                    "prompt_tokens": 3000,
                    "completion_tokens": 100,
                    "cache_read_tokens": 2000,
                    "cache_write_tokens": 500,
                },
            },
        },
    ]
    path = tmp_path / "sid.json"
    path.write_text(json.dumps(events))
    s = only(audit(path))
    checks = recorded(s)
    base = "llm_metrics.accumulated_token_usage."
    for field in ("prompt_tokens", "completion_tokens", "cache_read_tokens", "cache_write_tokens"):
        assert checks[base + field]["matches"], checks[base + field]
    cost = checks["llm_metrics.accumulated_cost"]
    assert cost["logged"] == "0.99" and not cost["matches"]
    assert "genai-prices" in cost["why"] and "claude-3-5-sonnet-20241022 $3 in" in cost["why"]


# --- ATIF (Harbor) -----------------------------------------------------------------------------


def _trials() -> list[Path]:
    return sorted(HARBOR.glob("*/example_runs/*/*/agent")) if HARBOR.is_dir() else []


@needs_corpus
@pytest.mark.parametrize("agent", _trials(), ids=lambda p: p.parent.name)
def test_atif_trajectory_matches_the_sessions_own_log(agent: Path) -> None:
    """Harbor's trajectory.json of a Claude Code run counts the calls of the session's own
    JSONL, exactly; its final_metrics add up every step (a response's usage repeated on each
    step made from it), and the report says so, with the numbers."""
    path = agent / "trajectory.json"
    log = json.loads(path.read_text())
    s = only(audit(path))
    assert s["source"] == "atif" and s["id"] == log["session_id"]
    sessions = agent / "sessions"
    native = only(audit(sessions))
    assert native["source"] == "claude-code" and native["id"] == s["id"]
    assert s["usage"] == native["usage"] and s["calls"] == native["calls"]
    assert s["cost_usd"] == native["cost_usd"]
    # final_metrics: every step's metrics added up (checked here), which the report explains.
    steps = [st["metrics"] for st in log["steps"] if st.get("metrics")]
    final = log["final_metrics"]
    assert final["total_prompt_tokens"] == sum(m["prompt_tokens"] for m in steps)
    checks = recorded(s)
    prompt = checks["final_metrics.total_prompt_tokens"]
    assert prompt["logged"] == final["total_prompt_tokens"] and not prompt["matches"]
    assert f"{len(steps) - s['calls']} steps repeat the usage" in prompt["why"]
    assert f"leave out cache writes ({s['usage']['cache_write_tokens']:,}" in prompt["why"]
    out = checks["final_metrics.total_completion_tokens"]
    assert (
        out["logged"] == final["total_completion_tokens"]
        and out["audited"] == s["usage"]["output_tokens"]
    )
    # Given the trial folder, the session is counted once: from its own log.
    both = audit(agent)
    assert [x["source"] for x in both["sessions"]] == ["claude-code"]
    assert both["totals"]["usage"] == native["usage"]


# --- the command: directories of every format, and what it cannot read -------------------------


@needs_corpus
def test_cli_audits_a_folder_of_every_format(tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    shutil.copytree(CORPUS / "swe-agent", logs / "swe-agent")
    shutil.copytree(CORPUS / "openhands", logs / "openhands")
    trial = _trials()[0]
    (logs / "harbor").mkdir()
    shutil.copy(trial / "trajectory.json", logs / "harbor" / "trajectory.json")
    p = stayer(str(logs), "--json", cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    doc = json.loads(p.stdout)
    assert {s["source"] for s in doc["sessions"]} == {
        "swe-agent",
        "mini-swe-agent",
        "openhands",
        "atif",
    }
    assert len(doc["sessions"]) == 10 and doc["skipped_lines"] == 0
    tables = stayer(str(logs), cwd=tmp_path)
    assert tables.returncode == 0, tables.stderr
    out = tables.stdout
    # every session checked has a known difference (rejected replies, SWE-agent's own
    # prices, a model not named, ATIF's repeated steps), each said with its reason
    assert "Against the logs' own totals: 0 of 7 sessions match, the others differ:" in out
    words = " ".join(out.split())  # (a terminal's notes wrap; a pipe's are whole lines)
    assert "info.model_stats.instance_cost 0.019520000000000006 in the log, 0.0202825 here" in words


def test_unknown_format_is_a_one_line_error(tmp_path: Path) -> None:
    path = tmp_path / "trace.json"
    path.write_text('{"what": "some other agent"}\n')
    p = stayer(str(path), cwd=tmp_path)
    assert p.returncode == 2 and p.stdout == ""
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and str(path) in lines[0]
    assert "not a log stayer audit reads" in lines[0]
    for name in ("SWE-agent .traj", "mini-swe-agent .traj.json", "OpenHands", "ATIF"):
        assert name in lines[0]


def test_a_broken_document_is_counted_not_fatal(tmp_path: Path) -> None:
    """A file that looks like one of these formats but is not whole is an unreadable line."""
    path = tmp_path / "x.traj"
    path.write_text('{"environment": "main", "trajectory": [')
    report = audit_report(path)
    assert report.sessions == [] and report.skipped_lines == 1


@needs_corpus
def test_html_report_shows_the_logs_own_totals(tmp_path: Path) -> None:
    html = write_html(audit_report(CORPUS / "swe-agent" / "6e44b9__sweagenttestrepo-1c2844.traj"))
    assert "own totals</h2>" in html
    assert "info.model_stats.instance_cost" in html and "0.019520000000000006" in html


def test_a_folder_of_unknown_logs_is_a_one_line_error(tmp_path: Path) -> None:
    """A folder given by name whose would-be logs (.json, .jsonl, .traj) are none of the
    formats read is an error naming it and one of them, not an empty $0.0000 table."""
    logs = tmp_path / "logs"
    (logs / "run").mkdir(parents=True)
    (logs / "run" / "events.json").write_text('[{"kind": "unknown agent"}]\n')
    p = stayer(str(logs), cwd=tmp_path)
    assert p.returncode == 2 and p.stdout == ""
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and str(logs) in lines[0] and "events.json" in lines[0]
    assert "no log stayer audit reads" in lines[0]
    (tmp_path / "empty").mkdir()  # nothing that could be a log: an empty report, as before
    assert stayer(str(tmp_path / "empty"), "--json", cwd=tmp_path).returncode == 0


@needs_corpus
def test_helper_processes_return_the_same_reports() -> None:
    """The reports (their ``recorded`` checks included) cross from helper processes as
    MessagePack unchanged."""
    refs = discover([CORPUS / "swe-agent", CORPUS / "openhands"]).refs
    here = build(analyse_all(refs, BOOK, jobs=1)).to_json()
    shared = build(analyse_all(refs, BOOK, jobs=2, parallel_min_bytes=0)).to_json()
    assert shared == here and any(s["recorded"] for s in here["sessions"])


@needs_corpus
def test_what_if_says_it_does_not_replay_these_logs() -> None:
    from stayer.audit.scenarios import parse_scenario, run_what_ifs

    path = CORPUS / "swe-agent" / "mini-swe-agent" / "django__django-11119.traj.json"
    found = discover([path])
    report = build(analyse_all(found.refs, BOOK, jobs=1))
    refs = {(r.source, r.id): r for r in found.refs}
    scenario = parse_scenario("model=claude-haiku-4-5,policy=auto")
    [entry] = run_what_ifs(report.sessions, refs, [scenario], BOOK)
    assert "not mini-swe-agent logs" in entry["error"] and "cost_usd" not in entry


def test_swe_agent_replay_config_as_text(tmp_path: Path) -> None:
    """SWE-agent 1.x writes replay_config as a JSON string; its model prices the session,
    and a tiny logged cost is shown in plain digits."""
    config = {"agent": {"model": {"name": "gpt-4o", "per_instance_cost_limit": 3.0}}}
    traj = {
        "trajectory": [{"action": "ls", "observation": "", "response": "ls"}],
        "history": [],
        "info": {
            "model_stats": {
                "instance_cost": 1e-05,
                "tokens_sent": 1000,
                "tokens_received": 10,
                "api_calls": 2,
            }
        },
        "replay_config": json.dumps(config),
        "environment": "main",
    }
    path = tmp_path / "inst.traj"
    path.write_text(json.dumps(traj))
    s = only(audit(path))
    assert s["calls"] == 2 and s["models"][0]["model"] == "gpt-4o"
    assert Decimal(s["cost_usd"]) == (1000 * Decimal("2.5") + 10 * Decimal(10)) / 10**6
    cost = recorded(s)["info.model_stats.instance_cost"]
    assert cost["logged"] == "0.00001" and not cost["matches"]
    assert s["costliest_calls"] == [] and s["context"] is None  # totals, not a call

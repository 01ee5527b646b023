"""stayer audit: importers, deduplication, pricing, cache-break forensics, reports, CLI.

Claude Code sessions are built here line by line in Claude Code's own shape; the Codex
fixture (tests/fixtures/audit/codex) is built from the format's documentation.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterable
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

import msgspec
import orjson
import pytest

from stayer.audit.analysis import SessionDoc, analyse, context_growth, doc_json
from stayer.audit.calls import Call, ImportedSession, SessionRef
from stayer.audit.claude_code import ClaudeCodeImporter
from stayer.audit.costing import CallPricer, CompiledSteps, usd
from stayer.audit.document import AuditDoc, build
from stayer.audit.engine import _REPORTS_IN, _REPORTS_OUT, analyse_all, default_paths, discover
from stayer.pricing import MTOK, PriceBook, Rates
from stayer.usage import Usage

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "tests" / "fixtures" / "audit"
CORPUS = ROOT.parent / "shared" / "corpus" / "claude-code"
SONNET = "claude-sonnet-4-5-20250929"
HAIKU = "claude-haiku-4-5-20251001"
T0 = datetime(2025, 11, 19, 22, 0, tzinfo=UTC)
BOOK = PriceBook()


# --- builders: Claude Code's line shapes ------------------------------------------------


def ts(seconds: float) -> str:
    return (
        (T0 + timedelta(seconds=seconds)).isoformat(timespec="milliseconds").replace("+00:00", "Z")
    )


def assistant(
    session: str,
    at: float,
    msg: str,
    req: str | None = None,
    *,
    model: str = SONNET,
    uncached: int = 3,
    read: int = 0,
    write: int = 0,
    write_1h: int = 0,
    out: int = 50,
    sidechain: bool = False,
    agent: str | None = None,
    parent: str | None = None,
    uid: str | None = None,
) -> dict[str, Any]:
    line: dict[str, Any] = {
        "parentUuid": parent,
        "isSidechain": sidechain,
        "userType": "external",
        "cwd": "/workspace",
        "sessionId": session,
        "version": "2.0.46",
        "gitBranch": "",
    }
    if agent:
        line["agentId"] = agent
    line.update(
        {
            "message": {
                "model": model,
                "id": msg,
                "type": "message",
                "role": "assistant",
                "content": [{"type": "text", "text": "working on it"}],
                "stop_reason": None,
                "usage": {
                    "input_tokens": uncached,
                    "cache_creation_input_tokens": write + write_1h,
                    "cache_read_input_tokens": read,
                    "cache_creation": {
                        "ephemeral_5m_input_tokens": write,
                        "ephemeral_1h_input_tokens": write_1h,
                    },
                    "output_tokens": out,
                    "service_tier": "standard",
                },
            },
            "requestId": req if req is not None else "req_" + msg,
            "type": "assistant",
            "uuid": uid or str(uuid.uuid4()),
            "timestamp": ts(at),
        }
    )
    return line


def user(
    session: str,
    at: float,
    *,
    sidechain: bool = False,
    parent: str | None = None,
    uid: str | None = None,
) -> dict[str, Any]:
    return {
        "parentUuid": parent,
        "isSidechain": sidechain,
        "userType": "external",
        "cwd": "/workspace",
        "sessionId": session,
        "version": "2.0.46",
        "type": "user",
        "message": {"role": "user", "content": "go on"},
        "uuid": uid or str(uuid.uuid4()),
        "timestamp": ts(at),
    }


def compact_boundary(session: str, at: float) -> dict[str, Any]:
    return {
        "parentUuid": None,
        "isSidechain": False,
        "sessionId": session,
        "type": "system",
        "subtype": "compact_boundary",
        "content": "Conversation compacted",
        "compactMetadata": {"trigger": "auto", "preTokens": 160000},
        "uuid": str(uuid.uuid4()),
        "timestamp": ts(at),
    }


def write_jsonl(path: Path, lines: Iterable[dict[str, Any] | str]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as f:
        for line in lines:
            f.write(
                line if isinstance(line, str) else json.dumps(line, separators=(",", ":")) + "\n"
            )
    return path


def audit(*paths: Path, since: float | None = None, keep_series: bool = False) -> dict[str, Any]:
    found = discover(paths)
    return build(
        analyse_all(found.refs, BOOK, since=since, keep_series=keep_series, jobs=1)
    ).to_json()


def only_session(doc: dict[str, Any]) -> dict[str, Any]:
    assert len(doc["sessions"]) == 1, [s["id"] for s in doc["sessions"]]
    return doc["sessions"][0]


def rates(model: str = SONNET, prompt: int = 0):
    r = BOOK.rates(model, "anthropic", None, prompt, at=T0)
    assert r is not None
    return r


# --- repeated entries, sub-agents, malformed lines --------------------------------------


def test_repeated_entries_of_one_response_count_once_keeping_the_complete_one(
    tmp_path: Path,
) -> None:
    s = "s-repeat"
    write_jsonl(
        tmp_path / "projects" / "p" / f"{s}.jsonl",
        [
            # one streamed response written three times: partial output first
            assistant(s, 0, "msg_A", write=18764, out=3),
            assistant(s, 2, "msg_A", write=18764, out=263),
            assistant(s, 3, "msg_A", write=18764, out=263),
            # the same response seen from a sidechain copy: the main-chain entry is kept
            assistant(s, 10, "msg_B", read=18764, write=255, out=25, sidechain=True),
            assistant(s, 11, "msg_B", read=18764, write=255, out=20),
            # no message id: nothing to match on, so never merged
            {
                **assistant(s, 20, "x", read=19019, out=7),
                "message": {**assistant(s, 20, "x")["message"], "id": None},
            },
        ],
    )
    session = only_session(audit(tmp_path))
    assert session["calls"] == 3
    u = session["usage"]
    assert u["output_tokens"] == 263 + 20 + 50
    assert u["cache_write_tokens"] == 18764 + 255
    assert session["subagents"] == []  # the main-chain copy of msg_B won


def test_sidechain_replay_of_a_parent_message_is_the_same_call(tmp_path: Path) -> None:
    s = "s-replay"
    write_jsonl(
        tmp_path / "projects" / "p" / f"{s}.jsonl",
        [
            assistant(s, 0, "msg_A", "req_1", write=5000),
            assistant(s, 0, "msg_A", "req_2", write=5000, sidechain=True),  # /btw replays it
        ],
    )
    assert only_session(audit(tmp_path))["calls"] == 1


def test_subagent_files_belong_to_their_parent_session(tmp_path: Path) -> None:
    s = "6f1d0c2e-0000-4000-8000-000000000001"
    project = tmp_path / "projects" / "-workspace"
    write_jsonl(
        project / f"{s}.jsonl",
        [
            assistant(s, 0, "msg_main1", write=15000),
            assistant(s, 60, "msg_main2", read=15000, write=400),
        ],
    )
    # older layout: agent-<id>.jsonl next to the session; newer: <session>/subagents/
    write_jsonl(
        project / "agent-a1b2c3d4.jsonl",
        [assistant(s, 5, "msg_sub1", model=HAIKU, write=9000, sidechain=True, agent="a1b2c3d4")],
    )
    write_jsonl(
        project / s / "subagents" / "agent-e5f6a7b8.jsonl",
        [
            assistant(s, 7, "msg_sub2", write=9100, sidechain=True, agent="e5f6a7b8"),
            assistant(s, 9, "msg_sub3", read=9100, write=300, sidechain=True, agent="e5f6a7b8"),
        ],
    )
    session = only_session(audit(tmp_path))
    assert session["id"] == s and session["project"] == "-workspace"
    assert session["calls"] == 5
    subs = {a["id"]: a for a in session["subagents"]}
    assert set(subs) == {"a1b2c3d4", "e5f6a7b8"}
    assert subs["a1b2c3d4"]["calls"] == 1 and subs["e5f6a7b8"]["calls"] == 2
    assert subs["a1b2c3d4"]["usage"]["cache_write_tokens"] == 9000
    assert session["cache_breaks"] == []  # each chain has its own cache


def test_inline_sidechains_are_told_apart_by_their_root(tmp_path: Path) -> None:
    """Two Task sub-agents running at once interleave in the session file; analysed as one
    chain their alternating contexts would look like a break at every call."""
    s = "s-inline"
    lines: list[dict[str, Any]] = [assistant(s, 0, "msg_m", write=15000)]
    roots = {"x": str(uuid.uuid4()), "y": str(uuid.uuid4())}
    lines += [
        user(s, 1, sidechain=True, uid=roots["x"]),
        user(s, 1, sidechain=True, uid=roots["y"]),
    ]
    last = dict(roots)
    for i in range(4):
        for name, base in (("x", 12000), ("y", 30000)):
            uid = str(uuid.uuid4())
            lines.append(
                assistant(
                    s,
                    2 + i,
                    f"msg_{name}{i}",
                    read=base + 100 * i if i else 0,
                    write=100 if i else base,
                    sidechain=True,
                    parent=last[name],
                    uid=uid,
                )
            )
            last[name] = uid
    write_jsonl(tmp_path / "projects" / "p" / f"{s}.jsonl", lines)
    session = only_session(audit(tmp_path))
    subs = {a["id"]: a["calls"] for a in session["subagents"]}
    assert subs == {roots["x"][:8]: 4, roots["y"][:8]: 4}
    assert session["cache_breaks"] == []


def test_truncated_last_line_and_garbage_are_counted_not_fatal(tmp_path: Path) -> None:
    s = "s-trunc"
    good = assistant(s, 0, "msg_A", write=1000)
    cut = json.dumps(assistant(s, 5, "msg_B", write=2000), separators=(",", ":"))[:150]
    write_jsonl(
        tmp_path / "projects" / "p" / f"{s}.jsonl", [good, "not json at all\n", user(s, 1), cut]
    )
    # a session whose only call was cut off: no session to show, but the line is counted
    write_jsonl(
        tmp_path / "projects" / "p" / "s-cut.jsonl",
        [json.dumps(user("s-cut", 0)) + "\n", cut.replace(s, "s-cut")],
    )
    doc = audit(tmp_path)
    assert only_session(doc)["calls"] == 1
    assert doc["skipped_lines"] == 3


@pytest.mark.parametrize(
    "field, value",
    [
        ("cache_creation", {"ephemeral_5m_input_tokens": {"a": 1}}),
        ("cache_creation", {"ephemeral_1h_input_tokens": [3]}),
        ("input_tokens", [1]),
        ("output_tokens", "many"),
    ],
)
def test_a_count_that_is_no_number_skips_its_line_not_the_audit(
    tmp_path: Path, field: str, value: Any
) -> None:
    """Other agents' logs are input: a usage whose count is an object, a list or a word is
    a skipped line, and the session's other calls are still counted (it was a traceback)."""
    s = "s-odd"
    odd = assistant(s, 5, "msg_B", write=2000)
    odd["message"]["usage"][field] = value
    write_jsonl(
        tmp_path / "projects" / "p" / f"{s}.jsonl",
        [assistant(s, 0, "msg_A", write=1000), odd, assistant(s, 9, "msg_C", read=1000)],
    )
    doc = audit(tmp_path)
    assert only_session(doc)["calls"] == 2
    assert doc["skipped_lines"] == 1


def test_lines_of_the_usual_shape_read_as_any_other_shape(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The typed decoding of the usual line shape, many lines at once, is only a fast path:
    with it turned off every line is read by the general one, and the calls and skipped
    lines are the same."""
    import random

    import msgspec

    from stayer.audit import claude_code

    odd: list[Any] = [None, 0, 7, -1, 1.0, 2.5, True, "3", [], {}, {"x": 1}, 10**20]
    rng = random.Random(20)
    lines: list[dict[str, Any] | str] = []
    for i in range(300):
        line = assistant(
            "s-shape",
            7.0 * i,
            f"msg_{rng.randrange(60)}",
            rng.choice([None, "req_1", f"req_{i}", ""]),
            read=rng.randrange(9000),
            write=rng.randrange(3000),
            write_1h=rng.choice([0, 0, 500]),
            out=rng.randrange(900),
            sidechain=rng.random() < 0.3,
            agent=rng.choice([None, None, "a1", ""]),
        )
        u = line["message"]["usage"]
        for key in [*u, "cache_creation", "output_tokens_details", "speed"]:
            r = rng.random()
            if r < 0.04:
                u.pop(key, None)
            elif r < 0.08:
                u[key] = rng.choice(odd)
        split = u.get("cache_creation")
        if isinstance(split, dict) and split and rng.random() < 0.15:
            split[rng.choice(list(split))] = rng.choice([None, -1, 2.5, True, "3"])
        if rng.random() < 0.05:
            line["timestamp"] = rng.choice([None, 5, "late", "2025-11-19T24:00:00.000Z"])
        if rng.random() < 0.03:
            line["message"]["model"] = rng.choice([None, "", 5, "<synthetic>"])
        if rng.random() < 0.03:
            line["message"]["usage"] = rng.choice([None, 5, "usage", []])
        text = json.dumps(line, separators=(",", ":"))
        if rng.random() < 0.03:
            text = text[: len(text) // 2]
        lines.append(text + "\n")
        if rng.random() < 0.1:
            lines.append(rng.choice([compact_boundary("s-shape", 7.0 * i), user("s-shape", 1)]))
    write_jsonl(tmp_path / "projects" / "p" / "s-shape.jsonl", lines)
    (ref,) = discover([tmp_path / "projects"]).refs

    usual = ClaudeCodeImporter().read(ref)

    class Refuses:
        def decode(self, line: bytes) -> None:
            raise msgspec.DecodeError("not the usual shape")

        def decode_lines(self, lines: bytes) -> None:
            raise msgspec.DecodeError("not the usual shape")

    monkeypatch.setattr(claude_code, "_USUAL", Refuses())
    general = ClaudeCodeImporter().read(ref)
    assert len(usual.calls) > 100 and usual.skipped_lines > 10
    assert (usual.calls, usual.skipped_lines) == (general.calls, general.skipped_lines)


def _shapes_session(path: Path, broken: bool) -> None:
    """A session of 200 calls of the usual shape (with repeats, sub-agents, compactions and
    lines of every length), and with ``broken`` a few lines that are no JSON object."""
    import random

    rng = random.Random(7)
    lines: list[dict[str, Any] | str] = []
    for i in range(200):
        line = assistant(
            "s-chunks",
            5.0 * i,
            f"msg_{rng.randrange(120)}",
            rng.choice([None, f"req_{i}"]),
            read=rng.randrange(9000),
            write=rng.randrange(3000),
            out=rng.randrange(900),
            sidechain=rng.random() < 0.3,
        )
        line["message"]["content"] = [{"type": "text", "text": "x" * rng.choice([0, 9, 700])}]
        lines.append(line)
        if rng.random() < 0.1:
            lines.append(compact_boundary("s-chunks", 5.0 * i))
        if rng.random() < 0.1:
            lines.append("\n")
        if broken and rng.random() < 0.05:
            lines.append(rng.choice(["not json\n", '{"cut": \n', "[1, 2]\n"]))
    text = "".join(
        x if isinstance(x, str) else json.dumps(x, separators=(",", ":")) + "\n" for x in lines
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text.removesuffix("\n"))  # the last line without its newline


@pytest.mark.parametrize("broken", [False, True])
def test_lines_read_many_at_once_or_one_by_one_give_the_same_calls(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, broken: bool
) -> None:
    """Lines are decoded a chunk at a time; a chunk holding a line of another shape (or no
    JSON) is read line by line. Where the chunks end — mid-line, or in lines longer than a
    chunk — changes nothing: every chunk size gives the calls and skipped lines the line by
    line reading gives."""
    import msgspec

    from stayer.audit import claude_code

    _shapes_session(tmp_path / "projects" / "p" / "s-chunks.jsonl", broken)
    (ref,) = discover([tmp_path / "projects"]).refs
    whole = ClaudeCodeImporter().read(ref)
    assert len(whole.calls) > 50 and whole.bytes == ref.bytes
    assert (whole.skipped_lines > 0) == broken

    results = []
    for chunk in (64, 1000, 4096):
        monkeypatch.setattr(claude_code, "_CHUNK", chunk)
        results.append(ClaudeCodeImporter().read(ref))

    class OneByOne:
        decode = claude_code._USUAL.decode

        def decode_lines(self, lines: bytes) -> None:
            raise msgspec.DecodeError("read one by one")

    monkeypatch.setattr(claude_code, "_USUAL", OneByOne())
    results.append(ClaudeCodeImporter().read(ref))
    for r in results:
        assert (r.calls, r.skipped_lines, r.bytes) == (whole.calls, whole.skipped_lines, ref.bytes)


def test_a_call_whose_content_is_not_utf8_is_still_counted(tmp_path: Path) -> None:
    """A stray byte that is not UTF-8 in a tool's output (the content, which the audit does
    not read) does not unbill the call: it is counted (ccusage 20 drops such a line). A line
    whose own fields are not UTF-8 is skipped."""
    s = "s-bytes"
    path = tmp_path / "projects" / "p" / f"{s}.jsonl"
    calls = [assistant(s, 0, "msg_A", write=1000), assistant(s, 9, "msg_B", read=1000)]
    calls[1]["message"]["content"] = [{"type": "text", "text": "BYTE"}]
    odd = assistant(s, 20, "msg_C", read=1000)
    odd["message"]["model"] = "MODEL"
    raw = b"".join(json.dumps(c, separators=(",", ":")).encode() + b"\n" for c in [*calls, odd])
    path.parent.mkdir(parents=True)
    path.write_bytes(raw.replace(b"BYTE", b"caf\xe9 \xff").replace(b"MODEL", b"claude-\xff"))
    doc = audit(tmp_path)
    assert only_session(doc)["calls"] == 2
    assert doc["skipped_lines"] == 1


# --- prices -----------------------------------------------------------------------------


def test_model_missing_from_price_data_is_unknown_never_zero(tmp_path: Path) -> None:
    s = "s-unknown"
    write_jsonl(
        tmp_path / "projects" / "p" / f"{s}.jsonl",
        [
            assistant(s, 0, "msg_A", write=1000, out=100),
            assistant(s, 30, "msg_B", model="claude-imaginary-9", uncached=500, out=70),
        ],
    )
    doc = audit(tmp_path)
    session = only_session(doc)
    assert session["cost_usd"] == "unknown" and doc["totals"]["cost_usd"] == "unknown"
    assert session["unpriced_models"] == ["claude-imaginary-9"] and session["unpriced_calls"] == 1
    assert session["usage"]["output_tokens"] == 170  # its tokens are still counted
    known = BOOK.cost(
        Usage(input_tokens=1003, cache_write_5m_tokens=1000, output_tokens=100),
        SONNET,
        "anthropic",
        at=T0,
    )
    assert Decimal(session["cost_usd_priced"]) == known.total
    by_model = {m["model"]: m["cost_usd"] for m in session["models"]}
    assert by_model["claude-imaginary-9"] == "unknown" and Decimal(by_model[SONNET]) == known.total


def test_call_pricer_agrees_with_pricebook_cost() -> None:
    pricer = CallPricer(BOOK)
    day = datetime(2025, 11, 19, tzinfo=UTC)
    cases = [
        # long-context tier (prompts above 200K), asked in an order that makes it bisect
        (SONNET, "anthropic", Usage(300_000, 250_000, 40_000, 0, 900), day.replace(hour=9)),
        (
            SONNET,
            "anthropic",
            Usage(150_000, 140_000, 9_000, 0, 900),
            day.replace(hour=9, minute=5),
        ),
        (SONNET, "anthropic", Usage(200_001, 0, 200_000, 0, 10), day.replace(hour=9, minute=7)),
        (SONNET, "anthropic", Usage(200_000, 0, 200_000, 0, 10), day.replace(hour=9, minute=8)),
        (
            SONNET,
            "anthropic",
            Usage(50_000, 0, 0, 50_000, 10),
            day.replace(hour=9, minute=9),
        ),  # 1 h writes
        ("gpt-5", "openai", Usage(40_000, 30_000, 0, 0, 2_000, 1_500), day.replace(hour=12)),
        # time-of-day prices (DeepSeek off-peak from 16:30 UTC): either side of the edge
        (
            "deepseek-chat",
            "deepseek",
            Usage(10_000, 4_000, 0, 0, 500),
            day.replace(hour=16, minute=29),
        ),
        (
            "deepseek-chat",
            "deepseek",
            Usage(10_000, 4_000, 0, 0, 500),
            day.replace(hour=16, minute=31),
        ),
        (
            "deepseek-chat",
            "deepseek",
            Usage(10_000, 4_000, 0, 0, 500),
            day.replace(hour=0, minute=20),
        ),
        (
            "deepseek-chat",
            "deepseek",
            Usage(10_000, 4_000, 0, 0, 500),
            day.replace(hour=0, minute=40),
        ),
    ]
    totals = set()
    for model, provider, u, at in cases:
        got, _ = pricer.cost(u, model, provider, None, at.timestamp())
        want = BOOK.cost(u, model, provider, at=at).total
        assert got is not None and got == want, (model, u, at)
        totals.add((model, got))
    deepseek = [pricer.cost(c[2], c[0], c[1], None, c[3].timestamp())[0] for c in cases[6:]]
    assert deepseek[0] != deepseek[1]  # the window edge is honoured, not smeared over an hour


def test_call_pricer_units_are_exact_for_rates_of_any_precision() -> None:
    """Calls are priced in integer units of 1e-18; a rate finer than that (more than 12
    decimals per million tokens) is priced in Decimal, as exact as Rates.price."""
    coarse = Rates(Decimal("3"), Decimal("0.3"), Decimal("3.75"), Decimal("6"), Decimal("15"))
    fine = Rates(
        Decimal("3.0000000000001"),
        Decimal("0.3"),
        Decimal("3.75"),
        Decimal("6"),
        Decimal("15.00000000000007"),
    )
    compiled: CompiledSteps = {
        ("coarse", None, None): ((0,), (coarse,)),
        ("fine", None, None): ((0,), (fine,)),
    }
    pricer = CallPricer(BOOK, compiled)
    u = Usage(1_234_567, 1_000_003, 7, 11, 98_765)
    for model, rates in (("coarse", coarse), ("fine", fine)):
        units, paid = pricer.units(u, model, None, None, 0.0)
        assert paid is rates and units is not None
        assert isinstance(units, int if model == "coarse" else Decimal)
        assert usd(units) == sum(rates.price(u))
        assert pricer.cost(u, model, None, None, 0.0)[0] == usd(units)
    assert pricer.units(Usage(0, 0, 0, 0, 0), "unknown-model", None, None, 0.0)[0] == 0
    assert pricer.units(Usage(5, 0, 0, 0, 1), "unknown-model", None, None, 0.0)[0] is None


def test_reports_cross_from_a_worker_unchanged() -> None:
    """A worker's reports reach the caller equal, field by field, in their rare shapes too:
    a cost in Decimal units (a rate finer than a unit), unpriced calls, a break whose cost
    is unknown, the plot series."""
    fine = Rates(
        Decimal("3.0000000000001"), Decimal("0.3"), Decimal("3.75"), Decimal("6"), Decimal("15")
    )
    pricer = CallPricer(BOOK, {("fine", None, None): ((0,), (fine,))})
    session = ImportedSession("claude-code", "s-cross", "p")
    for i, (model, read) in enumerate(
        [("fine", 0), ("fine", 90_000), ("no-such-model", 0), ("no-such-model", 0)]
    ):
        usage = Usage(100_000, read, 100_000 - read if i == 0 else 0, 0, 50)
        session.calls.append(Call(T0.timestamp() + 60 * i, model, usage))
    report = analyse(session, pricer, keep_series=True)
    assert isinstance(report.total.cost_units, Decimal) and report.total.unpriced_calls == 2
    assert any(b.extra_cost is None for b in report.cache_breaks) and report.series is not None
    crossed = _REPORTS_IN.decode(_REPORTS_OUT.encode([report]))
    assert crossed == [report]
    assert type(crossed[0].total.cost_units) is Decimal
    assert crossed[0].to_json() == report.to_json()


# --- cache-break forensics ----------------------------------------------------------------


def breaks(tmp_path: Path, lines: list[dict[str, Any]]) -> list[dict[str, Any]]:
    write_jsonl(tmp_path / "projects" / "p" / f"{lines[0]['sessionId']}.jsonl", lines)
    return only_session(audit(tmp_path))["cache_breaks"]


def test_costliest_calls_are_ranked_by_their_price(tmp_path: Path) -> None:
    s = "s-costly"
    sizes = [3_000, 90_000, 1_000, 40_000, 2_000, 60_000, 500]
    write_jsonl(
        tmp_path / "projects" / "p" / f"{s}.jsonl",
        [assistant(s, 10 * i, f"msg_{i}", uncached=n, out=10) for i, n in enumerate(sizes)],
    )
    session = only_session(audit(tmp_path))
    ranked = [c["call"] for c in session["costliest_calls"]]
    assert ranked == [2, 6, 4, 1, 5]  # 1-based calls by prompt size, top five
    costs = [Decimal(c["cost_usd"]) for c in session["costliest_calls"]]
    assert costs == sorted(costs, reverse=True)


def test_idle_gap_past_the_5_minute_lifetime_breaks_the_cache(tmp_path: Path) -> None:
    s = "s-idle"
    found = breaks(
        tmp_path,
        [
            assistant(s, 0, "msg_1", write=20_000),
            assistant(s, 30, "msg_2", read=20_000, write=500),  # within 5 min: a full read
            assistant(s, 30 + 600, "msg_3", read=0, write=20_503),  # 10 min idle: all rewritten
        ],
    )
    assert len(found) == 1
    b = found[0]
    assert (b["call"], b["reason"], b["lost_tokens"], b["gap_s"]) == (
        3,
        "ttl_expired",
        20_500,
        600.0,
    )
    r = rates()
    assert Decimal(b["extra_cost_usd"]) == 20_500 * (r.cache_write_5m - r.cache_read) / MTOK


def test_one_hour_writes_survive_a_ten_minute_gap_but_not_two_hours(tmp_path: Path) -> None:
    s = "s-1h"
    found = breaks(
        tmp_path,
        [
            assistant(s, 0, "msg_1", write_1h=30_000),
            assistant(s, 600, "msg_2", read=30_000, write_1h=200),
            assistant(s, 600 + 7200, "msg_3", read=0, write_1h=30_203),
            # 15 minutes idle, then a short read: the 1 h entries are alive, so not the TTL
            assistant(s, 600 + 7200 + 900, "msg_4", read=10_000, write_1h=20_300),
        ],
    )
    assert [(b["call"], b["reason"], b["gap_s"]) for b in found] == [
        (3, "ttl_expired", 7200.0),
        (4, "prefix_edit", 900.0),
    ]
    r = rates()
    assert Decimal(found[0]["extra_cost_usd"]) == 30_200 * (r.cache_write_1h - r.cache_read) / MTOK


def test_mid_session_model_switch_breaks_the_cache(tmp_path: Path) -> None:
    s = "s-switch"
    found = breaks(
        tmp_path,
        [
            assistant(s, 0, "msg_1", write=20_000),
            assistant(s, 20, "msg_2", model=HAIKU, read=0, write=20_100),
            assistant(s, 40, "msg_3", model=HAIKU, read=20_100, write=300),
        ],
    )
    assert [(b["call"], b["reason"], b["lost_tokens"]) for b in found] == [
        (2, "model_switch", 20_000)
    ]
    r = rates(HAIKU)
    assert Decimal(found[0]["extra_cost_usd"]) == 20_000 * (r.cache_write_5m - r.cache_read) / MTOK


def test_compaction_and_prefix_edit_and_small_shortfalls(tmp_path: Path) -> None:
    s = "s-compact"
    found = breaks(
        tmp_path,
        [
            assistant(s, 0, "msg_1", write=20_000),
            compact_boundary(s, 10),
            assistant(s, 20, "msg_2", read=5_000, write=3_000),  # summary replaced the history
            assistant(s, 40, "msg_3", read=7_500, write=600),  # 500 short: block rounding, no break
            assistant(s, 60, "msg_4", read=4_000, write=4_500),  # early edit, no other cause
        ],
    )
    assert [(b["call"], b["reason"], b["lost_tokens"]) for b in found] == [
        (2, "compaction", 3_003),
        (4, "prefix_edit", 4_100),
    ]


def test_context_growth_fit_flags_quadratic_cumulative_input() -> None:
    linear = context_growth([10_000 + 2_000 * i for i in range(40)])
    assert (
        linear is not None and linear.quadratic and linear.growth_per_call == pytest.approx(2_000)
    )
    assert linear.fit_r2 == pytest.approx(1.0)
    flat = context_growth([50_000 + (7 if i % 2 else -7) for i in range(40)])
    assert flat is not None and not flat.quadratic
    assert context_growth([]) is None


# --- other formats ------------------------------------------------------------------------


def test_codex_rollout_from_documented_format() -> None:
    doc = audit(FIXTURES / "codex")
    session = only_session(doc)
    assert session["id"] == "0199a1b2-c3d4-7e5f-8a9b-0c1d2e3f4a5b"
    assert session["project"] == "/home/dev/shop" and session["source"] == "codex"
    assert session["calls"] == 3  # the repeated event and the rate-limit event are not calls
    assert doc["skipped_lines"] == 1  # the truncated last line
    u = session["usage"]
    assert (
        u["input_tokens"],
        u["cache_read_tokens"],
        u["output_tokens"],
        u["reasoning_tokens"],
    ) == (
        12_000 + 13_000 + 6_000,
        11_904,
        600 + 300 + 300,
        400 + 100 + 100,
    )
    models = {m["model"]: m["calls"] for m in session["models"]}
    assert models == {"gpt-5-codex": 2, "gpt-5": 1}
    assert [(b["call"], b["reason"]) for b in session["cache_breaks"]] == [(3, "model_switch")]
    at = datetime(2025, 10, 2, 9, tzinfo=UTC)
    want = sum(
        BOOK.cost(Usage(i, c, 0, 0, o, r), m, "openai", at=at).total  # type: ignore[misc]
        for i, c, o, r, m in [
            (12_000, 0, 600, 400, "gpt-5-codex"),
            (13_000, 11_904, 300, 100, "gpt-5-codex"),
            (6_000, 0, 300, 100, "gpt-5"),
        ]
    )
    assert Decimal(session["cost_usd"]) == want


def codex_usage(inp: int, cached: int = 0, out: int = 0, reasoning: int = 0) -> dict[str, int]:
    return {
        "input_tokens": inp,
        "cached_input_tokens": cached,
        "output_tokens": out,
        "reasoning_output_tokens": reasoning,
        "total_tokens": inp + out,
    }


def codex_token_count(at: float, total: Any, last: Any = None) -> dict[str, Any]:
    info: dict[str, Any] = {"model_context_window": 272000, "total_token_usage": total}
    if last is not None:
        info["last_token_usage"] = last
    return {
        "timestamp": ts(at),
        "type": "event_msg",
        "payload": {"type": "token_count", "info": info},
    }


CODEX_START = [
    {
        "timestamp": ts(0),
        "type": "session_meta",
        "payload": {"id": "0199a1b2-0000-7000-8000-00000000c0de", "cwd": "/w"},
    },
    {"timestamp": ts(0), "type": "turn_context", "payload": {"model": "gpt-5"}},
]


@pytest.mark.parametrize(
    "bad_total",
    [None, "25000", codex_usage(3_000), {**codex_usage(10_000), "input_tokens": None}],
    ids=["null", "string", "decreasing", "null_field"],
)
@pytest.mark.parametrize("later_have_last", [True, False], ids=["with_last", "totals_only"])
def test_codex_bad_running_total_counts_every_call_once(
    tmp_path: Path, bad_total: Any, later_have_last: bool
) -> None:
    """Three calls of 10,000 / 12,000 / 9,000 input tokens; the second event's running total
    is broken (null, a string, lower than before), the third is given once more when only the
    rate limits changed. Every call counts once: 31,000 input tokens, never 56,000."""
    calls = [
        codex_usage(10_000, 0, 500),
        codex_usage(12_000, 9_000, 400),
        codex_usage(9_000, 8_000, 300),
    ]
    totals = [
        codex_usage(10_000, 0, 500),
        codex_usage(22_000, 9_000, 900),
        codex_usage(31_000, 17_000, 1_200),
    ]
    lines = [
        *CODEX_START,
        codex_token_count(1, totals[0], calls[0] if later_have_last else None),
        codex_token_count(2, bad_total, calls[1]),
        codex_token_count(3, totals[2], calls[2] if later_have_last else None),
        codex_token_count(4, totals[2], calls[2] if later_have_last else None),  # rate limits only
    ]
    path = (
        tmp_path
        / "2025"
        / "11"
        / "19"
        / "rollout-2025-11-19T22-00-00-0199a1b2-0000-7000-8000-00000000c0de.jsonl"
    )
    write_jsonl(path, lines)
    session = only_session(audit(tmp_path))
    u = session["usage"]
    assert session["calls"] == 3
    assert (u["input_tokens"], u["cache_read_tokens"], u["output_tokens"]) == (
        31_000,
        17_000,
        1_200,
    )


def test_stayer_run_ledger_keeps_its_own_cache_break_verdicts(tmp_path: Path) -> None:
    run = tmp_path / "runs" / "r1"
    run.mkdir(parents=True)
    entry = {
        "model": "sim:claude-sonnet-4-5",
        "cost_usd": "0",
        "cache_hit_ratio": 0,
        "context_tokens": 0,
        "tool_calls": [],
    }
    ledger = [
        {
            **entry,
            "step": 1,
            "usage": Usage(12_000, 0, 12_000, 0, 100).to_dict(),
            "latency_s": 2.0,
            "cache_break": None,
        },
        {
            **entry,
            "step": 2,
            "usage": Usage(12_500, 12_000, 500, 0, 100).to_dict(),
            "latency_s": 2.0,
            "cache_break": None,
        },
        {
            **entry,
            "step": 3,
            "usage": Usage(13_000, 2_000, 11_000, 0, 100).to_dict(),
            "latency_s": 2.0,
            "cache_break": {"position_tokens": 2_000, "reason": "tools_changed", "detail": "…"},
        },
    ]
    (run / "result.json").write_text(
        json.dumps(
            {
                "run_id": "r1",
                "task": "fix-median",
                "task_path": "/t",
                "started": ts(0),
                "ledger": ledger,
            }
        )
    )
    session = only_session(audit(tmp_path / "runs"))
    assert session["source"] == "stayer" and session["calls"] == 3 and session["approximate_ts"]
    assert [
        (b["call"], b["reason"], b["lost_tokens"], b["gap_s"]) for b in session["cache_breaks"]
    ] == [(3, "tools_changed", 10_500, None)]
    assert session["cost_usd"] != "unknown"


# --- reports and the command ----------------------------------------------------------------


def _sessions_to_share(tmp_path: Path) -> list[SessionRef]:
    for k in range(8):
        write_jsonl(
            tmp_path / "projects" / "p" / f"s{k}.jsonl",
            [assistant(f"s{k}", 10 * i, f"msg_{k}_{i}", write=1000) for i in range(3)],
        )
    return discover([tmp_path]).refs


def _fail_in_a_helper(monkeypatch: pytest.MonkeyPatch, how: Callable[[], object]) -> None:
    """``analyse`` fails (``how``) in a helper process, once, while the caller waits at its
    first session until that has happened: so the failure is a helper's, whatever the
    order in which the processes took their batches."""
    import multiprocessing

    from stayer.audit import engine

    caller, failed = os.getpid(), multiprocessing.get_context("fork").Event()
    real = engine.analyse
    monkeypatch.setattr(engine, "_MIN_BATCH_BYTES", 1)  # a few small sessions, several batches

    def analyse(*args: Any, **kwargs: Any) -> Any:
        if os.getpid() != caller:
            failed.set()
            how()
        elif not failed.wait(120):
            raise AssertionError("no helper process took a batch")
        return real(*args, **kwargs)

    monkeypatch.setattr(engine, "analyse", analyse)


def _unpicklable(text: str) -> Exception:
    class Unpicklable(Exception):  # local to a function: pickle refuses it
        pass

    return Unpicklable(text)


@pytest.mark.parametrize(
    ("error", "reported"),
    [(ValueError, ValueError), (_unpicklable, RuntimeError)],
    ids=["as-raised", "unpicklable-by-its-text"],
)
def test_a_helper_process_error_reaches_the_caller(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    error: Callable[[str], Exception],
    reported: type[Exception],
) -> None:
    """A helper's exception is raised in the caller; one that pickle refuses, as a
    RuntimeError with its text."""
    refs = _sessions_to_share(tmp_path)

    def fail() -> None:
        raise error("a reader's bug")

    _fail_in_a_helper(monkeypatch, fail)
    with pytest.raises(reported, match="a reader's bug"):
        list(analyse_all(refs, BOOK, jobs=2, parallel_min_bytes=0))


def test_a_helper_process_that_dies_is_an_error_not_a_hang(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A helper killed midway (the kernel's OOM killer, say) ends the audit with an error:
    its sessions are missing, so no partial document is written as if whole."""
    refs = _sessions_to_share(tmp_path)
    _fail_in_a_helper(monkeypatch, lambda: os._exit(3))
    with pytest.raises(RuntimeError, match=r"ended without its reports \(exit code 3\)"):
        list(analyse_all(refs, BOOK, jobs=2, parallel_min_bytes=0))


def test_groups_since_and_parallel_workers_agree(tmp_path: Path) -> None:
    for k in range(6):
        s = f"s{k}"
        day = 86_400 * (k % 3)
        write_jsonl(
            tmp_path / "projects" / f"p{k % 2}" / f"{s}.jsonl",
            [
                assistant(
                    s,
                    day + 10 * i,
                    f"msg_{k}_{i}",
                    read=1000 * i,
                    write=1000,
                    model=SONNET if i % 2 else HAIKU,
                )
                for i in range(5)
            ],
        )
    found = discover([tmp_path])
    serial = build(analyse_all(found.refs, BOOK, jobs=1), "day").to_json()
    parallel = build(analyse_all(found.refs, BOOK, jobs=2, parallel_min_bytes=0), "day").to_json()
    assert serial == parallel
    assert [g["key"] for g in serial["groups"]] == ["2025-11-19", "2025-11-20", "2025-11-21"]
    assert sum(g["calls"] for g in serial["groups"]) == serial["totals"]["calls"] == 30
    by_model = build(analyse_all(found.refs, BOOK, jobs=1), "model").to_json()["groups"]
    assert {g["key"]: g["calls"] for g in by_model} == {SONNET: 12, HAIKU: 18}
    since = (T0 + timedelta(days=1)).replace(hour=0).timestamp()
    later = audit(tmp_path, since=since)
    assert later["totals"]["calls"] == 20 and len(later["sessions"]) == 4


def test_default_paths_follow_the_agents_environment_variables(tmp_path: Path) -> None:
    paths = default_paths(
        {
            "HOME": str(tmp_path),
            "CLAUDE_CONFIG_DIR": "/a,/b",
            "CODEX_HOME": "/c",
            "STAYER_HOME": "/s",
        }
    )
    assert paths == [Path("/a/projects"), Path("/b/projects"), Path("/c/sessions"), Path("/s/runs")]
    paths = default_paths({"HOME": str(tmp_path)})
    assert paths[:3] == [
        tmp_path / ".claude" / "projects",
        tmp_path / ".config" / "claude" / "projects",
        tmp_path / ".codex" / "sessions",
    ]


def stayer(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, HOME=str(cwd), STAYER_HOME=str(cwd / ".stayer"), COLUMNS="120")
    env["STAYER_CACHE"] = str(cwd / ".cache" / "stayer")
    env.pop("CLAUDE_CONFIG_DIR", None)
    env.pop("CODEX_HOME", None)
    return subprocess.run(
        [sys.executable, "-m", "stayer.cli", "audit", *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=cwd,
        timeout=120,
    )


def test_cli_json_contract_and_bad_input(tmp_path: Path) -> None:
    s = "s-cli"
    write_jsonl(
        tmp_path / "projects" / "p" / f"{s}.jsonl",
        [assistant(s, 0, "msg_1", write=20_000), assistant(s, 900, "msg_2", write=20_100)],
    )
    p = stayer(str(tmp_path / "projects"), "--json", cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    doc = json.loads(p.stdout)  # exactly one document on stdout
    assert {"calls", "usage", "cost_usd"} <= set(doc["totals"]) and "skipped_lines" in doc
    session = only_session(doc)
    assert {
        "id",
        "project",
        "calls",
        "usage",
        "cost_usd",
        "cache_hit_ratio",
        "cache_breaks",
    } <= set(session)
    assert {"call", "reason", "extra_cost_usd"} <= set(session["cache_breaks"][0])
    Decimal(doc["totals"]["cost_usd"])  # a decimal string
    tables = stayer(str(tmp_path / "projects"), cwd=tmp_path)
    assert (
        tables.returncode == 0
        and "stayer audit" in tables.stdout
        and "ttl_expired" in tables.stdout
    )

    for args, needle in [
        ([str(tmp_path / "nope")], "no such file"),
        ([str(tmp_path), "--since", "19/11/2025"], "--since"),
        ([str(tmp_path), "--group", "week"], "--group"),
        ([str(tmp_path), "--html", str(tmp_path / "missing" / "r.html")], "--html"),
        ([str(tmp_path), "--what-if", "model=llama-7b"], "--what-if"),
    ]:
        bad = stayer(*args, "--json", cwd=tmp_path)
        assert bad.returncode == 2 and needle in bad.stderr and bad.stdout == ""
    other = tmp_path / "notes.jsonl"
    other.write_text('{"hello": 1}\n')
    bad = stayer(str(other), cwd=tmp_path)
    assert bad.returncode == 2 and "notes.jsonl" in bad.stderr

    empty = stayer("--json", cwd=tmp_path)  # default paths under an empty HOME: an empty report
    assert empty.returncode == 0 and json.loads(empty.stdout)["totals"]["calls"] == 0


def test_audit_imports_neither_pydantic_nor_price_data_once_prices_are_compiled(
    tmp_path: Path,
) -> None:
    """``stayer audit`` reads its flags without pydantic, and an audit of models seen before
    prices them from the compiled steps it kept, without loading genai-prices."""
    s = "s-imports"
    write_jsonl(tmp_path / "projects" / "p" / f"{s}.jsonl", [assistant(s, 0, "msg_1")])
    env = dict(os.environ, HOME=str(tmp_path), STAYER_CACHE=str(tmp_path / "cache"))
    for _run in ("compiles the steps", "uses them"):
        p = subprocess.run(
            [sys.executable, "-X", "importtime", "-m", "stayer.cli", "audit"]
            + [str(tmp_path / "projects"), "--json", "--html", str(tmp_path / "a.html")],
            capture_output=True,
            text=True,
            env=env,
            cwd=tmp_path,
            timeout=120,
        )
        assert p.returncode == 0, p.stderr[-2000:]
        assert json.loads(p.stdout)["totals"]["calls"] == 1
    imported = {
        line.rsplit("|", 1)[1].strip()
        for line in p.stderr.splitlines()
        if line.startswith("import time:")
    }
    assert not {m for m in imported if m.split(".")[0] in ("pydantic", "genai_prices")}
    assert (tmp_path / "cache" / "audit-prices.marshal").is_file()  # STAYER_CACHE's


def test_html_report_is_self_contained_with_plots(tmp_path: Path) -> None:
    s = "s-html"
    write_jsonl(
        tmp_path / "projects" / "p" / f"{s}.jsonl",
        [assistant(s, 40 * i, f"msg_{i}", read=1000 * i, write=1000) for i in range(6)]
        + [assistant(s, 1000, "msg_late", write=7000)],
    )
    out = tmp_path / "report.html"
    p = stayer(str(tmp_path / "projects"), "--html", str(out), cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    html = out.read_text()
    assert html.count("<svg") == 3
    assert "ttl_expired" in html and s in html
    assert "<script" not in html and "<link" not in html and "src=" not in html
    assert not list(tmp_path.glob("report.html.*.tmp"))


# --- the real logs --------------------------------------------------------------------------


@pytest.mark.skipif(not CORPUS.is_dir(), reason=f"corpus not found at {CORPUS}")
def test_corpus_totals_match_an_independent_count(tmp_path: Path) -> None:
    """Against a plain re-count: every line parsed with json, repeats reduced by the same
    rule, no shortcuts (byte markers, lazy parsing, workers)."""
    kept: dict[tuple, dict[str, Any]] = {}
    unkeyed: list[dict[str, Any]] = []
    for f in sorted(CORPUS.rglob("*.jsonl")):
        for line in f.read_text().splitlines():
            d = json.loads(line)
            m = d.get("message")
            if (
                not isinstance(m, dict)
                or not isinstance(m.get("usage"), dict)
                or m.get("model") == "<synthetic>"
            ):
                continue
            u = m["usage"]
            total = sum(
                u.get(k) or 0
                for k in (
                    "input_tokens",
                    "output_tokens",
                    "cache_creation_input_tokens",
                    "cache_read_input_tokens",
                )
            )
            rec = {"u": u, "total": total, "side": bool(d.get("isSidechain"))}
            if not m.get("id"):
                unkeyed.append(rec)
                continue
            key = (m["id"], d.get("requestId"), d.get("sessionId"))
            old = kept.get(key)
            if (
                old is None
                or (old["side"] and not rec["side"])
                or (old["side"] == rec["side"] and total > old["total"])
            ):
                kept[key] = rec
    recs = list(kept.values()) + unkeyed
    want = {
        "uncached_input_tokens": sum(r["u"].get("input_tokens", 0) for r in recs),
        "cache_read_tokens": sum(r["u"].get("cache_read_input_tokens", 0) for r in recs),
        "cache_write_tokens": sum(r["u"].get("cache_creation_input_tokens", 0) for r in recs),
        "output_tokens": sum(r["u"].get("output_tokens", 0) for r in recs),
    }
    doc = audit(CORPUS)
    got = doc["totals"]["usage"]
    assert {k: got[k] for k in want} == want
    assert doc["totals"]["calls"] == len(recs)
    assert doc["totals"]["cost_usd"] != "unknown"


def test_reading_is_streamed_per_session(tmp_path: Path) -> None:
    """An importer hands back one session at a time; reading a session never touches
    another session's files."""
    write_jsonl(tmp_path / "projects" / "p" / "a.jsonl", [assistant("a", 0, "msg_a", write=1000)])
    write_jsonl(tmp_path / "projects" / "p" / "b.jsonl", [assistant("b", 0, "msg_b", write=1000)])
    refs = sorted(discover([tmp_path]).refs, key=lambda r: r.id)
    assert [r.paths for r in refs] == [
        (str(tmp_path / "projects" / "p" / "a.jsonl"),),
        (str(tmp_path / "projects" / "p" / "b.jsonl"),),
    ]
    session: ImportedSession = ClaudeCodeImporter().read(refs[0])
    assert [c.usage.cache_write_tokens for c in session.calls] == [1000]
    report = analyse(session, CallPricer(BOOK))
    assert report is not None and report.total.calls == 1


# --- what-if (through stayer.whatif) -------------------------------------------------


def test_what_if_scenarios_are_parsed_strictly() -> None:
    from stayer.audit.scenarios import parse_scenario
    from stayer.errors import ConfigError

    s = parse_scenario("model=sim:claude-haiku-4-5,policy=auto,max_context=50000")
    assert (s.model, s.policy, s.max_context) == ("claude-haiku-4-5", "auto", 50_000)
    assert parse_scenario("policy=mask:3").model is None
    for bad in (
        "",
        "haiku",
        "model=llama-7b",
        "policy=nope",
        "model=gpt-5,max_context=lots",
        "speed=fast",
    ):
        with pytest.raises(ConfigError, match="--what-if"):
            parse_scenario(bad)


def test_what_if_replays_a_claude_code_session_through_the_engine(tmp_path: Path) -> None:
    s = "s-whatif"
    lines: list[dict[str, Any]] = [
        {**user(s, 0), "message": {"role": "user", "content": "Fix the failing test in calc.py"}}
    ]
    context = 15_000
    for i in range(8):
        call = f"toolu_{i}"
        line = assistant(
            s,
            10 + 20 * i,
            f"msg_{i}",
            read=context if i else 0,
            write=800 if i else context,
            out=120,
        )
        line["message"]["content"] = [
            {"type": "text", "text": f"Step {i}: looking at the code."},
            {
                "type": "tool_use",
                "id": call,
                "name": "Bash",
                "input": {"command": f"sed -n {i},+40p calc.py"},
            },
        ]
        context += 803 if i else 3
        result = {
            **user(s, 20 + 20 * i),
            "message": {
                "role": "user",
                "content": [
                    {
                        "type": "tool_result",
                        "tool_use_id": call,
                        "content": "def add(a, b):\n    return a - b\n" * 40,
                    }
                ],
            },
        }
        lines += [line, result]
    write_jsonl(tmp_path / "projects" / "p" / f"{s}.jsonl", lines)
    found = discover([tmp_path])
    report = build(analyse_all(found.refs, BOOK, jobs=1))
    from stayer.audit.scenarios import parse_scenario, run_what_ifs

    refs = {(r.source, r.id): r for r in found.refs}
    scenarios = [parse_scenario("model=claude-haiku-4-5"), parse_scenario("policy=none")]
    entries = run_what_ifs(report.sessions, refs, scenarios, BOOK)
    assert [e.get("error") for e in entries] == [None, None]
    haiku, same = entries
    assert (
        haiku["estimate"] is True
        and haiku["requests"] == 8
        and haiku["model"] == "sim:claude-haiku-4-5"
    )
    # the same model and no policy is the baseline itself; a cheaper model costs less
    assert same["cost_usd"] == same["baseline_cost_usd"]
    assert Decimal(haiku["cost_usd"]) < Decimal(haiku["baseline_cost_usd"])
    # the stand-in prefix makes the replayed first prompt as large as the recorded one
    assert haiku["peak_context_tokens"] >= 15_000


def test_what_if_says_it_sets_the_main_chain_beside_the_replay_in_every_output(
    tmp_path: Path,
) -> None:
    """The replay covers the session's own agent only: every output labels its "actual" as
    the main chain and shows the session's total beside it; the HTML report has the section."""
    s = "s-scope"
    lines: list[dict[str, Any]] = [
        {**user(s, 0), "message": {"role": "user", "content": "Fix calc.py"}}
    ]
    for i in range(4):
        call = f"toolu_{i}"
        line = assistant(
            s, 10 + 20 * i, f"msg_{i}", read=12_000 if i else 0, write=900 if i else 12_000, out=100
        )
        line["message"]["content"] = [
            {"type": "tool_use", "id": call, "name": "Bash", "input": {"command": f"cat f{i}"}}
        ]
        lines += [
            line,
            {
                **user(s, 20 + 20 * i),
                "message": {
                    "role": "user",
                    "content": [
                        {"type": "tool_result", "tool_use_id": call, "content": "x = 1\n" * 200}
                    ],
                },
            },
        ]
    # A sub-agent's calls: in the session's total, not in the main chain the replay covers.
    lines += [
        assistant(s, 100 + i, f"msg_sub{i}", write=40_000, sidechain=True, agent="a1")
        for i in range(3)
    ]
    write_jsonl(tmp_path / "projects" / "p" / f"{s}.jsonl", lines)
    out = tmp_path / "report.html"
    args = (str(tmp_path / "projects"), "--what-if", "policy=none")
    doc = json.loads(stayer(*args, "--json", cwd=tmp_path).stdout)
    [w] = doc["what_if"]
    main, total = Decimal(w["actual_main_chain_cost_usd"]), Decimal(w["actual_cost_usd"])
    assert 0 < main < total
    terminal = stayer(*args, "--html", str(out), cwd=tmp_path)
    assert terminal.returncode == 0, terminal.stderr
    for text in (terminal.stdout, out.read_text()):
        assert "actual, main chain" in text and "session total" in text
        assert (
            "sub-agents&#x27; calls are left out" in text
            or "sub-agents' calls are left out" in text
        )
        assert w["actual_main_chain_cost_usd"] in text and w["actual_cost_usd"] in text
    assert "What-if (estimates, USD)" in out.read_text()


def test_compiled_price_steps_kept_between_audits_price_the_same(tmp_path: Path) -> None:
    """Steps saved by one audit and loaded by the next give the same report; steps saved
    for other prices (another fingerprint) or a garbled file are not used."""
    from stayer.audit.costing import load_steps, save_steps

    root = tmp_path / "projects" / "p"
    root.mkdir(parents=True)
    models = [SONNET, "claude-opus-4-1-20250805", SONNET]
    lines = [
        assistant("s", 60.0 * i, f"msg_{i}", model=m, read=150_000 * i, write=300)
        for i, m in enumerate(models)
    ]
    (root / "s.jsonl").write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    refs = discover([tmp_path / "projects"]).refs
    fresh: dict = {}
    first = build(analyse_all(refs, BOOK, jobs=1, compiled_steps=fresh)).to_json()
    assert {g[0] for g in fresh} == set(models)
    path = tmp_path / "cache" / "steps.marshal"
    save_steps(path, BOOK.fingerprint(), fresh)
    loaded = load_steps(path, BOOK.fingerprint())
    assert loaded == fresh
    assert build(analyse_all(refs, BOOK, jobs=1, compiled_steps=loaded)).to_json() == first
    assert load_steps(path, "other prices") == {}
    path.write_bytes(b"\x00garbled")
    assert load_steps(path, BOOK.fingerprint()) == {}


def test_discovery_skips_what_is_not_a_regular_file(tmp_path: Path) -> None:
    """A FIFO, or a link to one, named like a transcript is skipped, never opened to wait for
    a writer (an audit would hang); a directory named like one is walked, not read."""
    project = tmp_path / "projects" / "p"
    write_jsonl(project / "a.jsonl", [assistant("a", 0, "msg_a", write=1000)])
    os.mkfifo(project / "fifo.jsonl")
    (project / "link.jsonl").symlink_to(project / "fifo.jsonl")
    write_jsonl(project / "dir.jsonl" / "b.jsonl", [assistant("b", 0, "msg_b", write=1000)])
    refs = discover([tmp_path]).refs
    assert sorted(r.id for r in refs) == ["a", "b"]


def _stayer_run(root: Path) -> None:
    run = root / "runs" / "r1"
    run.mkdir(parents=True)
    entry = {"model": "sim:claude-sonnet-4-5", "cost_usd": "0", "step": 1, "latency_s": 1.0}
    doc = {"run_id": "r1", "task_path": "t", "started": ts(0), "ledger": [entry]}
    (run / "result.json").write_text(json.dumps(doc))


@pytest.mark.parametrize("source", ["claude-code", "codex", "stayer"])
def test_a_log_swapped_for_a_fifo_after_discovery_is_skipped_not_waited_on(
    source: str, tmp_path: Path
) -> None:
    """Discovery opens each log once, and each importer opens it again to read it: a log
    replaced by a FIFO in between (by whoever can write the log directory) is counted as
    unreadable and never opened (stayer.audit.calls.open_log), not even without blocking: a
    writer waiting on the FIFO before the importer reads, and still waiting after, tells
    that no reader came (any reader, a non-blocking one included, lets it through)."""
    import shutil

    from stayer.audit.engine import importers
    from stayer.audit.scenarios import _lines

    if source == "claude-code":
        write_jsonl(tmp_path / "projects" / "p" / "s.jsonl", [assistant("s", 0, "msg_a", write=9)])
    elif source == "codex":
        shutil.copytree(FIXTURES / "codex", tmp_path / "codex")
    else:
        _stayer_run(tmp_path)
    (ref,) = discover([tmp_path]).refs
    assert ref.source == source
    (name,) = ref.paths
    path = Path(name)
    path.unlink()
    os.mkfifo(path)

    def writer() -> None:
        with open(path, "wb"):  # returns once a reader has opened the FIFO
            pass

    waiting = threading.Thread(target=writer, daemon=True)
    waiting.start()
    deadline = time.monotonic() + 120  # reached only when the writer never waits
    while not _waiting_for_a_reader(waiting):
        assert time.monotonic() < deadline, "the writer never waited on the FIFO"
        time.sleep(0.01)
    try:
        (importer,) = [i for i in importers() if i.source == source]
        session = importer.read(ref)
        assert session.skipped_lines == 1 and session.calls == []
        assert list(_lines(path)) == []  # the what-if replay reads the log the same way
        assert _waiting_for_a_reader(waiting)  # nothing opened the FIFO
    finally:
        # let the writer through (a non-blocking reader of our own) and end its thread
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
        waiting.join()
        os.close(fd)


def _waiting_for_a_reader(thread: threading.Thread) -> bool:
    """Whether ``thread`` sleeps in the kernel's open of a FIFO, waiting for a reader (its
    wchan: ``wait_for_partner``, called by ``fifo_open``). A reader's open wakes it at once
    (it is then running, or past the open), so this tells whether any reader came."""
    wchan = Path(f"/proc/self/task/{thread.native_id}/wchan").read_text()
    return wchan in ("wait_for_partner", "fifo_open")


def test_sessions_encoded_in_the_workers_give_the_same_document(
    tmp_path: Path, capsysbinary: pytest.CaptureFixture[bytes]
) -> None:
    """``with_json`` has each session's JSON encoded where it was analysed, indented for its
    place in the document; the document ``--json`` prints is byte for byte the one made from
    the reports themselves (sub-agents, breaks and strings that need escaping included)."""
    from stayer.cli.common import emit_json

    project = tmp_path / "projects" / 'p "q"\\'
    for n in range(3):
        write_jsonl(
            project / f"s{n}.jsonl",
            [
                assistant(f"s{n}", 0, f"msg_{n}a", write=5000),
                assistant(f"s{n}", 10, f"msg_{n}b", read=5000, out=7),
                assistant(f"s{n}", 4000, f"msg_{n}c", write=9000, model=HAIKU),
                assistant(f"s{n}", 20, f"msg_{n}d", sidechain=True, agent="a\u00e9\n"),
            ],
        )
    refs = discover([tmp_path]).refs
    printed = []
    for with_json in (False, True):
        report = build(analyse_all(refs, BOOK, jobs=1, with_json=with_json))
        assert all((s.json_fragment is not None) == with_json for s in report.sessions)
        emit_json(report.to_json())
        printed.append(capsysbinary.readouterr().out)
    assert printed[0] == printed[1]
    doc = json.loads(printed[1])
    assert len(doc["sessions"]) == 3 and doc["sessions"][0]["subagents"][0]["id"] == "a\u00e9\n"


class _WholeDoc(AuditDoc, kw_only=True):
    """The document with no session encoded ahead by a worker."""

    sessions: list[SessionDoc]


def test_the_json_document_is_the_audit_records_and_nothing_else(tmp_path: Path) -> None:
    """``stayer audit --json`` is written from the audit's document records
    (``AuditDoc`` and its parts) only: read back into them and written again it is the
    same bytes, so no key is made beside them; their attributes hold its values."""
    project = tmp_path / "projects" / "p"
    write_jsonl(
        project / "s.jsonl",
        [
            assistant("s", 0, "msg_a", write=5000),
            assistant("s", 10, "msg_b", read=5000, out=7),
            assistant("s", 4000, "msg_c", write=9000, model=HAIKU),
            assistant("s", 20, "msg_d", sidechain=True, agent="helper"),
        ],
    )
    report = build(analyse_all(discover([tmp_path]).refs, BOOK, jobs=1), "model")
    doc = report.to_json()
    back = msgspec.convert(doc, _WholeDoc)
    assert orjson.dumps(doc_json(back)) == orjson.dumps(doc)
    session = back.sessions[0]
    assert back.totals.calls == session.calls == doc["totals"]["calls"] == 4
    assert back.totals.cost == doc["totals"]["cost_usd"] == session.cost
    assert [s.label for s in session.subagents] == ["helper"]
    assert [g.label for g in back.groups] == sorted([HAIKU, SONNET])
    assert back.totals.cache_breaks == len(session.cache_breaks) >= 1
    assert back.costliest_calls[0].session == "s" and back.costliest_calls[0].cost

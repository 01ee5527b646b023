"""The JSON that ``stayer eval`` and ``stayer rollouts`` print and write keeps its shape: the
field names, their order and every value that does not depend on the clock, the machine or a
random id, compared with a snapshot taken before the documents became records
(tests/fixtures/shapes/); so do ``stayer whatif --json`` and the audit's ``what_if``.
``STAYER_WRITE_SHAPES=1`` writes the snapshots again."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

import msgspec
from test_eval_fixtures import EXAMPLES, needs_bwrap, stayer
from test_eval_stats import A, B, record

from stayer.eval.runner import INFRASTRUCTURE
from stayer.eval.summary import summarise
from stayer.records import to_json
from stayer.scale.exports import export

SHAPES = Path(__file__).resolve().parent / "fixtures" / "shapes"
# Values of these fields depend on the clock, the machine or a random id.
VOLATILE = {
    "finished",
    "started",
    "wall_s",
    "mean_wall_s",
    "run_id",
    "run_dir",
    "traceback",
    "seconds_to_target",
    "stayer_version",
    "suite",
    "out",
    "report",
    "task_path",
    "id",
    "trajectory_id",
    "session_id",
}


def normal(value: Any, tmp: str, key: str = "") -> Any:
    """``value`` with what changes from run to run replaced by its type's name; lists of
    numbers by their length."""
    if isinstance(value, msgspec.Struct):
        return normal(to_json(value), tmp, key)
    if isinstance(value, dict):
        return {k: normal(v, tmp, k) for k, v in value.items()}
    if isinstance(value, list):
        if value and all(isinstance(v, int | float) and not isinstance(v, bool) for v in value):
            return f"<{len(value)} numbers>"
        return [normal(v, tmp, key) for v in value]
    if key in VOLATILE and value is not None:
        return f"<{type(value).__name__}>"
    if isinstance(value, str):
        value = value.replace(tmp, "<tmp>")
        return re.sub(r"(eval|run)-[\w.-]*-[0-9a-f]{8}\b", "<run-id>", value)
    return value


def check(name: str, doc: Any, tmp: Path | str = "/nonexistent") -> None:
    """``doc`` has the shape of snapshot ``name`` (as JSON text, so key order counts)."""
    text = json.dumps(normal(doc, str(tmp)), indent=1) + "\n"
    path = SHAPES / f"{name}.json"
    if os.environ.get("STAYER_WRITE_SHAPES"):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    assert text == path.read_text(), f"{name}: the document's shape changed"


def test_summary_of_fixed_records_keeps_its_shape():
    records = [
        record(A, "t1", 1, True),
        record(A, "t2", 1, False, cost="0.002"),
        record(A, "t3", 1, False, cost="0", error_class=INFRASTRUCTURE),
        record(B, "t1", 1, True, cost="0.0300"),
        record(B, "t2", 1, True, cost="unknown"),
    ]
    records[2]["run_id"] = "eval-t3-e1-0123abcd"
    records[1]["earlier_attempts"] = [{"run_id": None, "cost_usd": "0.5", "error_class": None}]
    check("eval-summary", summarise(records, [A, B], epochs=1))
    check("eval-summary-priced", summarise(records[:2] + records[3:4], [A, B], epochs=1))


@needs_bwrap
def test_eval_json_and_its_files_keep_their_shape(tmp_path):
    out = tmp_path / "out"
    models = "sim:claude-sonnet-4-5,sim:gpt-5"
    suite = tmp_path / "suite"
    suite.mkdir()
    for name in ("hello-file", "python"):
        (suite / name).symlink_to(EXAMPLES / name)
    args = ("eval", str(suite), "--model", models, "--json", "--out", str(out))
    r = stayer(*args, home=tmp_path / "home")
    assert r.returncode == 0, r.stderr
    check("eval-stdout", json.loads(r.stdout), tmp_path)
    check("eval-file", json.loads((out / "eval.json").read_text()), tmp_path)
    trials = sorted((out / "trials").rglob("*.json"))
    check("eval-trial", json.loads(trials[0].read_text()), tmp_path)


@needs_bwrap
def test_rollouts_json_and_exports_keep_their_shape(tmp_path):
    out = tmp_path / "ro"
    suite = tmp_path / "suite"
    suite.mkdir()
    (suite / "hello-file").symlink_to(EXAMPLES / "hello-file")
    home = tmp_path / "home"
    common = ("--model", "sim:claude-sonnet-4-5", "--out", str(out), "--json")
    r = stayer("rollouts", str(suite), *common, "--n", "2", "--target", "1", home=home)
    assert r.returncode == 0, r.stderr
    check("rollouts-stdout", json.loads(r.stdout), tmp_path)
    trials = sorted((out / "trials").rglob("*.json"))
    check("rollouts-trial", json.loads(trials[0].read_text()), tmp_path)
    rows = [json.loads(x) for x in (out / "rollouts.jsonl").read_text().splitlines()]
    check("rollouts-jsonl", rows, tmp_path)
    for fmt in ("verl", "atif", "skyrl", "verifiers"):
        written = export([json.loads(p.read_text()) for p in trials], tmp_path / fmt, fmt)
        check(f"rollouts-export-{fmt}", written, tmp_path)
        files = sorted(p for p in (tmp_path / fmt).rglob("*") if p.is_file())
        docs = [[json.loads(x) for x in p.read_text().splitlines()] for p in files if fmt == "verl"]
        docs += [json.loads(p.read_text()) for p in files if fmt != "verl"]
        check(f"rollouts-export-{fmt}-files", docs, tmp_path)
    s = stayer("rollouts", "stats", str(out), "--json", home=home)
    assert s.returncode == 0, s.stderr
    check("rollouts-stats", json.loads(s.stdout), tmp_path)


def test_whatif_json_keeps_its_shape(tmp_path):
    from test_whatif import mini_swe_agent_trace, whatif_json

    trace = mini_swe_agent_trace(tmp_path / "t.traj.json", 300)
    doc = whatif_json(str(trace), "--policy", "none,auto", home=tmp_path / "home")
    check("whatif-stdout", doc, tmp_path)


def test_audit_what_if_json_keeps_its_shape(tmp_path):
    from test_audit import assistant, user, write_jsonl
    from test_audit import stayer as audit

    s = "s-shape"
    lines: list[dict[str, Any]] = [{**user(s, 0), "message": {"role": "user", "content": "Fix"}}]
    for i in range(3):
        call = f"toolu_{i}"
        line = assistant(
            s, 10 + 20 * i, f"msg_{i}", read=12_000 if i else 0, write=900 if i else 12_000, out=100
        )
        line["message"]["content"] = [
            {"type": "tool_use", "id": call, "name": "Bash", "input": {"command": f"cat f{i}"}}
        ]
        result = [{"type": "tool_result", "tool_use_id": call, "content": "x = 1\n" * 200}]
        lines += [line, {**user(s, 20 + 20 * i), "message": {"role": "user", "content": result}}]
    write_jsonl(tmp_path / "projects" / "p" / f"{s}.jsonl", lines)
    args = (str(tmp_path / "projects"), "--what-if", "policy=none", "--what-if", "model=gpt-5")
    doc = json.loads(audit(*args, "--json", cwd=tmp_path).stdout)
    check("audit-what-if", doc["what_if"], tmp_path)


@needs_bwrap
def test_tasks_check_and_import_tb_json_keep_their_shape(tmp_path):
    from test_eval_fixtures import write_fixture_suite
    from test_tasks_check import write_tb_task

    home = tmp_path / "home"
    suite = write_fixture_suite(tmp_path / "suite", ["good", "nop-passes", "invalid"])
    r = stayer("tasks", "check", str(suite), "--json", home=home)
    doc = json.loads(r.stdout)
    for t in doc["tasks"]:
        t["oracle_s"] = t["verify_s"] = "<seconds>"
    check("tasks-check", doc, tmp_path)
    src = write_tb_task(tmp_path / "tb" / "greet")
    r = stayer("tasks", "import-tb", str(src), str(tmp_path / "tbsuite"), "--json", home=home)
    assert r.returncode == 0, r.stderr
    check("tasks-import-tb", json.loads(r.stdout), tmp_path)

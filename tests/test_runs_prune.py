"""`stayer runs prune` and `stayer report --last` (issue 35): runs deleted by selectors, with
their events, the blobs no other run refers to, and their directories; never a running one."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
from pg_server import database_fixture

from stayer.journal import RunRow, load_log, open_store
from stayer.journal.blobs import digest
from stayer.journal.lease import new_owner
from stayer.journal.log import blob_refs
from stayer.journal.sql import utc_now

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"

pg_url = database_fixture()


@pytest.fixture(params=["sqlite", "postgres"])
def store(request, tmp_path):
    url = "" if request.param == "sqlite" else request.getfixturevalue("pg_url")
    s = open_store(tmp_path / "home", url)
    yield s
    s.close()


def _run(store, run_id: str, owner: str, outputs: list[bytes], *, release: bool = True) -> None:
    now = utc_now()
    store.create_run(RunRow(run_id, "task", "sim:gpt-5", "running", 0, "0", now, now), owner, 60)
    events = [("tool_finished", {"output": digest(o)}) for o in outputs]
    store.append(run_id, owner, 0, events, {digest(o): o for o in outputs})
    if release:
        store.release(run_id, owner)


def test_delete_runs_keeps_shared_blobs_and_live_runs(store) -> None:
    owner = new_owner()
    shared, big, other = b"shared output", b"only a's output " * 20_000, b"b's own"
    _run(store, "a", owner, [shared, big])
    _run(store, "b", owner, [shared, other])
    _run(store, "live", owner, [b"live output"], release=False)  # its lease is held

    dry = store.delete_runs(["a", "live"], dry_run=True)
    assert (dry.runs, dry.events, dry.blobs) == (["a"], 2, [digest(big)])
    assert 0 < dry.blob_bytes < len(big)
    assert store.run("a") is not None and store.get_blob(digest(big)) == big  # nothing gone

    done = store.delete_runs(["a", "live"])
    assert (done.runs, done.events, done.blobs) == (["a"], 2, [digest(big)])
    assert store.run("a") is None and store.events("a") == []
    assert store.missing_blobs([digest(big), digest(shared), digest(other)]) == {digest(big)}
    if hasattr(store, "blobs"):  # SQLite: a large blob is a file, deleted too
        assert not store.blobs.path(digest(big)).exists()
    assert store.run("live") is not None
    assert load_log(store, "b").blobs[digest(shared)] == shared


def test_prune_status_corrupt_deletes_a_damaged_journal(tmp_path: Path) -> None:
    home = tmp_path / "home"
    store = open_store(home, "")
    owner = new_owner()
    _run(store, "damaged", owner, [b"one", b"two"])
    _run(store, "sound", owner, [b"three"])
    store.close()
    with sqlite3.connect(home / "stayer.db") as db:  # unreadable, and written before the last
        db.execute(
            "UPDATE stayer_events SET data = '{', at = '2020-01-01T00:00:00+00:00' "
            "WHERE run_id = 'damaged' AND seq = 0"
        )
    listed = stayer("runs", "--json", home=home)
    assert listed.returncode == 2 and "damaged" in listed.stderr
    r = stayer("runs", "prune", "--status", "corrupt", "--json", home=home)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["deleted"] == ["damaged"]
    assert _ids(home) == ["sound"]


# --- the commands ----------------------------------------------------------------------------


def stayer(*args: str, home: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.endswith("_API_KEY") and k != "STAYER_DB"}
    env.update({"STAYER_HOME": str(home), "PYTHONPATH": str(ROOT), "COLUMNS": "200"})
    return subprocess.run(
        [sys.executable, "-m", "stayer.cli", *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=home.parent,
        timeout=600,
    )


def _blobs_and_refs(home: Path) -> tuple[set[str], set[str]]:
    """Every blob stored (table and files) and every blob an event refers to."""
    store = open_store(home, "")
    try:
        stored = {r[0] for r in store.conn.execute("SELECT hash FROM stayer_blobs")}
        stored |= {p.parent.name + p.name for p in (home / "blobs").glob("*/*")}
        refs = {a for r in store.runs() for e in store.events(r.id) for a in blob_refs(e)}
    finally:
        store.close()
    return stored, refs


@pytest.fixture(scope="module")
def made(tmp_path_factory) -> Path:
    """Three runs, oldest first: one that failed, then the same task twice (the simulator
    answers alike, so the two share blobs)."""
    home = tmp_path_factory.mktemp("prune") / "home"
    sim = ("--model", "sim:claude-sonnet-4-5")
    failing = ("--sim-policy", "synthetic:steps=1,obs_tokens=50,out_tokens=20")
    for run_id, task, extra in [
        ("old-failed", "fix-median", failing),
        ("ok-1", "hello-file", ()),
        ("ok-2", "hello-file", ()),
    ]:
        r = stayer("run", str(EXAMPLES / task), *sim, *extra, "--run-id", run_id, home=home)
        assert r.returncode in (0, 1), r.stderr
    return home


def test_report_last_is_the_most_recent_run(made: Path, tmp_path: Path) -> None:
    doc = json.loads(stayer("report", "--last", "--json", home=made).stdout)
    assert doc["run_id"] == "ok-2"
    shown = stayer("report", "--last", home=made)
    assert shown.returncode == 0 and "run ok-2 · hello-file" in shown.stdout
    both = stayer("report", "ok-1", "--last", home=made)
    assert both.returncode == 2 and both.stderr.startswith("error: --last") and not both.stdout
    neither = stayer("report", home=made)
    assert neither.returncode == 2 and "--last" in neither.stderr
    empty = stayer("report", "--last", home=tmp_path / "none")
    assert empty.returncode == 2 and "error: --last: no runs in" in empty.stderr


def _ids(home: Path) -> list[str]:
    return [r["id"] for r in json.loads(stayer("runs", "--json", home=home).stdout)["runs"]]


@pytest.mark.parametrize(
    "args",
    [
        (),
        ("--status", "bogus"),
        ("--status", "running"),
        ("--keep", "-1"),
        ("--older-than", "3x"),
        ("--keep", "many"),
    ],
)
def test_prune_bad_input_is_exit_2_and_deletes_nothing(made: Path, args: tuple[str, ...]) -> None:
    before = _ids(made)
    r = stayer("runs", "prune", *args, home=made)
    assert r.returncode == 2 and r.stderr.startswith("error:"), r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and not r.stdout
    assert _ids(made) == before


def test_prune_deletes_by_selectors_and_only_unreferenced_blobs(made: Path) -> None:
    assert _ids(made) == ["ok-2", "ok-1", "old-failed"]
    stored, refs = _blobs_and_refs(made)
    orphans = stored - refs  # blobs no event refers to before (none expected, but kept)
    assert refs <= stored
    kept_report = stayer("report", "ok-2", "--json", home=made).stdout

    # Age: nothing is a day old; once old-failed is, --older-than finds it.
    none = json.loads(stayer("runs", "prune", "--older-than", "1d", "--json", home=made).stdout)
    assert none["deleted"] == [] and _ids(made) == ["ok-2", "ok-1", "old-failed"]
    with sqlite3.connect(made / "stayer.db") as db:
        db.execute(
            "UPDATE stayer_runs SET updated = ? WHERE id = ?",
            ("2020-01-01T00:00:00+00:00", "old-failed"),
        )
    workspace = (made / "runs" / "old-failed" / "workspace").resolve()  # kept apart, linked
    assert workspace.is_dir() and made not in workspace.parents
    dry = stayer("runs", "prune", "--older-than", "30d", "--dry-run", home=made)
    assert dry.returncode == 0 and "would delete old-failed (failed" in dry.stdout
    assert _ids(made) == ["ok-2", "ok-1", "old-failed"] and (made / "runs" / "old-failed").is_dir()
    old = json.loads(stayer("runs", "prune", "--older-than", "30d", "--json", home=made).stdout)
    assert old["deleted"] == ["old-failed"] and old["events"] > 0 and old["blobs"] > 0
    assert old["run_dirs"] == [str(made / "runs" / "old-failed")]
    assert not (made / "runs" / "old-failed").exists() and not workspace.exists()

    # Status and --keep: the older of the two succeeded runs; the blobs it shares stay.
    r = stayer("runs", "prune", "--status", "succeeded", "--keep", "1", home=made)
    assert r.returncode == 0, r.stderr
    assert "deleted ok-1 (succeeded" in r.stdout and "deleted 1 run(s):" in r.stdout
    assert _ids(made) == ["ok-2"] and not (made / "runs" / "ok-1").exists()
    stored_after, refs_after = _blobs_and_refs(made)
    assert refs_after <= stored_after and stored_after - refs_after == orphans
    assert refs_after & (refs - refs_after) == set()
    assert stayer("report", "ok-2", "--json", home=made).stdout == kept_report

"""The journal's stores (SQLite and PostgreSQL), blobs, snapshots, leases and torn tails."""

from __future__ import annotations

import os
import socket
import sqlite3
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest
from pg_server import database_fixture

from stayer.journal import JournalCorrupt, JournalError, LeaseLost, RunRow, load_log, open_store
from stayer.journal.blobs import BlobError, FileBlobStore, digest, encode
from stayer.journal.lease import new_owner, owner_is_dead, run_status
from stayer.journal.snapshot import BlobSnapshots
from stayer.journal.sql import utc_now
from stayer.journal.sqlite import SqliteStore
from stayer.journal.store import StoreUnavailable

pg_url = database_fixture()


@pytest.fixture(params=["sqlite", "postgres"])
def backend(request, tmp_path) -> tuple[Path, str]:
    """(home, STAYER_DB): an empty URL means SQLite in home."""
    return tmp_path / "home", "" if request.param == "sqlite" else request.getfixturevalue("pg_url")


@pytest.fixture
def store(backend):
    s = open_store(*backend)
    yield s
    s.close()


def new_run(store, owner: str, ttl: float = 30.0, run_id: str | None = None) -> str:
    run_id = run_id or "r-" + uuid.uuid4().hex[:8]
    now = utc_now()
    store.create_run(
        RunRow(run_id, "task", "sim:gpt-5", "running", 0, "0", now, now, {"x": 1}), owner, ttl
    )
    return run_id


def test_runs_events_and_blobs_round_trip(store):
    owner = new_owner()
    run_id = new_run(store, owner)
    with pytest.raises(JournalError, match="already exists"):
        new_run(store, owner, run_id=run_id)
    big = b"observation " * 10_000
    blobs = {digest(big): big, digest(b"small"): b"small"}
    store.append(
        run_id,
        owner,
        0,
        [("a", {"n": 1}), ("b", {"ref": digest(big)})],
        blobs,
        {"steps": 3, "cost_usd": "0.5"},
    )
    store.append(run_id, owner, 2, [("c", {})])
    assert [(e.seq, e.kind, e.data) for e in store.events(run_id)] == [
        (0, "a", {"n": 1}),
        (1, "b", {"ref": digest(big)}),
        (2, "c", {}),
    ]
    assert store.get_blob(digest(big)) == big
    assert store.missing_blobs([digest(big), digest(b"nope")]) == {digest(b"nope")}
    # Compressed: repeated text takes far less than its raw size.
    assert 0 < store.blob_bytes([digest(big)]) < len(big) // 10
    row = store.run(run_id)
    assert (row.steps, row.cost_usd, row.header, row.lease_owner, row.lease_live) == (
        3,
        "0.5",
        {"x": 1},
        owner,
        True,
    )
    assert run_id in [r.id for r in store.runs()]
    # Two events with one number: the second writer is refused, nothing half-written.
    with pytest.raises(Exception):  # noqa: B017  (sqlite3 / psycopg integrity errors)
        store.append(run_id, owner, 2, [("dup", {})])
    assert len(store.events(run_id)) == 3
    store.truncate(run_id, owner, 0)
    assert [e.kind for e in store.events(run_id)] == ["a"]


def test_a_writer_without_the_lease_is_fenced_off(store):
    owner = new_owner()
    run_id = new_run(store, owner)
    with pytest.raises(LeaseLost):
        store.append(run_id, "someone-else", 0, [("a", {})])
    assert store.events(run_id) == []


def test_an_append_after_a_write_the_database_lost_is_refused(store):
    """A write acknowledged without a sync (``sync=False``) is lost if the database server
    crashes; the writer's next append must not leave a gap in the journal behind it."""
    owner = new_owner()
    run_id = new_run(store, owner)
    store.append(run_id, owner, 0, [("a", {}), ("b", {})])
    store.append(run_id, owner, 2, [("model_started", {"n": 0})], sync=False)
    with store._tx() as cur:  # the crash took the unsynced write
        cur.execute("DELETE FROM stayer_events WHERE run_id = ? AND seq = 2", (run_id,))
    with pytest.raises(StoreUnavailable, match="lost the journal's last write"):
        store.append(run_id, owner, 3, [("model_finished", {"n": 0})])
    assert [e.kind for e in store.events(run_id)] == ["a", "b"]
    load_log(store, run_id)  # readable: no gap


def test_claims_respect_live_leases_and_take_dead_or_expired_ones(store):
    owner = new_owner()
    elsewhere = f"{socket.gethostname()}-other:1:1:ab"  # another machine: only expiry frees it
    run_id = new_run(store, elsewhere)
    assert store.claim(run_id, owner, 30, owner_is_dead) == elsewhere
    assert store.renew(run_id, owner, 30) is False
    # A process on this host that has exited: its lease is taken at once, unexpired or not.
    dead = subprocess.run(
        [sys.executable, "-c", "from stayer.journal.lease import new_owner; print(new_owner())"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    assert owner_is_dead(dead) and not owner_is_dead(owner)
    other = new_run(store, dead)
    assert run_status(store.run(other)) == "interrupted"
    assert store.claim(other, owner, 30, owner_is_dead) is None
    assert store.run(other).lease_owner == owner and run_status(store.run(other)) == "running"
    # An expired lease is free for anyone.
    short = new_run(store, elsewhere, ttl=0.05)
    time.sleep(0.2)
    assert store.claim(short, owner, 30, owner_is_dead) is None
    store.release(short, owner)
    assert store.run(short).lease_owner is None
    with pytest.raises(JournalError, match="no such run"):
        store.claim("missing", owner, 30, owner_is_dead)


def test_concurrent_workers_each_claim_different_runs(store, backend):
    """Interrupted runs are handed out once each, however many workers ask at once
    (FOR UPDATE SKIP LOCKED on Postgres, the write lock on SQLite)."""
    ids = {new_run(store, "gone:1:1:x", ttl=-1) for _ in range(8)}
    claimed: list[str] = []
    lock = threading.Lock()

    def worker() -> None:
        own = open_store(*backend)
        me = new_owner()
        try:
            while (got := own.claim_next(me, 30)) is not None:
                with lock:
                    claimed.append(got)
        finally:
            own.close()

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    mine = [c for c in claimed if c in ids]
    assert sorted(mine) == sorted(ids)  # every run once, none twice


def test_blob_store_files_are_complete_or_absent(tmp_path):
    blobs = FileBlobStore(tmp_path / "blobs")
    data = b"x" * 5000
    address = digest(data)
    assert blobs.put_many({address: data}) > 0
    assert blobs.put_many({address: data}) == 0  # stored once
    assert blobs.get(address) == data
    assert not list((tmp_path / "blobs").rglob(".tmp-*"))
    path = blobs.path(address)
    path.write_bytes(path.read_bytes()[:10])  # torn
    with pytest.raises(BlobError):
        blobs.get(address)


def test_torn_tail_is_dropped_back_to_the_last_complete_event(store):
    owner = new_owner()
    run_id = new_run(store, owner)
    ok, lost = b"complete output", b"output whose blob never made it"
    store.append(
        run_id,
        owner,
        0,
        [("run_created", {"header": {}}), ("tool_finished", {"t": 0, "output": digest(ok)})],
        {digest(ok): ok},
    )
    # An event whose blob is missing (a write cut short), and one after it.
    store.append(
        run_id,
        owner,
        2,
        [("tool_finished", {"t": 1, "output": digest(lost)}), ("step", {"step": 1, "entry": {}})],
    )
    log = load_log(store, run_id)
    assert [e.kind for e in log.events] == ["run_created", "tool_finished"]
    assert log.torn == 2 and set(log.tools) == {0}


def _three_writes(store) -> tuple[str, str, dict[str, bytes]]:
    """A run of three writes (events 0-1, 2-3, 4-5), each with a tool output blob; the
    first two outputs are large enough for SQLite to keep them as files."""
    owner = new_owner()
    run_id = new_run(store, owner)
    outs = {k: os.urandom(200_000) if k != "c" else b"small output" for k in "abc"}
    seq = 0
    for t, data in enumerate(outs.values()):
        events = [
            ("tool_started", {"t": t, "name": "bash"}),
            ("tool_finished", {"t": t, "output": digest(data)}),
        ]
        store.append(run_id, owner, seq, events, {digest(data): data})
        seq += 2
    return run_id, owner, outs


def _set_blob(store, address: str, stored: bytes | None) -> None:
    """Overwrite (or with None delete) one stored blob, wherever the store keeps it."""
    files = getattr(store, "blobs", None)
    if files is not None and files.has(address):
        path = files.path(address)
        path.unlink() if stored is None else path.write_bytes(stored)
        return
    with store._tx() as cur:
        if stored is None:
            cur.execute("DELETE FROM stayer_blobs WHERE hash = ?", (address,))
        else:
            cur.execute("UPDATE stayer_blobs SET data = ? WHERE hash = ?", (stored, address))


def _flip_one_byte(store, address: str) -> None:
    files = getattr(store, "blobs", None)
    if files is not None and files.has(address):
        stored = files.path(address).read_bytes()
    else:
        stored = bytes(
            store._read("SELECT data FROM stayer_blobs WHERE hash = ?", (address,))[0][0]
        )
    _set_blob(store, address, stored[:-1] + bytes([stored[-1] ^ 1]))


@pytest.mark.parametrize("damage", ["flipped", "missing"])
def test_a_damaged_blob_before_the_last_write_is_corruption_not_a_torn_tail(store, damage):
    run_id, _owner, outs = _three_writes(store)
    for k, seq in (("a", 1), ("b", 3)):
        address = digest(outs[k])
        (_flip_one_byte(store, address) if damage == "flipped" else _set_blob(store, address, None))
        with pytest.raises(JournalCorrupt) as e:
            load_log(store, run_id)
        assert (e.value.run_id, e.value.seq, e.value.kind) == (run_id, seq, "tool_finished")
        message = str(e.value)
        assert f"run {run_id}" in message and f"event {seq} of 6" in message and "\n" not in message
        assert ("missing" if damage == "missing" else "do not match") in message
        assert len(store.events(run_id)) == 6  # nothing dropped
        # Repaired (put back if missing, rewritten if damaged), then the next one is damaged.
        store.put_blobs({address: outs[k]})
        _set_blob(store, address, encode(outs[k]))
    # The same damage in the last write is a torn tail: dropped, the rest read.
    _set_blob(store, digest(outs["c"]), None)
    log = load_log(store, run_id)
    assert (
        log.torn == 1
        and [e.seq for e in log.events] == [0, 1, 2, 3, 4]
        and set(log.tools) == {0, 1}
    )


def test_an_unreadable_or_missing_event_before_the_last_write_is_corruption(store):
    run_id, _owner, _outs = _three_writes(store)
    with store._tx() as cur:
        cur.execute(
            "UPDATE stayer_events SET data = ? WHERE run_id = ? AND seq = 2",
            ('{"t": 1, "na', run_id),
        )
    with pytest.raises(
        JournalCorrupt, match=r"corrupt at event 2 of 6 \(tool_started\): unreadable record"
    ):
        load_log(store, run_id)
    with store._tx() as cur:
        cur.execute("DELETE FROM stayer_events WHERE run_id = ? AND seq = 2", (run_id,))
    with pytest.raises(JournalCorrupt, match=r"corrupt at event 2 of 5 \(missing\)"):
        load_log(store, run_id)
    if isinstance(store, SqliteStore):  # SQLite stores any bytes as text; PostgreSQL refuses them
        with store._tx() as cur:
            cur.execute(
                "UPDATE stayer_events SET data = CAST(X'7b22ff' AS TEXT) WHERE run_id = ? AND seq = 1",
                (run_id,),
            )
        with pytest.raises(
            JournalCorrupt, match=r"corrupt at event 1 of 5 \(tool_finished\): unreadable record"
        ):
            load_log(store, run_id)
    # An unreadable record in the last write is a torn tail.
    other, _owner, _outs = _three_writes(store)
    with store._tx() as cur:
        cur.execute(
            "UPDATE stayer_events SET data = ? WHERE run_id = ? AND seq = 5", ("[1]", other)
        )
    log = load_log(store, other)
    assert log.torn == 1 and len(log.events) == 5


def test_snapshots_in_the_blob_store_restore_exactly(store, tmp_path):
    ws = tmp_path / "ws"
    (ws / "sub" / "empty").mkdir(parents=True)
    (ws / "a.txt").write_text("alpha\n")
    (ws / "sub" / "run.sh").write_text("#!/bin/sh\n")
    os.chmod(ws / "sub" / "run.sh", 0o755)
    os.symlink("a.txt", ws / "link")
    log = ws / "big.log"
    log.write_bytes(os.urandom(3 << 20))
    snaps = BlobSnapshots(store.put_blobs, store.get_blob)
    first = snaps.snapshot(ws)
    size = lambda: store.blob_bytes(_all_blobs(store))  # noqa: E731
    before = size()
    with log.open("ab") as f:  # a growing log: only its last chunk is new
        f.write(os.urandom(1000))
    (ws / "a.txt").write_text("changed\n")
    second = snaps.snapshot(ws)
    assert second != first
    assert size() - before < (1 << 20) + 100_000
    (ws / "new").write_text("x")
    snaps.restore(first, ws)
    assert sorted(p.name for p in ws.iterdir()) == ["a.txt", "big.log", "link", "sub"]
    assert (ws / "a.txt").read_text() == "alpha\n" and os.readlink(ws / "link") == "a.txt"
    assert (ws / "sub" / "empty").is_dir() and os.stat(
        ws / "sub" / "run.sh"
    ).st_mode & 0o777 == 0o755
    assert log.stat().st_size == 3 << 20
    other = tmp_path / "elsewhere"
    BlobSnapshots(store.put_blobs, store.get_blob).restore(second, other)  # another process
    assert (other / "a.txt").read_text() == "changed\n" and (other / "big.log").stat().st_size == (
        3 << 20
    ) + 1000


def _all_blobs(store) -> list[str]:
    files = getattr(store, "blobs", None)
    on_disk = (
        [p.parent.name + p.name for p in files.root.rglob("*") if p.is_file()] if files else []
    )
    return on_disk + [r[0] for r in store._read("SELECT hash FROM stayer_blobs")]


def test_newer_schema_and_unopenable_databases_are_one_line_errors(tmp_path):
    home = tmp_path / "home"
    s = open_store(home, "")
    s.close()
    con = sqlite3.connect(home / "stayer.db")
    con.execute("UPDATE stayer_meta SET value = '99' WHERE key = 'schema_version'")
    con.commit()
    con.close()
    with pytest.raises(JournalError, match="schema version 99 is newer"):
        open_store(home, "")
    garbage = tmp_path / "garbage"
    garbage.mkdir()
    (garbage / "stayer.db").write_bytes(b"this is not a database" * 100)
    with pytest.raises(JournalError, match="cannot open the journal database"):
        open_store(garbage, "")
    with pytest.raises(JournalError, match="STAYER_DB"):
        open_store(home, "mysql://x")
    assert open_store(tmp_path / "fresh", "", create=False) is None
    assert not (tmp_path / "fresh").exists()


def test_unreachable_postgres_is_a_one_line_error_without_the_password(tmp_path):
    pytest.importorskip("psycopg")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(JournalError) as e:
        open_store(tmp_path, f"postgresql://u:secret@127.0.0.1:{port}/db")
    assert "cannot open the journal database" in str(e.value) and "secret" not in str(e.value)
    assert "\n" not in str(e.value)


def test_newer_schema_on_postgres(pg_url, tmp_path):
    import psycopg

    s = open_store(tmp_path, pg_url)
    s.close()
    with psycopg.connect(pg_url, autocommit=True) as c:
        c.execute("UPDATE stayer_meta SET value = '99' WHERE key = 'schema_version'")
    try:
        with pytest.raises(JournalError, match="newer than this stayer"):
            open_store(tmp_path, pg_url)
    finally:
        with psycopg.connect(pg_url, autocommit=True) as c:
            c.execute("UPDATE stayer_meta SET value = '1' WHERE key = 'schema_version'")


def test_two_clients_creating_one_run_at_once_on_postgres(pg_url, tmp_path):
    """The second of two clients creating one run id at once gets the JournalError that
    says so (which a gateway session's opener catches), not a unique-key violation: the
    other's row is inserted but not committed when this client checks for it."""
    import psycopg

    store = open_store(tmp_path, pg_url)
    run_id, now = "r-" + uuid.uuid4().hex[:8], utc_now()
    got: list[BaseException] = []

    def create() -> None:
        try:
            new_run(store, new_owner(), run_id=run_id)
        except BaseException as e:  # noqa: BLE001 - the test reads it
            got.append(e)

    try:
        with psycopg.connect(pg_url) as other:  # one transaction, committed below
            other.execute(
                "INSERT INTO stayer_runs (id, task, model, status, started, updated, header) "
                "VALUES (%s, 'task', 'sim:gpt-5', 'running', %s, %s, '{}')",
                (run_id, now, now),
            )
            creator = threading.Thread(target=create)
            creator.start()
            with psycopg.connect(pg_url, autocommit=True) as watch:
                deadline = time.monotonic() + 60
                while not watch.execute(  # the creator waits on the uncommitted row
                    "SELECT count(*) FROM pg_stat_activity "
                    "WHERE datname = current_database() AND wait_event_type = 'Lock'"
                ).fetchone()[0]:
                    assert time.monotonic() < deadline and creator.is_alive(), got
                    time.sleep(0.02)
            other.commit()
        creator.join(60)
    finally:
        store.close()
    assert len(got) == 1 and isinstance(got[0], JournalError), got
    assert "already exists" in str(got[0])


def test_lease_owner_ids():
    me = new_owner()
    assert me.split(":")[0] == socket.gethostname() and me.split(":")[1] == str(os.getpid())
    assert me != new_owner()  # two sessions in one process are told apart
    assert not owner_is_dead("some-other-host:1:1:x")  # cannot know: wait for expiry
    assert owner_is_dead(f"{socket.gethostname()}:999999999:1:x")
    assert not owner_is_dead("garbage")
    child = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "from stayer.journal.lease import new_owner; print(new_owner(), flush=True); input()",
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    owner = child.stdout.readline().strip()
    assert not owner_is_dead(owner)
    child.kill()
    deadline = time.time() + 10
    while not owner_is_dead(owner) and time.time() < deadline:  # killed, not yet reaped: a zombie
        time.sleep(0.01)
    assert owner_is_dead(owner)
    child.wait()


def test_psycopg_s_duplicate_of_a_raised_error_is_not_printed(caplog) -> None:
    # psycopg logs "error ignored terminating <Pipeline>: the connection is lost" while the
    # same loss is raised; logging's last resort printed it above the journal's own line.
    import logging

    from stayer.journal.postgres import quiet_duplicate_warnings

    logger = logging.getLogger("psycopg.test-duplicate")  # a child: the filter is per logger
    quiet_duplicate_warnings(logger)
    quiet_duplicate_warnings(logger)  # once only
    assert len(logger.filters) == 1
    logger.warning("error ignored terminating %r: %s", "<psycopg.Pipeline [BAD]>", "lost")
    logger.warning("another warning: %s", "kept")
    said = [r.getMessage() for r in caplog.records]
    assert said == ["another warning: kept"]

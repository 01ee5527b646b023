"""One snapshot algorithm, two object backends (issue 14 item 7): the journal's
``BlobSnapshots`` passes the same behaviour tests as the sandbox's ``FileSnapshotStore``
(those of tests/test_snapshot.py that are about what a snapshot keeps and restores, run
here again over the journal's blobs), gives the same ids for the same tree where the
backends agree on the layout (files up to 1 MiB), and still restores snapshots written
in the journal's earlier format."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

# The behaviour tests, collected here again with this module's ``store`` fixture.
from test_snapshot import (  # noqa: F401
    no_racy_window,
    test_a_same_size_rewrite_keeping_the_mtime_is_noticed,
    test_change_watch_sees_writes_made_inside_the_sandbox,
    test_hard_links_out_of_the_workspace_defeat_the_watch_not_the_snapshot,
    test_random_histories_roll_back_exactly,
    test_recently_changed_files_are_not_trusted_to_the_cache,
    test_restore_does_not_follow_a_planted_symlink,
    test_restore_into_an_empty_directory_is_exact,
    test_rollback_in_place_undoes_every_kind_of_change,
    tree,
    ws,
)

import stayer.workspace.snapshot as snapshot_module
from stayer.journal.blobs import digest
from stayer.journal.snapshot import CHUNK, BlobSnapshots
from stayer.workspace.snapshot import FileSnapshotStore, SnapshotNotFound


class Blobs(dict):
    """A journal store's blobs, as far as snapshots see them."""

    def put(self, blobs) -> None:
        for address, data in blobs.items():
            assert digest(data) == address  # every blob is named by its bytes' hash
            self[address] = bytes(data)


@pytest.fixture
def blobs() -> Blobs:
    return Blobs()


@pytest.fixture
def store(blobs: Blobs) -> BlobSnapshots:
    s = BlobSnapshots(blobs.put, blobs.__getitem__)
    yield s
    s.close()


def test_same_tree_same_id_on_both_backends(tmp_path: Path, blobs: Blobs) -> None:
    work = tmp_path / "small"
    (work / "d" / "e").mkdir(parents=True)
    (work / "d" / "f.txt").write_text("f\n")
    (work / os.fsdecode(b"caf\xc3\xa9-\xff")).write_text("odd name")
    (work / "one-mib").write_bytes(b"x" * CHUNK)  # the largest a journal blob takes whole
    os.symlink("d", work / "link")
    os.mkfifo(work / "fifo")
    files = FileSnapshotStore(tmp_path / "store", shared_watch=False)
    journal = BlobSnapshots(blobs.put, blobs.__getitem__)
    assert files.snapshot(work) == journal.snapshot(work)
    files.close()


def test_big_files_are_pieces_and_a_growing_log_stores_only_its_tail(
    tmp_path: Path, blobs: Blobs
) -> None:
    work = tmp_path / "work"
    work.mkdir()
    log = work / "log"
    log.write_bytes(os.urandom(3 * CHUNK + 5))
    snaps = BlobSnapshots(blobs.put, blobs.__getitem__)
    a = snaps.snapshot(work)
    assert max(len(b) for b in blobs.values()) <= CHUNK
    stored = sum(len(b) for b in blobs.values())
    with log.open("ab") as f:
        f.write(os.urandom(1000))
    b = snaps.snapshot(work)
    assert b != a and sum(len(x) for x in blobs.values()) - stored < 10_000
    copy = tmp_path / "copy"
    BlobSnapshots(blobs.put, blobs.__getitem__).restore(a, copy)  # another process
    assert (copy / "log").read_bytes() == log.read_bytes()[: 3 * CHUNK + 5]


def test_snapshots_of_the_earlier_format_still_restore(tmp_path: Path, blobs: Blobs) -> None:
    """A journal written before the one algorithm: git-style trees of JSON blobs."""

    def put(data: bytes) -> str:
        blobs[digest(data)] = data
        return digest(data)

    chunk = os.urandom(CHUNK)
    inner = put(json.dumps([{"name": "x", "link": "../f"}]).encode())
    root = put(
        json.dumps(
            [
                {"name": "d", "mode": 0o555, "tree": inner},
                {
                    "name": "f",
                    "mode": 0o6755,
                    "size": 5,
                    "mtime_ns": 10**18,
                    "chunks": [put(b"hello")],
                },
                {"name": "p", "mode": 0o640, "fifo": True},
                {
                    "name": "s",
                    "mode": 0o644,
                    "size": 3 * CHUNK,
                    "mtime_ns": 7,
                    "chunks": [None, put(chunk), None],
                },
            ]
        ).encode()
    )
    work = tmp_path / "work"
    work.mkdir()
    (work / "extra").write_text("not in the snapshot")
    snaps = BlobSnapshots(blobs.put, blobs.__getitem__)
    snaps.restore(root, work)
    assert sorted(os.listdir(work)) == ["d", "f", "p", "s"]
    assert (work / "f").read_bytes() == b"hello" and os.stat(work / "f").st_mtime_ns == 10**18
    assert stat.S_IMODE(os.stat(work / "f").st_mode) == 0o755  # no setuid or setgid bit
    assert (
        os.readlink(work / "d" / "x") == "../f"
        and stat.S_IMODE(os.stat(work / "d").st_mode) == 0o555
    )
    assert stat.S_ISFIFO(os.lstat(work / "p").st_mode)
    s = work / "s"
    assert s.stat().st_size == 3 * CHUNK and s.read_bytes()[CHUNK : 2 * CHUNK] == chunk
    assert s.stat().st_blocks * 512 < 2 * CHUNK  # the holes stayed holes
    # Then on in the new format, from that tree.
    sid = snaps.snapshot(work)
    os.chmod(work / "d", 0o755)
    (work / "d" / "new").write_text("new")
    snaps.restore(sid, work)
    assert not (work / "d" / "new").exists() and (work / "f").read_bytes() == b"hello"
    os.chmod(work / "d", 0o755)


def test_an_unknown_id_is_not_found(tmp_path: Path, blobs: Blobs) -> None:
    snaps = BlobSnapshots(blobs.put, blobs.__getitem__)
    for bad in ("0" * 64, "../../etc/passwd"):
        with pytest.raises(SnapshotNotFound):
            snaps.restore(bad, tmp_path / "work")
    blobs[digest(b'{"format": 99}')] = b'{"format": 99}'
    with pytest.raises(ValueError, match="unknown format"):
        snaps.restore(digest(b'{"format": 99}'), tmp_path / "work")


def test_a_coarse_clock_keeps_a_file_out_of_the_cache_for_two_seconds(
    tmp_path: Path, monkeypatch
) -> None:
    """On a file system that keeps whole seconds, a file changed in the last two seconds
    is read again next time, whatever the fine-clock window."""
    work = tmp_path / "work"
    work.mkdir()
    (work / "coarse").write_text("c")
    (work / "fine").write_text("f")
    real_walk = snapshot_module.walk
    now = 1_900_000_000 * 10**9

    def walk(*a, **k):
        for rel, st, fd, name in real_walk(*a, **k):
            if name in ("coarse", "fine"):
                ctime = now - 10**9 if name == "coarse" else now - 10**9 + 1
                fields = list(st[:10])
                st = os.stat_result(
                    fields, {"st_ctime_ns": ctime, "st_mtime_ns": ctime, "st_atime_ns": 0}
                )
            yield rel, st, fd, name

    monkeypatch.setattr(snapshot_module, "walk", walk)
    monkeypatch.setattr(snapshot_module.time, "time_ns", lambda: now)
    store = FileSnapshotStore(tmp_path / "store", shared_watch=False)
    store.snapshot(work)
    assert set(store._state(work.resolve()).cache or {}) == {"fine"}
    store.close()

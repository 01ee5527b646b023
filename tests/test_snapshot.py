"""Workspace snapshots: restore is exact, unchanged work is not redone, misuse is refused."""

from __future__ import annotations

import hashlib
import json
import os
import random
import stat
import subprocess
from pathlib import Path

import pytest
from sandbox_helpers import NO_BWRAP, run
from snapshot_helpers import daemon_stopped_after, store_with_daemon

import stayer.workspace.snapshot as snapshot_module
from stayer.workspace.snapshot import FileSnapshotStore, SnapshotNotFound, SnapshotStore
from stayer.workspace.watch import TreeWatch


def tree(root: Path) -> dict[str, tuple]:
    """Everything a restore must bring back, per relative path."""
    out: dict[str, tuple] = {".": ("d", stat.S_IMODE(os.lstat(root).st_mode))}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            path = os.path.join(dirpath, name)
            rel = os.path.relpath(path, root)
            st = os.lstat(path)
            if stat.S_ISLNK(st.st_mode):
                out[rel] = ("l", os.readlink(path))
            elif stat.S_ISDIR(st.st_mode):
                out[rel] = ("d", stat.S_IMODE(st.st_mode))
            elif stat.S_ISFIFO(st.st_mode):
                out[rel] = ("p", stat.S_IMODE(st.st_mode))
            else:
                digest = hashlib.sha256(Path(path).read_bytes()).hexdigest()
                out[rel] = ("f", stat.S_IMODE(st.st_mode), st.st_size, st.st_mtime_ns, digest)
    return out


def populate(ws: Path) -> None:
    """A workspace with one of everything a snapshot must keep."""
    (ws / "src" / "pkg").mkdir(parents=True)
    (ws / "src" / "pkg" / "mod.py").write_text("print('hi')\n")
    (ws / "src" / "pkg" / "same.txt").write_text("dup\n")
    (ws / "same-too.txt").write_text("dup\n")  # same content: one blob
    (ws / "empty").write_bytes(b"")
    (ws / "big.bin").write_bytes(os.urandom(3 * 2**20 + 17))  # streamed, not read whole
    (ws / "run.sh").write_text("#!/bin/sh\necho run\n")
    os.chmod(ws / "run.sh", 0o755)
    (ws / "secret").write_text("s")
    os.chmod(ws / "secret", 0o600)
    (ws / "readonly.txt").write_text("ro")
    os.chmod(ws / "readonly.txt", 0o444)
    (ws / "shared.txt").write_text("group-writable: beyond the usual umask")
    os.chmod(ws / "shared.txt", 0o664)  # (setgid and setuid are dropped: test_security_hostfs)
    (ws / "empty-dir" / "nested-empty").mkdir(parents=True)
    (ws / "locked").mkdir()
    (ws / "locked" / "inside.txt").write_text("inside")
    os.chmod(ws / "locked", 0o555)
    os.symlink("src/pkg/mod.py", ws / "rel-link")
    os.symlink("/etc/hostname", ws / "abs-link")
    os.symlink("does-not-exist", ws / "dangling")
    os.symlink("src", ws / "dir-link")
    os.mkfifo(ws / "fifo", 0o640)
    (ws / os.fsdecode(b"caf\xc3\xa9-\xff.txt")).write_text("odd name")  # not UTF-8
    os.utime(ws / "src" / "pkg" / "mod.py", ns=(1_000_000_000, 1_234_567_891_000))


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    d = tmp_path / "ws"
    d.mkdir()
    populate(d)
    return d


@pytest.fixture(params=["scan", "shared-watch"])
def store(tmp_path: Path, request) -> FileSnapshotStore:
    """Each test twice: a store on its own, and one with the shared watch's daemon up
    (whose answers must never change what a snapshot finds)."""
    with daemon_stopped_after(tmp_path / "store") as root:
        if request.param == "scan":
            s = FileSnapshotStore(root, shared_watch=False)
        else:
            s = store_with_daemon(root)
        yield s
        s.close()


@pytest.fixture
def no_racy_window(monkeypatch) -> None:
    """Files made by the test a moment ago count as settled (the rule is tested on its own)."""
    monkeypatch.setattr(snapshot_module, "_RACY_NS", 0)


def count_hashing(monkeypatch, store: FileSnapshotStore) -> list[str]:
    hashed: list[str] = []
    real = store._store_file

    def counting(dir_fd: int, name: str):
        hashed.append(name)
        return real(dir_fd, name)

    monkeypatch.setattr(store, "_store_file", counting)
    return hashed


def test_is_a_snapshot_store(store: FileSnapshotStore) -> None:
    assert isinstance(store, FileSnapshotStore)
    protocol: SnapshotStore = store  # statically: satisfies the protocol
    assert callable(protocol.snapshot) and callable(protocol.restore)


def test_restore_into_an_empty_directory_is_exact(
    ws: Path, store: FileSnapshotStore, tmp_path: Path
) -> None:
    want = tree(ws)
    sid = store.snapshot(ws)
    copy = tmp_path / "copy"
    store.restore(sid, copy)
    assert tree(copy) == want
    assert tree(ws) == want  # snapshotting changed nothing


def test_rollback_in_place_undoes_every_kind_of_change(ws: Path, store: FileSnapshotStore) -> None:
    want = tree(ws)
    sid = store.snapshot(ws)
    os.chmod(ws / "locked", 0o755)
    (ws / "locked" / "inside.txt").write_text("changed, longer")
    (ws / "locked" / "added.txt").write_text("new")
    (ws / "src" / "pkg" / "mod.py").write_text("print('HI')\n")  # same size, new content
    (ws / "empty").write_text("not empty any more")
    os.chmod(ws / "run.sh", 0o644)
    os.utime(ws / "secret", ns=(5, 5))
    (ws / "big.bin").unlink()
    os.rmdir(ws / "empty-dir" / "nested-empty")
    (ws / "empty-dir" / "nested-empty").write_text("a file where a directory was")
    os.unlink(ws / "dir-link")
    (ws / "dir-link").mkdir()  # a directory where a symlink was
    os.unlink(ws / "rel-link")
    os.symlink("elsewhere", ws / "rel-link")  # a symlink pointing elsewhere
    (ws / "new-dir" / "deep").mkdir(parents=True)
    (ws / "new-dir" / "deep" / "f").write_text("f")
    os.chmod(ws / "new-dir", 0o500)  # removing it needs write permission: restore gets it
    os.unlink(ws / "fifo")
    assert tree(ws) != want
    store.restore(sid, ws)
    assert tree(ws) == want


def test_restore_does_not_follow_a_planted_symlink(
    ws: Path, store: FileSnapshotStore, tmp_path: Path
) -> None:
    sid = store.snapshot(ws)
    outside = tmp_path / "outside"
    outside.mkdir()
    os.chmod(ws / "locked", 0o755)
    for child in (ws / "src").iterdir():
        if child.is_dir():
            for f in child.iterdir():
                f.unlink()
            child.rmdir()
        else:
            child.unlink()
    (ws / "src").rmdir()
    os.symlink(outside, ws / "src")  # restore will write src/pkg/mod.py: not through this
    store.restore(sid, ws)
    assert list(outside.iterdir()) == []
    assert (ws / "src").is_dir() and not (ws / "src").is_symlink()
    assert (ws / "src" / "pkg" / "mod.py").read_text() == "print('hi')\n"


def test_ids_name_the_content(ws: Path, store: FileSnapshotStore, tmp_path: Path) -> None:
    a = store.snapshot(ws)
    assert store.snapshot(ws) == a and a in store
    other = FileSnapshotStore(tmp_path / "other-store")
    assert other.snapshot(ws) == a  # same tree, same id, whatever the store
    other.close()
    (ws / "empty").write_text("x")
    b = store.snapshot(ws)
    assert b != a
    os.utime(ws / "empty", ns=(1, 1))  # only the mtime: still another state
    assert store.snapshot(ws) not in (a, b)
    (ws / "empty").write_text("")
    os.utime(ws / "empty", ns=(1, 1))
    copy = tmp_path / "copy"
    store.restore(a, copy)
    assert store.snapshot(copy) == a


def stored_blobs(store: FileSnapshotStore) -> dict[str, bytes]:
    """Every blob in the store, loose or packed, by id."""
    blobs = {p.parent.name + p.name: p.read_bytes() for p in (store.root / "objects").glob("*/*")}
    for index in (store.root / "packs").glob("*.idx"):
        pack = index.with_suffix(".pack").read_bytes()
        for blob, (offset, size) in json.loads(index.read_text())["blobs"].items():
            blobs[blob] = pack[offset : offset + size]
    return blobs


def test_identical_content_is_stored_once(ws: Path, store: FileSnapshotStore) -> None:
    store.snapshot(ws)
    blobs = stored_blobs(store)
    regular = [
        p
        for p in ws.rglob("*")
        if p.is_file() and not p.is_symlink() and not stat.S_ISFIFO(p.lstat().st_mode)
    ]
    assert len(blobs) == len(regular) - 1  # same.txt and same-too.txt share one
    for blob, data in blobs.items():  # each blob is named by the hash of its bytes
        assert hashlib.sha256(data).hexdigest() == blob


def test_many_new_small_files_go_into_one_pack(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(snapshot_module, "_PACK_AFTER", 4)
    ws = tmp_path / "many"
    (ws / "d").mkdir(parents=True)
    for i in range(50):
        (ws / "d" / f"f{i}").write_text(f"content {i}\n")
    (ws / "big").write_bytes(b"b" * (snapshot_module._SMALL_FILE + 1))  # large: never packed
    a_store = FileSnapshotStore(tmp_path / "shared")
    a = a_store.snapshot(ws)
    assert len(list((a_store.root / "packs").glob("*.pack"))) == 1
    assert len(list((a_store.root / "objects").glob("*/*"))) == 4 + 1  # the first few, and big
    # Another process (another instance) restores from the pack, and adds its own.
    b_store = FileSnapshotStore(tmp_path / "shared")
    b_store.restore(a, tmp_path / "copy")
    assert tree(tmp_path / "copy") == tree(ws)
    for i in range(50, 100):
        (ws / "d" / f"f{i}").write_text(f"content {i}\n")
    b = b_store.snapshot(ws)
    assert len(list((b_store.root / "packs").glob("*.pack"))) == 2
    # The first instance finds blobs packed by the second, which it has never seen.
    a_store.restore(b, tmp_path / "copy")
    assert tree(tmp_path / "copy") == tree(ws)
    a_store.close()
    b_store.close()


def test_unchanged_files_are_not_read_again(
    ws: Path, store: FileSnapshotStore, monkeypatch, no_racy_window
) -> None:
    store.snapshot(ws)
    monkeypatch.setattr(store._watch, "unchanged", lambda key: False)  # force real scans
    hashed = count_hashing(monkeypatch, store)
    (ws / "src" / "pkg" / "mod.py").write_text("changed\n")
    store.snapshot(ws)
    assert hashed == ["mod.py"]
    # The stat cache is on disk: a new process (a resumed run) does not re-read either.
    hashed.clear()
    fresh = FileSnapshotStore(store.root)
    hashed_fresh = count_hashing(monkeypatch, fresh)
    fresh.snapshot(ws)
    assert hashed_fresh == [] and hashed == []
    fresh.close()


def test_a_same_size_rewrite_keeping_the_mtime_is_noticed(
    ws: Path, store: FileSnapshotStore, monkeypatch, no_racy_window
) -> None:
    monkeypatch.setattr(store._watch, "unchanged", lambda key: False)  # the scan alone must see it
    path = ws / "src" / "pkg" / "mod.py"
    before = path.stat()
    a = store.snapshot(ws)
    path.write_text("print('ho')\n")  # same size
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))  # and the same mtime
    assert path.stat().st_size == before.st_size and path.stat().st_mtime_ns == before.st_mtime_ns
    b = store.snapshot(ws)
    assert b != a  # ctime (which no program can set back) gave it away
    copy = ws.parent / "copy"
    store.restore(b, copy)
    assert (copy / "src" / "pkg" / "mod.py").read_text() == "print('ho')\n"


def test_recently_changed_files_are_not_trusted_to_the_cache(
    ws: Path, store: FileSnapshotStore, monkeypatch
) -> None:
    """The racy-clean rule: a file changed just before a scan is read again next time,
    because an edit within the same clock tick could leave its stat unchanged."""
    monkeypatch.setattr(snapshot_module, "_RACY_NS", 3600 * 10**9)  # everything is "recent"
    monkeypatch.setattr(store._watch, "unchanged", lambda key: False)
    store.snapshot(ws)
    hashed = count_hashing(monkeypatch, store)
    store.snapshot(ws)
    assert len(hashed) == len(
        [
            p
            for p in ws.rglob("*")
            if p.is_file() and not p.is_symlink() and not stat.S_ISFIFO(p.lstat().st_mode)
        ]
    )


def test_change_watch_skips_the_scan_only_when_nothing_changed(
    ws: Path, store: FileSnapshotStore, monkeypatch
) -> None:
    if not TreeWatch().available:
        pytest.skip("no inotify here: every snapshot scans (tested elsewhere)")
    a = store.snapshot(ws)
    scans: list[int] = []
    real_begin = store._watch.begin
    monkeypatch.setattr(store._watch, "begin", lambda key: (scans.append(1), real_begin(key)))
    assert store.snapshot(ws) == a and scans == []  # nothing changed: no scan at all
    changes = [
        lambda: subprocess.run(
            ["sh", "-c", f"echo more >> {ws}/empty"], check=True
        ),  # another process
        lambda: os.chmod(ws / "run.sh", 0o700),  # attributes only
        lambda: (ws / "src" / "pkg" / "new").mkdir(),  # a new directory...
        lambda: (ws / "src" / "pkg" / "new" / "f").write_text("x"),  # ...and a file in it
        lambda: os.utime(ws / "src" / "pkg" / "new" / "f", ns=(7, 7)),
        lambda: os.rename(ws / "src" / "pkg" / "new" / "f", ws / "moved"),
    ]
    seen = {a}
    for i, change in enumerate(changes):
        change()
        sid = store.snapshot(ws)
        assert sid not in seen and len(scans) == i + 1, i
        seen.add(sid)
    assert store.snapshot(ws) in seen and len(scans) == len(changes)


def test_hard_links_out_of_the_workspace_defeat_the_watch_not_the_snapshot(
    ws: Path, store: FileSnapshotStore, tmp_path: Path
) -> None:
    outside = tmp_path / "outside-link"
    os.link(ws / "secret", outside)
    a = store.snapshot(ws)
    with open(outside, "a") as f:  # an edit the workspace's directories never hear about
        f.write("more")
    assert store.snapshot(ws) != a


@pytest.mark.skipif(bool(NO_BWRAP), reason=f"bwrap unavailable: {NO_BWRAP}")
def test_change_watch_sees_writes_made_inside_the_sandbox(
    ws: Path, store: FileSnapshotStore
) -> None:
    from stayer.sandbox.bwrap import BwrapSandbox

    os.chmod(ws / "locked", 0o755)
    a = store.snapshot(ws)
    r = run(BwrapSandbox(ws).exec("echo changed > /app/src/pkg/mod.py"))
    assert r.exit_code == 0
    b = store.snapshot(ws)
    assert b != a
    store.restore(a, ws)
    assert (ws / "src" / "pkg" / "mod.py").read_text() == "print('hi')\n"


def test_without_inotify_the_scan_still_sees_everything(
    ws: Path, tmp_path: Path, monkeypatch
) -> None:
    monkeypatch.setattr("stayer.workspace.watch._libc", lambda: None)
    store = FileSnapshotStore(tmp_path / "plain-store")
    assert not store._watch.available
    a = store.snapshot(ws)
    assert store.snapshot(ws) == a
    (ws / "empty").write_text("x")
    assert store.snapshot(ws) != a


def test_random_histories_roll_back_exactly(tmp_path: Path, store: FileSnapshotStore) -> None:
    """Many random edit sequences: every snapshot taken along the way restores exactly."""
    rnd = random.Random(20240601)
    ws = tmp_path / "random-ws"
    ws.mkdir()
    taken: list[tuple[str, dict]] = []
    for _step in range(25):
        for _ in range(rnd.randint(1, 6)):
            _random_edit(ws, rnd)
        taken.append((store.snapshot(ws), tree(ws)))
    for sid, want in rnd.sample(taken, len(taken)):
        store.restore(sid, ws)
        assert tree(ws) == want
        assert store.snapshot(ws) == sid


def _random_edit(ws: Path, rnd: random.Random) -> None:
    names = ["a", "b", "c", "d/e", "d/f", "g/h/i", "g/j"]
    target = ws / rnd.choice(names)
    op = rnd.choice(["write", "write", "append", "delete", "mkdir", "symlink", "chmod", "touch"])
    if target.is_symlink() or target.is_file():
        if op == "delete":
            target.unlink()
            return
    elif target.is_dir() and op in ("delete", "write", "symlink"):
        subprocess.run(["rm", "-rf", str(target)], check=True)
    target.parent.mkdir(parents=True, exist_ok=True)
    if op == "write" and not target.exists():
        target.write_bytes(rnd.randbytes(rnd.choice([0, 10, 5000, 1 << 20 | 3])))
    elif op == "append" and target.is_file() and not target.is_symlink():
        with open(target, "ab") as f:
            f.write(rnd.randbytes(20))
    elif op == "mkdir" and not target.exists() and not target.is_symlink():
        target.mkdir()
    elif op == "symlink" and not target.exists() and not target.is_symlink():
        os.symlink(rnd.choice(["a", "../x", "/nowhere"]), target)
    elif op == "chmod" and target.exists() and not target.is_symlink():
        os.chmod(target, rnd.choice([0o644, 0o600, 0o755, 0o700]))
    elif op == "touch" and target.is_file() and not target.is_symlink():
        os.utime(target, ns=(rnd.randint(1, 10**18), rnd.randint(1, 10**18)))


def test_misuse_is_refused(ws: Path, store: FileSnapshotStore, tmp_path: Path) -> None:
    with pytest.raises(SnapshotNotFound):
        store.restore("0" * 64, ws)
    with pytest.raises(SnapshotNotFound):
        store.restore("../../etc/passwd", ws)
    with pytest.raises(NotADirectoryError):
        store.snapshot(tmp_path / "missing")
    inside = FileSnapshotStore(ws / ".snapshots")
    with pytest.raises(ValueError, match="inside the workspace"):
        inside.snapshot(ws)
    inside.close()


def test_durable_snapshots_are_flushed(ws: Path, tmp_path: Path, monkeypatch) -> None:
    synced: list[str] = []
    monkeypatch.setattr(snapshot_module, "_fsync_paths", lambda paths: synced.extend(paths) or True)
    monkeypatch.setattr(snapshot_module, "_syncfs", lambda path: synced.append(f"syncfs {path}"))
    store = FileSnapshotStore(tmp_path / "durable", durable=True)
    monkeypatch.setattr(snapshot_module, "_FSYNC_AT_MOST", 3)
    store.snapshot(ws)  # many new files: one syncfs
    assert synced == [f"syncfs {store.root}"]
    synced.clear()
    (ws / "empty").write_text("one new blob")
    sid = store.snapshot(ws)
    blob = hashlib.sha256(b"one new blob").hexdigest()
    loose = store._blobs.loose_path(blob)
    assert synced[:2] == [loose, str(store._manifest_path(sid))]
    assert os.path.dirname(loose) in synced  # and the directory naming it
    synced.clear()
    store.snapshot(ws)
    assert synced == []  # nothing new: nothing to flush
    store.close()

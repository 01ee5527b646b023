"""The shared watch (``stayer.workspace.watchd``): a snapshot taken by a new process of an
unchanged workspace skips the scan, and no write is ever missed — made by a sandboxed
command, by another process, between the daemon's start and the check, during the
hand-over, after the daemon died or was stopped, or by a restore."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from sandbox_helpers import NO_BWRAP, run
from snapshot_helpers import daemon_pid, daemon_stopped_after, store_with_daemon

import stayer.workspace.snapshot as snapshot_module
from stayer.workspace import watchd
from stayer.workspace.snapshot import FileSnapshotStore
from stayer.workspace.watch import TreeWatch

pytestmark = pytest.mark.skipif(
    not (TreeWatch().available and watchd.SharedWatch.supported()), reason="no inotify here"
)
ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(autouse=True)
def no_racy_window(monkeypatch) -> None:
    """Files made by the test a moment ago count as settled (the rule is tested elsewhere)."""
    monkeypatch.setattr(snapshot_module, "_RACY_NS", 0)


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    d = tmp_path / "ws"
    (d / "src" / "pkg").mkdir(parents=True)
    (d / "src" / "pkg" / "mod.py").write_text("print('hi')\n")
    (d / "notes.txt").write_text("notes\n")
    (d / "deep" / "er" / "still").mkdir(parents=True)
    (d / "deep" / "er" / "still" / "f").write_text("deep\n")
    os.symlink("src", d / "dir-link")
    os.mkfifo(d / "fifo")
    return d


@pytest.fixture
def root(tmp_path: Path):
    """A store directory whose daemon is stopped when the test ends."""
    with daemon_stopped_after(tmp_path / "store") as r:
        yield r


def handed_over(store: FileSnapshotStore, ws: Path) -> tuple[str | None, str | None]:
    """What the last scan left on disk for the next process: (id, token or None)."""
    fresh = FileSnapshotStore(store.root, shared_watch=False)
    held = fresh._held(ws.resolve(), snapshot_module._WorkspaceState())
    fresh.close()
    return held


def fresh_snapshot(root: Path, ws: Path, monkeypatch, *, may_scan: bool) -> str:
    """A snapshot by a new store on ``root`` (a new process but for the interpreter)."""
    store = FileSnapshotStore(root, shared_watch=True)
    if not may_scan:

        def no_scan(*_a):
            raise AssertionError("scanned although the daemon vouched for the tree")

        monkeypatch.setattr(store, "_load_cache", no_scan)
        monkeypatch.setattr(store._watch, "begin", no_scan)
    try:
        return store.snapshot(ws)
    finally:
        store.close()
        monkeypatch.undo() if not may_scan else None


def scan_only(root: Path, ws: Path) -> str:
    """The id a plain stat scan (no watch of any kind) gives for the tree as it is now."""
    store = FileSnapshotStore(root, shared_watch=False)
    try:
        return store.snapshot(ws)
    finally:
        store.close()


def new_process_snapshot(root: Path, ws: Path) -> str:
    code = (
        "import sys; from pathlib import Path;"
        "from stayer.workspace.snapshot import FileSnapshotStore as S;"
        "print(S(sys.argv[1], shared_watch=True).snapshot(Path(sys.argv[2])))"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run(
        [sys.executable, "-c", code, str(root), str(ws)], check=True, capture_output=True, env=env
    )
    return out.stdout.decode().strip()


def test_a_new_process_finds_an_unchanged_tree_without_scanning(
    ws: Path, root: Path, monkeypatch
) -> None:
    store = store_with_daemon(root)
    a = store.snapshot(ws)
    assert handed_over(store, ws)[0] == a and handed_over(store, ws)[1] is not None
    assert fresh_snapshot(root, ws, monkeypatch, may_scan=False) == a
    assert new_process_snapshot(root, ws) == a  # a real one: same answer
    assert store.snapshot(ws) == a
    store.close()


def test_the_first_store_hands_over_once_its_daemon_is_up(ws: Path, root: Path) -> None:
    store = FileSnapshotStore(root, shared_watch=True)
    a = store.snapshot(ws)  # starts the daemon; may be done before it answers
    deadline = time.monotonic() + 30
    while handed_over(store, ws)[1] is None:  # the next scans try again
        assert time.monotonic() < deadline
        time.sleep(0.05)
        (ws / "notes.txt").write_text(f"{time.monotonic()}\n")
        a = store.snapshot(ws)
    assert handed_over(store, ws)[0] == a == scan_only(root, ws)
    store.close()


@pytest.mark.parametrize(
    "change",
    [
        "echo more >> notes.txt",  # content
        "printf 'print(\"ho\")\\n' > src/pkg/mod.py && touch -r notes.txt src/pkg/mod.py",
        "chmod 700 src/pkg/mod.py",  # attributes only
        "mkdir src/new && echo x > src/new/f",  # a new directory and a file in it
        "echo y > deep/er/still/g",  # deep down
        "mv deep/er/still/f src/moved",
        "rm -r deep",
        "ln -sfn deep dir-link",  # a link retargeted
        "touch -d 2001-01-01 notes.txt",
    ],
)
def test_a_change_by_another_process_is_always_seen(
    ws: Path, root: Path, monkeypatch, change: str
) -> None:
    store = store_with_daemon(root)
    a = store.snapshot(ws)
    assert handed_over(store, ws)[1] is not None
    subprocess.run(["sh", "-c", change], cwd=ws, check=True)
    b = fresh_snapshot(root, ws, monkeypatch, may_scan=True)
    assert b != a and b == scan_only(root, ws)
    assert new_process_snapshot(root, ws) == b
    store.close()


@pytest.mark.skipif(bool(NO_BWRAP), reason=f"bwrap unavailable: {NO_BWRAP}")
def test_a_change_by_a_sandboxed_command_is_seen_by_a_new_process(
    ws: Path, root: Path, monkeypatch
) -> None:
    from stayer.sandbox.bwrap import BwrapSandbox

    os.unlink(ws / "fifo")
    store = store_with_daemon(root)
    a = store.snapshot(ws)
    assert handed_over(store, ws)[1] is not None
    r = run(BwrapSandbox(ws).exec("echo changed > /app/deep/er/still/f"))
    assert r.exit_code == 0
    b = new_process_snapshot(root, ws)
    assert b != a and b == scan_only(root, ws)
    store.close()


def test_a_write_during_the_hand_over_is_never_covered_by_the_token(
    ws: Path, root: Path, monkeypatch
) -> None:
    """Writes after the scan listed a directory but before the daemon answered: the
    process's own watch saw them, so the token is not kept."""
    store = store_with_daemon(root)
    assert store._shared is not None
    real_token = store._shared.token

    def write_then_token():
        (ws / "deep" / "er" / "still" / "f").write_text("late\n")  # same size, same dir
        return real_token()

    monkeypatch.setattr(store._shared, "token", write_then_token)
    a = store.snapshot(ws)
    assert handed_over(store, ws) == (a, None)
    monkeypatch.undo()
    b = fresh_snapshot(root, ws, monkeypatch, may_scan=True)
    assert b != a and b == scan_only(root, ws)
    store.close()


def test_the_daemon_counts_every_write_made_before_the_check(ws: Path, root: Path) -> None:
    """The protocol itself: a token is good until the first event after the daemon's walk,
    whoever writes, and a new one is issued only after a new walk."""
    store = store_with_daemon(root)
    client = watchd.SharedWatch(str(root / "watch"))
    key = str(ws.resolve())
    assert client.begin(key)
    token = client.token()
    assert token is not None and client.check(key, token)
    assert client.begin(key) and client.token() == token  # unchanged: the same token
    for i, write in enumerate(
        [
            lambda: (ws / "deep" / "er" / "still" / "f").write_text("x"),
            lambda: os.utime(ws / "notes.txt", ns=(5, 5)),
            lambda: subprocess.run(["sh", "-c", f"echo >> {ws}/src/pkg/mod.py"], check=True),
            lambda: (ws / "deep" / "er" / "still" / "new").mkdir(),
            lambda: (ws / "deep" / "er" / "still" / "new" / "g").write_text("y"),
        ]
    ):
        write()
        assert not client.check(key, token), i  # at once: no settling time
        assert client.begin(key)
        new = client.token()
        assert new is not None and new != token and client.check(key, new), i
        token = new
    assert not client.check(key, "0" * 32) and not client.check(str(ws.parent), token)
    client.close()
    store.close()


def test_a_daemon_that_died_vouches_for_nothing(ws: Path, root: Path, monkeypatch) -> None:
    store = store_with_daemon(root)
    a = store.snapshot(ws)
    pid = daemon_pid(root)
    assert pid is not None and handed_over(store, ws)[1] is not None
    os.kill(pid, signal.SIGKILL)
    (ws / "notes.txt").write_text("NOTES\n")  # same size: only a re-read tells
    os.utime(ws / "notes.txt", ns=(1, os.stat(ws / "src").st_mtime_ns))
    b = new_process_snapshot(root, ws)  # (and a new daemon, which knows no token)
    assert b != a and b == scan_only(root, ws)
    store.close()
    # A new daemon's tokens work again; the dead one's are not honoured by it.
    store = store_with_daemon(root)
    c = store.snapshot(ws)
    assert c == b and fresh_snapshot(root, ws, monkeypatch, may_scan=False) == b
    store.close()


def test_a_daemon_that_does_not_answer_counts_as_changed(ws: Path, root: Path, monkeypatch) -> None:
    store = store_with_daemon(root)
    a = store.snapshot(ws)
    pid = daemon_pid(root)
    assert pid is not None
    monkeypatch.setattr(watchd, "REPLY_TIMEOUT_S", 0.2)
    os.kill(pid, signal.SIGSTOP)
    try:
        (ws / "notes.txt").write_text("other\n")
        b = fresh_snapshot(root, ws, monkeypatch, may_scan=True)
        assert b != a and b == scan_only(root, ws)
    finally:
        os.kill(pid, signal.SIGCONT)
    # Woken up, it has the write in its queue: the old token is stale.
    assert store._shared is not None
    assert not watchd.SharedWatch(str(root / "watch")).check(str(ws), "0" * 32)
    store.close()


def test_a_restore_withdraws_the_hand_over(ws: Path, root: Path, monkeypatch) -> None:
    store = store_with_daemon(root)
    a = store.snapshot(ws)
    (ws / "notes.txt").write_text("changed\n")
    b = store.snapshot(ws)
    assert handed_over(store, ws)[0] == b
    store.restore(a, ws)
    assert handed_over(store, ws) == (None, None)
    assert fresh_snapshot(root, ws, monkeypatch, may_scan=True) == a
    store.close()


def test_a_replaced_workspace_root_is_seen(ws: Path, root: Path, monkeypatch) -> None:
    store = store_with_daemon(root)
    a = store.snapshot(ws)
    subprocess.run(["cp", "-a", str(ws), str(ws) + ".copy"], check=True)
    (Path(str(ws) + ".copy") / "notes.txt").write_text("NOTES\n")
    os.rename(ws, str(ws) + ".old")
    os.rename(str(ws) + ".copy", ws)
    b = fresh_snapshot(root, ws, monkeypatch, may_scan=True)
    assert b != a and b == scan_only(root, ws)
    store.close()


def test_hard_linked_files_are_never_handed_over(
    ws: Path, root: Path, tmp_path: Path, monkeypatch
) -> None:
    os.link(ws / "notes.txt", tmp_path / "outside-link")
    store = store_with_daemon(root)
    a = store.snapshot(ws)
    assert handed_over(store, ws) == (a, None)
    with open(tmp_path / "outside-link", "a") as f:  # no event in the workspace's dirs
        f.write("more")
    b = fresh_snapshot(root, ws, monkeypatch, may_scan=True)
    assert b != a
    store.close()


def test_the_daemon_follows_no_link_and_opens_no_special_file(
    ws: Path, root: Path, tmp_path: Path, monkeypatch
) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    os.symlink(outside, ws / "out-link")
    store = store_with_daemon(root)
    a = store.snapshot(ws)  # (the FIFO would block an open: the daemon's walk went on)
    assert handed_over(store, ws)[1] is not None
    (outside / "f").write_text("not the workspace's\n")  # not watched: link not followed
    assert fresh_snapshot(root, ws, monkeypatch, may_scan=False) == a
    store.close()


def test_only_the_owner_may_talk_to_the_daemon(root: Path, ws: Path) -> None:
    store = store_with_daemon(root)
    sock = root / "watch" / "watchd.sock"
    assert os.stat(sock).st_mode & 0o077 == 0  # bound under umask 077
    assert os.stat(root / "watch" / "watchd.lock").st_mode & 0o077 == 0
    store.close()


@pytest.mark.skipif(bool(NO_BWRAP), reason=f"bwrap unavailable: {NO_BWRAP}")
def test_a_sandboxed_process_that_reaches_the_socket_is_not_served(ws: Path, root: Path) -> None:
    """Even with the store's socket mounted into the sandbox, a command there (its own user
    namespace) gets no answer: it can neither learn a token nor make the daemon walk."""
    from stayer.sandbox.base import Mount
    from stayer.sandbox.bwrap import BwrapSandbox

    os.unlink(ws / "fifo")
    store = store_with_daemon(root)
    store.snapshot(ws)
    probe = (
        "import socket; s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET);"
        "s.connect('/watch/watchd.sock'); print('connected');"
        "exec('try: s.sendall(b\\'B12345678/app\\'); print(\\'answer\\', s.recv(4096))\\n"
        "except OSError as e: print(\\'answer\\', e.errno)')"
    )
    r = run(
        BwrapSandbox(ws).exec(
            f'python3 -c "{probe}"', mounts=(Mount(str(root / "watch"), "/watch", False),)
        )
    )
    # It connected, and was hung up on: no answer (end of stream, EPIPE or ECONNRESET)
    assert r.stdout.split() in (["connected", "answer", x] for x in ("b''", "32", "104")), (
        r.stdout,
        r.stderr,
    )
    store.close()


def test_restoring_the_tree_it_already_is_does_nothing_and_anything_else_restores(
    ws: Path, root: Path, monkeypatch
) -> None:
    """A resumed run restores its last snapshot: free when the daemon vouches that the
    workspace is that tree, a real restore after any change."""
    store = store_with_daemon(root)
    a = store.snapshot(ws)

    def resume() -> FileSnapshotStore:
        return FileSnapshotStore(root, shared_watch=True)

    fresh = resume()
    monkeypatch.setattr(snapshot_module, "iter_tree", lambda *_a: 1 / 0)  # no walk
    fresh.restore(a, ws)
    assert fresh.snapshot(ws) == a
    fresh.close()
    monkeypatch.undo()
    for change in (
        lambda: (ws / "notes.txt").write_text("NOTES\n"),  # same size
        lambda: os.chmod(ws / "src", 0o700),
        lambda: (ws / "src" / "new").write_text("new"),
    ):
        change()
        fresh = resume()
        fresh.restore(a, ws)
        assert (ws / "notes.txt").read_text() == "notes\n" and not (ws / "src" / "new").exists()
        assert fresh.snapshot(ws) == a == scan_only(root, ws)
        fresh.close()
    store.close()


def test_a_file_system_mounted_inside_is_watched_at_its_root(
    ws: Path, root: Path, monkeypatch
) -> None:
    """A mount point inside the workspace is not walked into (its root's mode is all a
    snapshot keeps of it), but the daemon watches that root: a chmod there is seen."""
    mnt = ws / "mnt"
    mnt.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "none", str(mnt)], capture_output=True).returncode:
        pytest.skip("cannot mount here (needs root)")
    try:
        (mnt / "inside").write_text("not snapshotted")
        store = store_with_daemon(root)
        a = store.snapshot(ws)
        assert handed_over(store, ws)[1] is not None
        os.chmod(mnt, 0o700)
        b = fresh_snapshot(root, ws, monkeypatch, may_scan=True)
        assert b != a and b == scan_only(root, ws)
        assert store.snapshot(ws) == b  # the process's own watch saw it too
        store.close()
    finally:
        subprocess.run(["umount", str(mnt)], check=True)

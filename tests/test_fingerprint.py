"""The workspace fingerprint (the no-progress breaker's probe): incremental, never wrong.

Every mutation below must change the fingerprint, and the incremental answer must equal a
fresh full read of the same tree; an edit in one directory must re-read only that one."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from stayer.guard.breakers import TreeFingerprint
from stayer.workspace.watch import TreeWatch


def tree(root: Path, dirs: int = 5, files: int = 4) -> Path:
    for d in range(dirs):
        (root / f"d{d}" / "deep").mkdir(parents=True)
        for i in range(files):
            (root / f"d{d}" / f"f{i}.txt").write_text(f"{d}/{i}\n")
        (root / f"d{d}" / "deep" / "leaf.txt").write_text("leaf\n")
    return root


def mutate_in_a_shell(root: Path, script: str) -> None:
    """From another process, as the agent's commands do."""
    subprocess.run(["sh", "-c", script], cwd=root, check=True)


MUTATIONS = [
    "echo more >> d0/f0.txt",
    "echo new > d1/new.txt",
    "rm d2/f1.txt",
    "mkdir -p d3/x/y && echo deep > d3/x/y/z.txt",
    "rm -r d4/deep",
    "mv d0/deep d1/moved",
    "echo edited-after-move >> d1/moved/leaf.txt",
    "rm -r d2 && mkdir d2 && echo replaced > d2/f0.txt",
    "echo replaced-again >> d2/f0.txt",
    "mv d3 d9 && echo after >> d9/x/y/z.txt",
    "chmod 600 d1/f2.txt && touch -d '2001-01-01' d1/f2.txt",
    "ln -s d1 link-to-d1",
    "mkdir empty",
]


def test_every_change_is_seen_and_matches_a_full_read(tmp_path):
    root = tree(tmp_path / "ws")
    fp = TreeFingerprint(root)
    last = fp.fingerprint()
    assert last == TreeFingerprint(root).fingerprint()
    for script in MUTATIONS:
        mutate_in_a_shell(root, script)
        now = fp.fingerprint()
        assert now != last, script
        assert now == TreeFingerprint(root).fingerprint(), script
        assert fp.fingerprint() == now  # nothing changed since
        last = now


def test_the_harness_directory_is_not_the_agents_work(tmp_path):
    root = tree(tmp_path / "ws")
    fp = TreeFingerprint(root)
    before = fp.fingerprint()
    mutate_in_a_shell(root, "mkdir -p .stayer/archive && echo notes > .stayer/archive/a.txt")
    assert fp.fingerprint() == before
    mutate_in_a_shell(root, "echo work >> d0/f0.txt")
    assert fp.fingerprint() != before


@pytest.mark.skipif(not TreeWatch().available, reason="no inotify here")
def test_an_edit_rereads_only_its_directory(tmp_path, monkeypatch):
    root = tree(tmp_path / "ws", dirs=20)
    fp = TreeFingerprint(root)
    fp.fingerprint()
    read: list[str] = []
    scandir = os.scandir
    monkeypatch.setattr(os, "scandir", lambda p=".": read.append(os.fspath(p)) or scandir(p))
    mutate_in_a_shell(root, "echo more >> d7/f0.txt")
    fp.fingerprint()
    assert read == [str(root / "d7")]
    read.clear()
    fp.fingerprint()
    assert read == []


def test_without_a_watch_every_call_reads_the_tree(tmp_path):
    root = tree(tmp_path / "ws")
    fp = TreeFingerprint(root)
    fp._watch.close()  # as on a system without inotify
    before = fp.fingerprint()
    mutate_in_a_shell(root, "echo more >> d0/deep/leaf.txt")
    now = fp.fingerprint()
    assert now != before and now == TreeFingerprint(root).fingerprint()


def test_hard_linked_files_are_always_read_again(tmp_path):
    """An edit through a link outside the workspace raises no event inside it."""
    root = tree(tmp_path / "ws")
    outside = tmp_path / "outside.txt"
    os.link(root / "d0" / "f0.txt", outside)
    fp = TreeFingerprint(root)
    before = fp.fingerprint()
    with outside.open("a") as f:
        f.write("edited elsewhere\n")
    assert fp.fingerprint() != before


def test_the_workspace_removed_and_made_again(tmp_path):
    root = tree(tmp_path / "ws")
    fp = TreeFingerprint(root)
    fp.fingerprint()
    shutil.rmtree(root)
    tree(root, dirs=2)
    (root / "d0" / "f0.txt").write_text("different\n")
    assert fp.fingerprint() == TreeFingerprint(root).fingerprint()


def test_names_that_are_not_utf8_are_fingerprinted(tmp_path):
    root = tree(tmp_path / "ws")
    fp = TreeFingerprint(root)
    before = fp.fingerprint()
    name = os.fsencode(root / "d0") + b"/caf\xe9.txt"
    with open(name, "wb") as f:
        f.write(b"x\n")
    now = fp.fingerprint()
    assert now != before and now == TreeFingerprint(root).fingerprint()

"""The sandbox's /etc is a copy of what in the host's /etc others may read
(stayer.sandbox.etc_copy): what the host writes there afterwards, secrets above all, never
reaches a command that is running, and reaches the next one only as a stand-in.

The attack the copy answers: with the host's /etc bound live and each secret covered, a
secret the host replaces by rename (useradd rewriting /etc/shadow) loses its cover in
every mount namespace, and a running command reads the new one.
"""

from __future__ import annotations

import asyncio
import os
import socket
import stat
from pathlib import Path

import pytest
from sandbox_helpers import needs_bwrap

from stayer.sandbox import bwrap, etc_copy
from stayer.sandbox.bwrap import BwrapSandbox
from stayer.sandbox.etc_copy import EtcCopies, copy_public
from stayer.workspace import watch


def _host_etc(root: Path) -> Path:
    """A small /etc: public files and directories, a link, a secret file and directory, a
    FIFO and a socket."""
    etc = root / "etc"
    (etc / "ssl" / "certs").mkdir(parents=True)
    (etc / "ssl" / "certs" / "ca.pem").write_text("CA")
    (etc / "hosts").write_text("127.0.0.1 localhost\n")
    (etc / "shadow").write_text("root:SECRET-HASH\n")
    (etc / "ssl" / "private").mkdir()
    (etc / "ssl" / "private" / "key.pem").write_text("SECRET-KEY")
    os.chmod(etc / "ssl" / "private", 0o700)
    os.chmod(etc / "shadow", 0o640)
    os.chmod(etc / "hosts", 0o644)
    os.symlink("../run/resolv.conf", etc / "resolv.conf")
    os.mkfifo(etc / "initctl")
    with socket.socket(socket.AF_UNIX) as s:
        s.bind(str(etc / "daemon.sock"))
    return etc


def test_the_copy_holds_what_others_may_read_and_stand_ins_for_the_rest(tmp_path: Path) -> None:
    etc = _host_etc(tmp_path)
    copy = tmp_path / "copy"
    copy.mkdir()
    copy_public(str(etc), str(copy))  # a FIFO with no writer is never opened: it returns

    assert (copy / "hosts").read_text() == "127.0.0.1 localhost\n"
    assert stat.S_IMODE((copy / "hosts").stat().st_mode) == 0o644
    assert (copy / "ssl" / "certs" / "ca.pem").read_text() == "CA"
    assert os.readlink(copy / "resolv.conf") == "../run/resolv.conf"
    # secrets: the same names, empty, that nobody may read or list
    assert (copy / "shadow").stat().st_size == 0
    assert stat.S_IMODE((copy / "shadow").stat().st_mode) == 0
    assert list((copy / "ssl" / "private").iterdir()) == []
    assert stat.S_IMODE((copy / "ssl" / "private").stat().st_mode) == 0o755
    # special files are left out
    assert not (copy / "initctl").exists() and not (copy / "daemon.sock").exists()
    assert sorted(p.name for p in copy.iterdir()) == ["hosts", "resolv.conf", "shadow", "ssl"]


def _box(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, etc: Path) -> BwrapSandbox:
    """A sandbox whose host /etc is ``etc`` (its copies kept under tmp_path)."""
    copies = EtcCopies(str(etc), home=tmp_path / "copies")
    monkeypatch.setattr(bwrap, "_ETC_COPIES", copies)
    ws = tmp_path / "ws"
    ws.mkdir()
    return BwrapSandbox(ws)


def _replace(path: Path, text: str, mode: int) -> None:
    """As useradd and passwd write /etc/shadow: a new file renamed over the old one."""
    new = path.with_name(path.name + "+")
    new.write_text(text)
    os.chmod(new, mode)
    os.replace(new, path)


@needs_bwrap
def test_a_secret_the_host_replaces_or_writes_during_a_command_stays_out_of_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The command reads, tells the host it did, and waits; the host replaces the secret
    by rename and writes a new one; the command reads again. No secret in either read."""
    etc = _host_etc(tmp_path)
    box = _box(tmp_path, monkeypatch, etc)
    ws = box.workspace
    command = (
        "cat /etc/shadow /etc/ssl/private/key.pem; echo read > /app/ready; "
        "while [ ! -e /app/go ]; do sleep 0.05; done; "
        "cat /etc/shadow /etc/docker-key.json /etc/ssl/private/key.pem; cat /etc/hosts"
    )

    async def host() -> None:
        while not (ws / "ready").exists():
            await asyncio.sleep(0.05)
        _replace(etc / "shadow", "root:NEW-SECRET-HASH\n", 0o640)
        (etc / "docker-key.json").write_text("NEW-SECRET-KEY")
        os.chmod(etc / "docker-key.json", 0o600)
        _replace(etc / "ssl" / "private" / "key.pem", "NEW-SECRET-KEY", 0o600)
        (etc / "hosts").write_text("10.0.0.9 changed\n")
        (ws / "go").write_text("")

    async def both() -> str:
        result, _ = await asyncio.gather(box.exec(command, timeout=600), host())
        return result.stdout + result.stderr

    out = asyncio.run(both())
    assert "SECRET" not in out, out
    assert "127.0.0.1 localhost" in out  # the running command keeps the /etc it started with

    # The next command gets a new copy: the new secret as a stand-in, the new public file.
    r = asyncio.run(box.exec("cat /etc/shadow /etc/docker-key.json; cat /etc/hosts", timeout=600))
    assert "SECRET" not in r.stdout + r.stderr, r
    assert r.stdout == "10.0.0.9 changed\n", r
    assert "Permission denied" in r.stderr


@pytest.mark.parametrize("inotify", [True, False], ids=["watched", "no-inotify"])
def test_a_new_copy_is_made_when_etc_changed_and_old_ones_go_when_unused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, inotify: bool
) -> None:
    if not inotify:
        monkeypatch.setattr(watch, "_libc", lambda: None)
    etc = _host_etc(tmp_path)
    home = tmp_path / "copies"
    copies = EtcCopies(str(etc), home=home)
    with copies.current() as first:
        with copies.current() as again:
            assert again == first  # nothing changed: the same copy
        os.chmod(etc / "hosts", 0o600)  # made secret in place: no new entry, a new mode
        with copies.current() as second:
            assert second != first
            assert (Path(second) / "hosts").stat().st_size == 0
            assert (Path(first) / "hosts").read_text().startswith("127.0.0.1")  # still in use
        assert Path(first).is_dir() and Path(second).is_dir()
    with copies.current() as third:
        assert third == second
    assert not Path(first).exists()  # unused and not the newest: removed
    copies.close()
    assert list(home.iterdir()) == []


def test_copies_of_a_process_that_died_are_removed(tmp_path: Path) -> None:
    etc = _host_etc(tmp_path)
    home = tmp_path / "copies"
    home.mkdir()
    gone = os.fork()
    if gone == 0:
        os._exit(0)
    os.waitpid(gone, 0)  # a process that no longer exists
    (home / f"{gone}-dead").mkdir()
    (home / f"{os.getppid()}-alive").mkdir()  # a live process's copy stays
    copies = EtcCopies(str(etc), home=home)
    with copies.current():
        names = sorted(p.name for p in home.iterdir())
    assert f"{gone}-dead" not in names and f"{os.getppid()}-alive" in names
    copies.close()


def test_the_copies_are_kept_from_other_users_in_a_directory_of_their_own(tmp_path: Path) -> None:
    """/tmp/stayer-etc-<uid>, 0700; one that is not this user's private directory (a link,
    another's, open to others) is not used: a fresh private one is."""
    home = etc_copy.copies_home(str(tmp_path))
    assert home == tmp_path / f"stayer-etc-{os.getuid()}"
    assert stat.S_IMODE(home.stat().st_mode) == 0o700
    assert etc_copy.copies_home(str(tmp_path)) == home
    os.chmod(home, 0o777)
    elsewhere = etc_copy.copies_home(str(tmp_path))
    assert elsewhere != home and stat.S_IMODE(elsewhere.stat().st_mode) == 0o700
    home.rmdir()
    home.symlink_to(elsewhere)
    third = etc_copy.copies_home(str(tmp_path))
    assert third not in (home, elsewhere) and not third.is_symlink()


@needs_bwrap
def test_a_process_removes_its_copies_when_it_exits(tmp_path: Path) -> None:
    """``stayer sandbox exec`` makes a copy of /etc for its command and removes it as it
    exits (its copies are named by its pid, in the user's directory of copies)."""
    import subprocess
    import sys

    home = etc_copy.copies_home()
    ws = tmp_path / "ws"
    ws.mkdir()
    proc = subprocess.Popen(
        [sys.executable, "-m", "stayer.cli", "sandbox", "exec", "--workspace", str(ws)]
        + ["--", "sh", "-c", "ls /etc/hosts > /app/seen"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    out, err = proc.communicate(timeout=600)
    assert proc.returncode == 0, (out, err)
    assert (ws / "seen").read_text() == "/etc/hosts\n"
    assert not [p for p in home.iterdir() if p.name.startswith(f"{proc.pid}-")]


def test_copies_go_to_tmp_when_dev_shm_is_full(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import errno

    full = tmp_path / "shm" / "stayer-etc"
    real = etc_copy.copy_public

    def copy(source: str, dest: str, watching: object) -> None:
        if dest.startswith(str(full)):
            raise OSError(errno.ENOSPC, "No space left on device")
        real(source, dest, watching)  # type: ignore[arg-type]

    monkeypatch.setattr(etc_copy, "copy_public", copy)
    copies = EtcCopies(str(_host_etc(tmp_path)), home=full)
    with copies.current() as path:
        assert Path(path).parent == etc_copy.copies_home("/tmp")
        assert (Path(path) / "hosts").read_text().startswith("127.0.0.1")
    assert list(full.iterdir()) == []  # the failed copy is not left behind
    copies.close()
    assert not Path(path).exists()

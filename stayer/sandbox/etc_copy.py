"""The sandbox's ``/etc``: a copy of what in the host's ``/etc`` other users may read.

A copy holds whatever the host does next (covers over the live ``/etc`` did not: a
secret replaced by rename, or written during a command, showed through). Secrets keep
their names as empty stand-ins nobody may read; special files are left out; links stay
links. Each command takes the newest copy as it starts (:meth:`EtcCopies.current`); a new
one is made first when ``/etc`` changed (inotify, :class:`~stayer.workspace.watch.
TreeWatch`, else a walk comparing every entry's status). A copy in use is never changed;
older ones go when their last command ends, a process's all at its exit, a dead
process's at the next one's start. They live in ``/dev/shm/stayer-etc-<uid>/`` (else
``/tmp``), in a directory only the caller may enter, a path that says nothing of the
user or the task (it shows in the sandbox's mountinfo). docs/sandbox.md has the story.
"""

from __future__ import annotations

import atexit
import contextlib
import errno
import os
import shutil
import stat
import tempfile
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from stayer.workspace.watch import OwnWatch, TreeWatch

# What says an entry changed: kind and mode, owner, identity, size and times (the change
# time moves with a chmod, chown, rename or write).
_Status = tuple[str, int, int, int, int, int, int]


def kept_from_others(mode: int) -> bool:
    """Whether other users may not read an entry of ``mode``: a directory they cannot list
    and enter, or a regular file they cannot read (links and special files never are)."""
    if stat.S_ISDIR(mode):
        return mode & 0o005 != 0o005
    return stat.S_ISREG(mode) and not mode & stat.S_IROTH


def copies_home(tmp: str | None = None) -> Path:
    """The directory of this user's copies in ``tmp`` (see the module docstring), made if
    need be. By default in ``/dev/shm``, a file system in memory, where a copy of /etc is
    made in about half the time it takes on the disk (creating its links and files is
    most of it), else in ``/tmp``."""
    if tmp is None:
        tmp = "/dev/shm" if os.access("/dev/shm", os.W_OK | os.X_OK) else "/tmp"
    path = os.path.join(tmp, f"stayer-etc-{os.getuid()}")
    with contextlib.suppress(FileExistsError):
        os.mkdir(path, 0o700)
    st = os.lstat(path)
    if stat.S_ISDIR(st.st_mode) and st.st_uid == os.getuid() and not st.st_mode & 0o077:
        return Path(path)
    return Path(tempfile.mkdtemp(prefix="stayer-etc-", dir=tmp))  # planted by someone else


@dataclass
class _Copy:
    path: str
    users: int = 0


class EtcCopies:
    """Copies of one ``/etc`` for the sandboxes of this process (see the module docstring)."""

    def __init__(self, source: str = "/etc", home: Path | None = None) -> None:
        self.source = source
        self._home = home
        self._lock = threading.Lock()
        self._own = OwnWatch()
        self._copies: list[_Copy] = []  # oldest first; the last is the newest
        self._status: list[_Status] | None = None  # of the newest, where inotify cannot vouch
        atexit.register(self.close)

    @contextlib.contextmanager
    def current(self) -> Iterator[str]:
        """The path of a copy of ``/etc`` as it is now, kept unchanged until the block ends."""
        with self._lock:
            copy = self._newest()
            copy.users += 1
        try:
            yield copy.path
        finally:
            with self._lock:
                copy.users -= 1
                self._drop_unused()

    def close(self) -> None:
        """Remove this process's copies (at exit: no command of it runs any more)."""
        with self._lock:
            if self._own.owned:  # never a parent's copies, in a child made by fork
                for copy in self._copies:
                    shutil.rmtree(copy.path, ignore_errors=True)
            self._copies = []
            self._own.close()

    def _newest(self) -> _Copy:
        watch, new = self._own.get()
        if new:  # a child made by fork starts afresh and never removes its parent's copies
            self._copies, self._status = [], None
        if self._copies:
            if watch.unchanged(self.source):
                return self._copies[-1]
            if not watch.available and self._status == _walk_status(self.source):
                return self._copies[-1]
        self._copies.append(self._make(watch))
        self._drop_unused()
        return self._copies[-1]

    def _make(self, watch: TreeWatch) -> _Copy:
        if self._home is None:
            self._home = copies_home()
        try:
            return self._make_in(self._home, watch)
        except OSError as e:
            if e.errno not in (errno.ENOSPC, errno.EDQUOT) or self._home == copies_home("/tmp"):
                raise
        # /dev/shm is full (a container's is 64 MB): on the disk then
        self._home = copies_home("/tmp")
        return self._make_in(self._home, watch)

    def _make_in(self, home: Path, watch: TreeWatch) -> _Copy:
        home.mkdir(parents=True, exist_ok=True, mode=0o700)
        if not self._copies:
            _remove_dead(home)
        path = tempfile.mkdtemp(prefix=f"{os.getpid()}-", dir=home)
        try:
            watch.begin(self.source)
            copy_public(self.source, path, lambda d: watch.add(self.source, d))
            watch.end(self.source)
            self._status = None if watch.available else _walk_status(self.source)
        except BaseException:
            shutil.rmtree(path, ignore_errors=True)
            raise
        return _Copy(path)

    def _drop_unused(self) -> None:
        """Remove the copies, newest but one, that no command uses any more."""
        keep = []
        for copy in self._copies[:-1]:
            if copy.users:
                keep.append(copy)
            else:
                shutil.rmtree(copy.path, ignore_errors=True)
        self._copies = keep + self._copies[-1:]


def walk(
    source: str, watching: Callable[[str], object] = lambda _: None
) -> Iterator[tuple[str, str, os.stat_result]]:
    """``(path, path relative to source, status)`` of every entry under ``source``, links
    not followed, a directory before what is in it; directories that other users may not
    list are not entered (they are secrets as a whole). ``watching(directory)`` is called
    before each directory is listed, so that a change made while it is listed is seen
    later. Entries gone while the walk reaches them are passed over."""
    stack = [(source, "")]
    while stack:
        directory, relative = stack.pop()
        watching(directory)
        try:
            entries = list(os.scandir(directory))
        except OSError:
            continue
        for entry in entries:
            try:
                st = entry.stat(follow_symlinks=False)
            except OSError:
                continue
            inside = os.path.join(relative, entry.name)
            yield entry.path, inside, st
            if stat.S_ISDIR(st.st_mode) and not kept_from_others(st.st_mode):
                stack.append((entry.path, inside))


def copy_public(source: str, dest: str, watching: Callable[[str], object] = lambda _: None) -> None:
    """Copy into the empty directory ``dest`` what under ``source`` other users may read,
    with empty stand-ins for the rest (see the module docstring); ``watching(directory)``
    is called before each directory of ``source`` is listed. ``source`` is read without
    following a link or opening a special file."""
    modes: list[tuple[str, int]] = [(dest, os.stat(source).st_mode & 0o777)]
    for path, inside, st in walk(source, watching):
        target, mode = os.path.join(dest, inside), st.st_mode
        try:
            if stat.S_ISLNK(mode):
                os.symlink(os.readlink(path), target)
            elif stat.S_ISDIR(mode):
                os.mkdir(target, 0o700)  # filled first, then given its mode
                # a secret as an empty stand-in, as a cover was (``walk`` does not enter it)
                modes.append((target, 0o755 if kept_from_others(mode) else mode & 0o777))
            elif stat.S_ISREG(mode):
                _copy_file(path, target, mode)
        except FileNotFoundError:  # gone since it was listed
            continue
    for path, mode in reversed(modes):  # deepest first: a parent may forbid entering it
        os.chmod(path, mode)


def _copy_file(source: str, target: str, mode: int) -> None:
    """``source`` into a new file ``target`` if others may read it, else an empty file that
    nobody may read. Judged on the file as opened (it may have changed since it was
    listed); never through a link, never blocking on a FIFO put in its place."""
    if kept_from_others(mode):
        os.close(os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0))
        return
    fd = os.open(source, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        st = os.fstat(fd)
        public = stat.S_ISREG(st.st_mode) and not kept_from_others(st.st_mode)
        out = os.open(
            target,
            os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC,
            st.st_mode & 0o777 if public else 0,
        )
        try:
            while public and (data := os.read(fd, 1 << 20)):
                os.write(out, data)
        finally:
            os.close(out)
    finally:
        os.close(fd)


def _walk_status(source: str) -> list[_Status]:
    """Every entry's status under ``source``: equal lists, the same tree as far as a copy
    is concerned."""
    return [
        (path, st.st_mode, st.st_uid, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
        for path, _, st in walk(source)
    ]


def _remove_dead(home: Path) -> None:
    """Remove the copies of processes that no longer exist (killed before they could)."""
    if not os.path.isdir("/proc/self"):  # no way to tell who is alive
        return
    for entry in os.scandir(home):
        pid, _, _ = entry.name.partition("-")
        if pid.isdigit() and int(pid) != os.getpid() and not os.path.exists(f"/proc/{pid}"):
            shutil.rmtree(entry.path, ignore_errors=True)

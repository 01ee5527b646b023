"""Knowing that a tree did not change without looking at it: inotify, where there is one.

:class:`TreeWatch` holds an inotify watch on every directory of a tree and answers only
"maybe changed" or "certainly unchanged" (:meth:`TreeWatch.unchanged`); whatever it cannot
vouch for (no inotify, the watch limit, a lost event) counts as changed, so correctness
never depends on it. :meth:`TreeWatch.changed_directories` names where events came, for
callers that keep per-directory state. Writes inside the sandbox through its bind mount
are seen (same inodes); writes through a shared ``mmap`` are not, nor do they change
``mtime``. :class:`OwnWatch` is a process's own watch, renewed after ``fork``.
"""

from __future__ import annotations

import contextlib
import errno
import os

from stayer.workspace.watchd import (
    IN_CLOEXEC,
    IN_NONBLOCK,
    IN_Q_OVERFLOW,
    inotify_events,
    inotify_libc,
)

_IN_MODIFY, _IN_ATTRIB = 0x2, 0x4
_IN_MOVED_FROM, _IN_MOVED_TO, _IN_CREATE, _IN_DELETE = 0x40, 0x80, 0x100, 0x200
_IN_DELETE_SELF, _IN_MOVE_SELF = 0x400, 0x800
_IN_ONLYDIR, _IN_DONT_FOLLOW = 0x01000000, 0x02000000
_MASK = (
    _IN_MODIFY
    | _IN_ATTRIB
    | _IN_MOVED_FROM
    | _IN_MOVED_TO
    | _IN_CREATE
    | _IN_DELETE
    | _IN_DELETE_SELF
    | _IN_MOVE_SELF
    | _IN_ONLYDIR
    | _IN_DONT_FOLLOW
)


# A module name of its own, so that tests can take inotify away.
_libc = inotify_libc


class TreeWatch:
    """Change detection for any number of trees, each named by a key (its path)."""

    def __init__(self) -> None:
        self._libc = _libc()
        self._fd = -1
        if self._libc is not None:
            self._fd = self._libc.inotify_init1(IN_NONBLOCK | IN_CLOEXEC)
        self._key_of_wd: dict[int, str] = {}
        self._dir_of_wd: dict[int, str] = {}
        self._changed: set[str] = set()
        self._vouched: set[str] = set()  # keys fully watched since they were last cleared
        self._dirty: dict[str, set[str]] = {}  # key → directories that saw an event
        self._lost: set[str] = set()  # keys with events or directories we cannot place

    @property
    def available(self) -> bool:
        return self._fd >= 0

    def begin(self, key: str) -> None:
        """Start watching ``key`` afresh: call before scanning its tree, then :meth:`add`
        every directory before listing it, then :meth:`end`. A change that happens during
        the scan will show up at the next :meth:`unchanged`."""
        self._drain()
        self._changed.discard(key)
        self._vouched.discard(key)
        self._dirty.pop(key, None)
        self._lost.discard(key)

    def add(self, key: str, directory: str) -> bool:
        """Watch ``directory`` as part of ``key``'s tree; False if it cannot be watched,
        in which case ``key`` is never reported unchanged until the next :meth:`begin`."""
        if self._fd < 0:
            return False
        assert self._libc is not None
        wd = self._libc.inotify_add_watch(self._fd, os.fsencode(directory), _MASK)
        if wd < 0:
            self._changed.add(key)
            self._lost.add(key)
            return False
        # Watching a directory again (moved, or re-read) returns its watch: its new path.
        self._key_of_wd[wd] = key
        self._dir_of_wd[wd] = directory
        return True

    def end(self, key: str) -> None:
        """The scan of ``key`` is complete: vouch for it unless a directory was missed."""
        if self._fd >= 0 and key not in self._changed:
            self._vouched.add(key)

    def unchanged(self, key: str) -> bool:
        """True only if nothing under ``key`` changed since its last complete scan."""
        if key not in self._vouched:
            return False
        self._drain()
        return key not in self._changed

    def changed_directories(self, key: str) -> set[str] | None:
        """The directories of ``key``'s tree that saw a change since the last call (or since
        the scan that :meth:`end` vouched for), and forget them; None when only a full scan
        can tell (never vouched, events lost, a directory not watched). The caller re-reads
        each named directory, calling :meth:`add` on it and on every new directory under
        it before listing them."""
        if key not in self._vouched:
            return None
        self._drain()
        if key in self._lost:
            return None
        self._changed.discard(key)
        return self._dirty.pop(key, set())

    def forget(self, key: str) -> None:
        """Stop vouching for ``key`` (e.g. after the caller changed the tree itself)."""
        self._vouched.discard(key)

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
        self._vouched.clear()

    def _drain(self) -> None:
        if self._fd < 0:
            return
        while True:
            try:
                buf = os.read(self._fd, 64 * 1024)
            except BlockingIOError:
                return
            except OSError as e:  # pragma: no cover - the fd went bad: trust nothing
                if e.errno != errno.EINTR:
                    self._vouched.clear()
                    with contextlib.suppress(OSError):
                        os.close(self._fd)
                    self._fd = -1
                    return
                continue
            for wd, mask in inotify_events(buf):
                if mask & IN_Q_OVERFLOW:  # events were lost: any tree may have changed
                    self._changed.update(self._vouched)
                    self._lost.update(self._vouched)
                elif (key := self._key_of_wd.get(wd)) is not None:
                    self._changed.add(key)
                    self._dirty.setdefault(key, set()).add(self._dir_of_wd[wd])

    def __del__(self) -> None:
        with contextlib.suppress(Exception):
            self.close()


class OwnWatch:
    """A :class:`TreeWatch` of this process's own, for a cache kept for the life of a
    process. A process made by ``fork`` shares its parent's inotify queue, and reading it
    would take events the parent needs (and the reverse): a child gets a watch of its own,
    and :meth:`get` says so, for the caller to drop what it kept under its parent's."""

    def __init__(self) -> None:
        self._pid = -1
        self._watch: TreeWatch | None = None

    @property
    def owned(self) -> bool:
        """Whether this process made the watch (and what was kept with it)."""
        return self._watch is not None and self._pid == os.getpid()

    def get(self) -> tuple[TreeWatch, bool]:
        """(this process's watch, whether it is new: nothing kept before is vouched for)."""
        if self._watch is not None and self.owned:
            return self._watch, False
        self._watch, self._pid = TreeWatch(), os.getpid()
        return self._watch, True

    def close(self) -> None:
        if self.owned:
            assert self._watch is not None
            self._watch.close()
        self._watch = None

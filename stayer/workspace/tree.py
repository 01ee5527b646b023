"""Walking a workspace without leaving it: the one tree walk that limits, snapshots and the
breakers' fingerprint share.

The walk goes from directory fd to directory fd (``openat`` with ``O_NOFOLLOW``), never by
path: symlinks are reported, never followed, at any depth, and a directory swapped for a
link while the walk runs (the storage limit walks a tree the sandbox is writing) is refused
rather than entered. Other file systems mounted inside the tree are not entered either. So a
link the agent plants (``ln -s / escape``) cannot make stayer read, count or copy anything
outside the workspace. Names are what the file system holds: a name that is not UTF-8 comes
as a ``str`` with surrogate escapes (``os.fsdecode``), which every ``os`` call accepts back.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Callable, Collection, Iterator
from pathlib import Path

_S_IFMT = 0o170000
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
# Directories nested deeper than this are reported but not entered: the walk holds one fd
# per level, and a path of this depth is already near PATH_MAX, past which no tool in the
# sandbox could reach it by name either.
MAX_DEPTH = 256


def walk(
    root: str | Path,
    before_listing: Callable[[str], object] | None = None,
    exclude: Collection[str] = (),
) -> Iterator[tuple[str, os.stat_result, int, str]]:
    """``(relative path, lstat, parent directory fd, name)`` of everything under ``root``
    (not ``root`` itself), parents before their children, in no particular order otherwise.

    The fd is open until the walk moves on to the next entry: open the entry with
    ``os.open(name, …, dir_fd=fd)`` (and ``O_NOFOLLOW``), never by its path. Entries that
    vanish or cannot be read while walking are skipped: the tree is live.
    ``before_listing(path)`` is called with each directory's path (``root`` first) just
    before it is read, e.g. to start watching it for changes. Names in ``exclude`` are
    left out of ``root``'s own listing (and not entered).
    """
    # Written for speed (it is most of the cost of an unchanged snapshot): one fstatat per
    # entry, one open per directory, and as little Python per entry as possible.
    root = os.fspath(root)
    root_fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    device = os.fstat(root_fd).st_dev
    # Each frame: a listed directory (its fd and relative prefix) and the subdirectories of
    # it still to enter. Only the frames on the current path are open: fds <= depth.
    stack: list[tuple[int, str, list[str]]] = []
    fd, prefix = root_fd, ""
    try:
        while True:
            if fd >= 0:
                if before_listing is not None:
                    before_listing(f"{root}/{prefix[:-1]}" if prefix else root)
                subdirs: list[str] = []
                try:
                    entries = os.scandir(fd)
                except OSError:
                    entries = None
                if entries is not None:
                    with entries:
                        for entry in entries:
                            if not prefix and entry.name in exclude:
                                continue
                            try:
                                st = entry.stat(follow_symlinks=False)
                            except OSError:
                                continue
                            yield prefix + entry.name, st, fd, entry.name
                            if st.st_mode & _S_IFMT == stat.S_IFDIR and st.st_dev == device:
                                subdirs.append(entry.name)
                if len(stack) < MAX_DEPTH:
                    stack.append((fd, prefix, subdirs))
                elif fd != root_fd:
                    os.close(fd)
            fd = -1
            while stack and not stack[-1][2]:
                done = stack.pop()[0]
                if done != root_fd:
                    os.close(done)
            if not stack:
                return
            parent, parent_prefix, todo = stack[-1]
            name = todo.pop()
            prefix = f"{parent_prefix}{name}/"
            try:
                fd = os.open(name, _DIR_FLAGS, dir_fd=parent)
            except OSError:  # gone, or replaced by a link since it was listed
                continue
    finally:
        for frame in stack:
            if frame[0] != root_fd:
                os.close(frame[0])
        if fd >= 0 and fd != root_fd:
            os.close(fd)
        os.close(root_fd)


def iter_tree(
    root: str | Path,
    before_listing: Callable[[str], object] | None = None,
    exclude: Collection[str] = (),
) -> Iterator[tuple[str, os.stat_result]]:
    """``(relative path, lstat)`` of everything under ``root``: :func:`walk` without the
    fds, for callers that only look at the stats."""
    for rel, st, _fd, _name in walk(root, before_listing, exclude):
        yield rel, st


def disk_usage(root: str | Path) -> int:
    """Bytes allocated under ``root`` (``st_blocks``, so a sparse file counts what it really
    occupies), each hard-linked inode once. What a storage limit is measured against."""
    total = 0
    seen: set[int] = set()
    if not os.path.isdir(root):  # the command removed it; nothing is held there any more
        return 0
    for _rel, st in iter_tree(root):
        if st.st_nlink > 1 and not stat.S_ISDIR(st.st_mode):
            if st.st_ino in seen:
                continue
            seen.add(st.st_ino)
        total += st.st_blocks * 512
    return total

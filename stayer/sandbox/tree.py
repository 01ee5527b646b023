"""Walking a workspace without leaving it: the one tree walk that limits and snapshots share.

Symlinks are reported, never followed, and other file systems mounted inside the tree are
not entered, so a link the agent plants (``ln -s / escape``) cannot make stayer read, count
or copy anything outside the workspace.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Callable, Iterator
from pathlib import Path

_S_IFMT = 0o170000


def iter_tree(
    root: str | Path, before_listing: Callable[[str], object] | None = None
) -> Iterator[tuple[str, os.stat_result]]:
    """``(relative path, lstat)`` of everything under ``root`` (not ``root`` itself),
    parents before their children, in no particular order otherwise.

    Entries that vanish or cannot be read while walking are skipped: the tree is live.
    ``before_listing(path)`` is called with each directory (``root`` first) just before
    it is read, e.g. to start watching it for changes.
    """
    # Written for speed (it is most of the cost of an unchanged snapshot): one lstat per
    # entry and as little Python per entry as possible.
    root = os.fspath(root)
    device = os.lstat(root).st_dev
    stack = [("", root)]
    while stack:
        prefix, abs_dir = stack.pop()
        if before_listing is not None:
            before_listing(abs_dir)
        try:
            entries = os.scandir(abs_dir)
        except OSError:
            continue
        with entries:
            for entry in entries:
                try:
                    st = entry.stat(follow_symlinks=False)
                except OSError:
                    continue
                rel = prefix + entry.name
                yield rel, st
                if st.st_mode & _S_IFMT == stat.S_IFDIR and st.st_dev == device:
                    stack.append((rel + "/", entry.path))


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

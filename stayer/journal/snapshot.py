"""Workspace snapshots kept in the journal's own blob store.

The sandbox's ``FileSnapshotStore`` keeps snapshots in local files, which is right next to
a local SQLite journal. A run journaled in PostgreSQL may be resumed on another machine, so
its snapshots must live where its events do: this ``SnapshotStore`` (same protocol) writes
into the journal store's blobs.

Layout, as in git: a directory is a tree blob listing its entries; a file is a list of
1 MiB chunk blobs (``null`` for a chunk wholly inside a hole of a sparse file: never read,
never written back, so sparse stays sparse). Unchanged files, chunks and subtrees hash to
the same addresses and are stored once, so per-step snapshots cost what changed, not the
workspace size, and a file that only grows (a log) re-stores only its last chunk. The
workspace is the sandbox's: it is walked by directory fd and read as
:mod:`stayer.sandbox.hostfs` reads (no link followed, only regular files opened, names as
bytes), and modes keep permission bits only (no setuid, setgid or sticky bit). FIFOs are
kept (never opened); sockets and device files are not workspace content. A stat cache skips re-reading files
whose size, times and inode are unchanged; files modified within the last second are
always re-read, since a same-size rewrite within the filesystem's timestamp granularity
would otherwise go unnoticed.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from stayer.journal.blobs import digest
from stayer.sandbox.hostfs import (
    UnsafeFile,
    data_extents,
    is_sparse,
    open_regular,
    plain_mode,
    pwrite_all,
)
from stayer.sandbox.tree import MAX_DEPTH

CHUNK = 1 << 20
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_CREATE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
_RACY_NS = 1_000_000_000


class BlobSnapshots:
    """Snapshots as content-addressed trees. ``put`` stores blobs durably (the journal
    store's ``put_blobs``); ``get`` reads one back."""

    def __init__(
        self,
        put: Callable[[Mapping[str, bytes]], object],
        get: Callable[[str], bytes],
    ) -> None:
        self._put = put
        self._get = get
        self._stat_cache: dict[str, tuple[tuple[int, ...], list[str | None]]] = {}
        self._known: set[str] = set()  # addresses stored by this instance

    def snapshot(self, workspace: Path) -> str:
        pending: dict[str, bytes] = {}
        fd = os.open(workspace, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            root = self._tree(fd, os.fspath(workspace), pending, time.time_ns() - _RACY_NS)
        finally:
            os.close(fd)
        self._flush(pending)
        return root

    def _add(self, data: bytes, pending: dict[str, bytes]) -> str:
        address = digest(data)
        if address not in self._known:
            pending[address] = data
        return address

    def _flush(self, pending: dict[str, bytes]) -> None:
        if pending:
            self._put(pending)
            self._known.update(pending)
            pending.clear()

    def _tree(
        self, dir_fd: int, key: str, pending: dict[str, bytes], racy_after: int, depth: int = 0
    ) -> str:
        """Store the directory ``dir_fd`` (``key``: its path, for the stat cache) as a tree
        blob. Walked by fd and opened with ``O_NOFOLLOW`` (:mod:`stayer.sandbox.hostfs`):
        the workspace is the sandbox's, and nothing it plants is followed or read."""
        entries: list[dict[str, Any]] = []
        with os.scandir(dir_fd) as it:
            items = sorted(it, key=lambda e: e.name)
        for e in items:
            try:
                st = e.stat(follow_symlinks=False)
                if stat.S_ISLNK(st.st_mode):
                    entries.append({"name": e.name, "link": os.readlink(e.name, dir_fd=dir_fd)})
                elif stat.S_ISDIR(st.st_mode):
                    tree = self._subtree(
                        dir_fd, e.name, f"{key}/{e.name}", pending, racy_after, depth + 1
                    )
                    entries.append({"name": e.name, "mode": plain_mode(st.st_mode), "tree": tree})
                elif stat.S_ISREG(st.st_mode):
                    chunks, size = self._file(
                        dir_fd, e.name, f"{key}/{e.name}", pending, racy_after
                    )
                    entries.append(
                        {
                            "name": e.name,
                            "mode": plain_mode(st.st_mode),
                            "size": size,
                            "mtime_ns": st.st_mtime_ns,
                            "chunks": chunks,
                        }
                    )
                elif stat.S_ISFIFO(
                    st.st_mode
                ):  # kept as the sandbox's snapshots keep it; never opened
                    entries.append({"name": e.name, "mode": plain_mode(st.st_mode), "fifo": True})
            except (UnsafeFile, FileNotFoundError):  # replaced or gone since listed
                continue
            # sockets and devices are not workspace content
            if len(pending) > 64:  # bound memory: large trees flush as they go
                self._flush(pending)
        return self._add(json.dumps(entries, separators=(",", ":")).encode(), pending)

    def _subtree(
        self,
        dir_fd: int,
        name: str,
        key: str,
        pending: dict[str, bytes],
        racy_after: int,
        depth: int,
    ) -> str:
        if depth > MAX_DEPTH:  # as deep as the walk goes (stayer.sandbox.tree)
            return self._add(b"[]", pending)
        try:
            fd = os.open(name, _DIR_FLAGS, dir_fd=dir_fd)
        except OSError as e:  # a link now, not the directory that was listed
            raise UnsafeFile(e.errno, "not a directory any more", name) from None
        try:
            return self._tree(fd, key, pending, racy_after, depth)
        finally:
            os.close(fd)

    def _file(
        self, dir_fd: int, name: str, key: str, pending: dict[str, bytes], racy_after: int
    ) -> tuple[list[str | None], int]:
        """The chunk addresses of a file and its size; a chunk entirely in a hole of a
        sparse file is ``None``, never read and never written back."""
        fd, st = open_regular(name, dir_fd)
        try:
            sig = (st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino)
            cached = self._stat_cache.get(key)
            if cached is not None and cached[0] == sig:
                return cached[1], st.st_size
            sparse = is_sparse(st)
            extents = data_extents(fd, st.st_size) if sparse else []
            chunks: list[str | None] = []
            offset, i = 0, 0  # extents[i]: the first one that ends after offset
            while offset < st.st_size:
                while i < len(extents) and sum(extents[i]) <= offset:
                    i += 1
                next_data = extents[i][0] if i < len(extents) else st.st_size
                if sparse and next_data >= offset + CHUNK:
                    # a hole up to the chunk holding the next data: skip its chunks at once
                    holes = (next_data - offset) // CHUNK
                    chunks.extend([None] * holes)
                    offset += holes * CHUNK
                    continue
                block = os.pread(fd, min(CHUNK, st.st_size - offset), offset)
                if not block:  # shrank since the fstat
                    break
                chunks.append(self._add(block, pending))
                if len(pending) > 64:
                    self._flush(pending)
                offset += CHUNK
        finally:
            os.close(fd)
        if st.st_mtime_ns < racy_after and st.st_ctime_ns < racy_after:
            self._stat_cache[key] = (sig, chunks)
        return chunks, st.st_size

    def restore(self, snapshot_id: str, workspace: Path) -> None:
        """Make ``workspace`` exactly the snapshot: extra files removed, contents, modes,
        modification times and symlinks as recorded."""
        workspace = Path(workspace)
        clear_workspace(workspace)
        workspace.mkdir(parents=True, exist_ok=True)
        self._restore_tree(snapshot_id, workspace)
        self._stat_cache.clear()

    def _restore_tree(self, address: str, directory: Path) -> None:
        dir_modes: list[tuple[Path, int]] = []
        for entry in json.loads(self._get(address)):
            path = directory / entry["name"]
            if "link" in entry:
                os.symlink(entry["link"], path)
            elif entry.get("fifo"):
                os.mkfifo(path, plain_mode(entry["mode"]))
                os.chmod(path, plain_mode(entry["mode"]))  # past the umask
            elif "tree" in entry:
                path.mkdir()
                self._restore_tree(entry["tree"], path)
                dir_modes.append((path, plain_mode(entry["mode"])))
            else:
                fd = os.open(path, _CREATE_FLAGS, 0o600)
                try:
                    for i, chunk in enumerate(entry["chunks"]):
                        if chunk is not None:  # None: a hole, left unwritten
                            pwrite_all(fd, self._get(chunk), i * CHUNK)
                    os.ftruncate(fd, entry["size"])
                    os.fchmod(fd, plain_mode(entry["mode"]))
                    os.utime(fd, ns=(entry["mtime_ns"], entry["mtime_ns"]))
                finally:
                    os.close(fd)
        # Modes last: a read-only directory must be filled before it becomes read-only.
        for path, mode in dir_modes:
            os.chmod(path, mode)


def clear_workspace(workspace: Path) -> None:
    """Empty ``workspace`` (itself kept), including read-only directories in it; nothing to
    do if it does not exist."""

    def make_writable_and_retry(func: Callable[..., Any], path: str, _exc: object) -> None:
        parent = os.path.dirname(path)
        os.chmod(parent, os.stat(parent).st_mode | stat.S_IWUSR | stat.S_IXUSR)
        func(path)

    if workspace.is_symlink() or workspace.is_file():
        workspace.unlink()
        return
    if not workspace.exists():
        return
    for child in workspace.iterdir():
        if child.is_dir() and not child.is_symlink():
            shutil.rmtree(child, onerror=make_writable_and_retry)  # onexc needs 3.12
        else:
            child.unlink()

"""Workspace snapshots kept in the journal's own blob store.

The sandbox's ``FileSnapshotStore`` keeps snapshots in local files, which is right next to
a local SQLite journal. A run journaled in PostgreSQL may be resumed on another machine, so
its snapshots must live where its events do: this ``SnapshotStore`` (same protocol) writes
into the journal store's blobs.

Layout, as in git: a directory is a tree blob listing its entries; a file is a list of
1 MiB chunk blobs. Unchanged files, chunks and subtrees hash to the same addresses and are
stored once, so per-step snapshots cost what changed, not the workspace size, and a file
that only grows (a log) re-stores only its last chunk. A stat cache skips re-reading files
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

CHUNK = 1 << 20
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
        self._stat_cache: dict[str, tuple[tuple[int, ...], list[str]]] = {}
        self._known: set[str] = set()  # addresses stored by this instance

    def snapshot(self, workspace: Path) -> str:
        pending: dict[str, bytes] = {}
        root = self._tree(Path(workspace), pending, time.time_ns() - _RACY_NS)
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

    def _tree(self, directory: Path, pending: dict[str, bytes], racy_after: int) -> str:
        entries: list[dict[str, Any]] = []
        with os.scandir(directory) as it:
            items = sorted(it, key=lambda e: e.name)
        for e in items:
            st = e.stat(follow_symlinks=False)
            mode = stat.S_IMODE(st.st_mode)
            if stat.S_ISLNK(st.st_mode):
                entries.append({"name": e.name, "link": os.readlink(e.path)})
            elif stat.S_ISDIR(st.st_mode):
                entries.append({"name": e.name, "mode": mode, "tree": self._tree(Path(e.path), pending, racy_after)})
            elif stat.S_ISREG(st.st_mode):
                chunks = self._file(e.path, st, pending, racy_after)
                entries.append({"name": e.name, "mode": mode, "size": st.st_size, "mtime_ns": st.st_mtime_ns, "chunks": chunks})
            # sockets, fifos and devices are not workspace content
            if len(pending) > 64:  # bound memory: large trees flush as they go
                self._flush(pending)
        return self._add(json.dumps(entries, separators=(",", ":")).encode(), pending)

    def _file(self, path: str, st: os.stat_result, pending: dict[str, bytes], racy_after: int) -> list[str]:
        key = (st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino)
        cached = self._stat_cache.get(path)
        if cached is not None and cached[0] == key:
            return cached[1]
        chunks = []
        with open(path, "rb") as f:
            while block := f.read(CHUNK):
                chunks.append(self._add(block, pending))
                if len(pending) > 64:
                    self._flush(pending)
        if st.st_mtime_ns < racy_after and st.st_ctime_ns < racy_after:
            self._stat_cache[path] = (key, chunks)
        return chunks

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
            elif "tree" in entry:
                path.mkdir()
                self._restore_tree(entry["tree"], path)
                dir_modes.append((path, entry["mode"]))
            else:
                with open(path, "wb") as f:
                    for chunk in entry["chunks"]:
                        f.write(self._get(chunk))
                os.chmod(path, entry["mode"])
                os.utime(path, ns=(entry["mtime_ns"], entry["mtime_ns"]))
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

"""Workspace snapshots kept in the journal's own blob store.

The sandbox's ``FileSnapshotStore`` keeps snapshots in local files, which is right next to
a local SQLite journal. A run journaled in PostgreSQL may be resumed on another machine, so
its snapshots must live where its events do: :class:`BlobSnapshots` (same protocol) writes
into the journal store's blobs.

Details and rationale: docs/notes.md, ``stayer/journal/snapshot.py``.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from stayer.journal.blobs import BlobError
from stayer.workspace.hostfs import plain_mode, pwrite_all
from stayer.workspace.snapshot import SnapshotNotFound, Snapshots

CHUNK = 1 << 20
_CREATE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
# Blobs held back before they go to the store in one put: bounded memory, fewer round trips.
_BATCH_BLOBS, _BATCH_BYTES = 64, 8 << 20


class _JournalObjects:
    """The journal store's blobs as :class:`~stayer.workspace.snapshot.Objects`. A put is
    durable when ``put`` returns (the store's promise), so nothing needs an fsync here."""

    max_blob: int | None = CHUNK

    def __init__(
        self, put: Callable[[Mapping[str, bytes]], object], get: Callable[[str], bytes]
    ) -> None:
        self._put = put
        self._get = get
        self._known: set[str] = set()  # addresses stored by this instance
        self._pending: dict[str, bytes] = {}
        self._pending_bytes = 0

    def has(self, blob: str) -> bool:
        return blob in self._known or blob in self._pending

    def put(self, blob: str, data: bytes) -> None:
        self._pending[blob] = data
        self._pending_bytes += len(data)
        if len(self._pending) >= _BATCH_BLOBS or self._pending_bytes >= _BATCH_BYTES:
            self._flush()

    def put_stream(self, src: int, limit: int = -1) -> tuple[str, int, bool]:
        raise NotImplementedError("blobs here are at most CHUNK: big files are extent maps")

    def open_loose(self, blob: str) -> int:
        raise NotImplementedError("blobs here are at most CHUNK: big files are extent maps")

    def end_batch(self) -> list[str]:
        self._flush()
        return []

    def read(self, blob: str) -> bytes:
        return self._get(blob)

    def put_manifest(self, snapshot_id: str, body: bytes) -> list[str] | None:
        if snapshot_id in self._known:
            return None
        self._pending[snapshot_id] = body  # its address: the snapshot id is its hash
        self._flush()  # last: every blob it names is stored before it
        return []

    def get_manifest(self, snapshot_id: str) -> bytes:
        try:
            return self._get(snapshot_id)
        except (KeyError, BlobError) as e:
            raise SnapshotNotFound(f"no snapshot {snapshot_id!r} in the journal ({e})") from None

    def has_manifest(self, snapshot_id: str) -> bool:
        if snapshot_id in self._known:
            return True
        try:
            self._get(snapshot_id)
        except (KeyError, BlobError):
            return False
        return True

    def close(self) -> None:
        pass

    def _flush(self) -> None:
        if self._pending:
            pending, self._pending, self._pending_bytes = self._pending, {}, 0
            self._put(pending)
            self._known.update(pending)


class BlobSnapshots(Snapshots):
    """Snapshots in the journal store's blobs. ``put`` stores blobs durably (the journal
    store's ``put_blobs``); ``get`` reads one back (``get_blob``)."""

    def __init__(
        self,
        put: Callable[[Mapping[str, bytes]], object],
        get: Callable[[str], bytes],
    ) -> None:
        super().__init__(_JournalObjects(put, get), None, watch=False, shared_watch=False)
        self._get = get

    def restore(self, snapshot_id: str, workspace: Path) -> None:
        """Make ``workspace`` exactly the snapshot: extra files removed, contents, modes,
        modification times and symlinks as recorded."""
        if snapshot_id not in self._manifests and snapshot_id.isalnum():
            body = self._blobs.get_manifest(snapshot_id)
            if body[:1] == b"[":  # a tree of the format before this one
                _restore_legacy(self._get, snapshot_id, Path(workspace))
                self._workspaces.pop(str(Path(workspace).resolve()), None)
                return
            self._manifests[snapshot_id] = self._parse_manifest(snapshot_id, body)
        super().restore(snapshot_id, workspace)


def _restore_legacy(get: Callable[[str], bytes], address: str, workspace: Path) -> None:
    """Restore a snapshot of the earlier format: a directory is a JSON list of entries (a
    ``tree``, a ``link``, a ``fifo`` or a file's 1 MiB ``chunks``, ``null`` for a hole)."""
    clear_workspace(workspace)
    workspace.mkdir(parents=True, exist_ok=True)
    _restore_legacy_tree(get, address, workspace)


def _restore_legacy_tree(get: Callable[[str], bytes], address: str, directory: Path) -> None:
    dir_modes: list[tuple[Path, int]] = []
    for entry in json.loads(get(address)):
        path = directory / entry["name"]
        if "link" in entry:
            os.symlink(entry["link"], path)
        elif entry.get("fifo"):
            os.mkfifo(path, plain_mode(entry["mode"]))
            os.chmod(path, plain_mode(entry["mode"]))  # past the umask
        elif "tree" in entry:
            path.mkdir()
            _restore_legacy_tree(get, entry["tree"], path)
            dir_modes.append((path, plain_mode(entry["mode"])))
        else:
            fd = os.open(path, _CREATE_FLAGS, 0o600)
            try:
                for i, chunk in enumerate(entry["chunks"]):
                    if chunk is not None:  # None: a hole, left unwritten
                        pwrite_all(fd, get(chunk), i * CHUNK)
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

"""Content-addressed blobs: every payload is stored once under the SHA-256 of its bytes.

A long run re-sends the same messages in every request; the journal stores each message,
tool output and file chunk once, so it grows with unique content rather than with
steps × context. Blobs are compressed (zlib, fastest level) when that saves space; the
address is always the hash of the *uncompressed* bytes, so the encoding can change
without changing any reference.

``FileBlobStore`` keeps them as files under ``$STAYER_HOME/blobs/`` (the SQLite default);
the Postgres store keeps them in a table and uses only the encoding helpers here.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import zlib
from collections.abc import Iterable, Mapping
from pathlib import Path

_RAW, _ZLIB = b"\x00", b"\x01"
# Below this size compression saves too little to be worth the CPU.
_COMPRESS_MIN = 512


class BlobError(Exception):
    """A blob that is missing or whose bytes do not match its address."""


def digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def encode(data: bytes) -> bytes:
    """Stored form: one marker byte, then the raw or zlib-compressed bytes."""
    if len(data) >= _COMPRESS_MIN:
        packed = zlib.compress(data, 1)
        if len(packed) < len(data) * 9 // 10:
            return _ZLIB + packed
    return _RAW + data


def decode(stored: bytes, address: str) -> bytes:
    """The raw bytes of a stored blob, checked against its address."""
    marker, body = stored[:1], stored[1:]
    try:
        data = zlib.decompress(body) if marker == _ZLIB else body
    except zlib.error as e:
        raise BlobError(f"blob {address[:12]}: corrupt ({e})") from None
    if marker not in (_RAW, _ZLIB) or digest(data) != address:
        raise BlobError(
            f"blob {address[:12]}: its bytes do not match its address (torn or corrupt)"
        )
    return data


class FileBlobStore:
    """Blobs as files ``blobs/<first 2 hex>/<rest>``; written to a temporary name, fsynced
    and renamed, so a blob file is either absent or complete. The directory is fsynced before
    a put returns, so an event committed afterwards never refers to a blob a power cut could
    take away."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self._tmp_counter = 0
        self._dirs: set[Path] = set()  # shard directories known to exist

    def path(self, address: str) -> Path:
        return self.root / address[:2] / address[2:]

    def has(self, address: str) -> bool:
        return self.path(address).is_file()

    def missing(self, addresses: Iterable[str]) -> set[str]:
        return {a for a in addresses if not self.has(a)}

    def get(self, address: str) -> bytes:
        try:
            stored = self.path(address).read_bytes()
        except FileNotFoundError:
            raise BlobError(f"blob {address[:12]}: missing from {self.root}") from None
        return decode(stored, address)

    def put_many(self, blobs: Mapping[str, bytes]) -> int:
        """Store ``address → raw bytes``; returns the bytes written (0 for blobs already
        present)."""
        return sum(self.put_stored(a, encode(d)) for a, d in blobs.items())

    def put_stored(self, address: str, stored: bytes) -> int:
        """Store one blob already in its stored form (:func:`encode`), durably."""
        final = self.path(address)
        with contextlib.suppress(FileNotFoundError):
            if final.stat().st_size == len(stored):
                return 0  # present (one of another size is damaged: rewritten below)
        if final.parent not in self._dirs:
            final.parent.mkdir(parents=True, exist_ok=True)
            self._dirs.add(final.parent)
        self._tmp_counter += 1
        tmp = final.parent / f".tmp-{os.getpid()}-{self._tmp_counter}"
        with open(tmp, "wb") as f:
            f.write(stored)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, final)
        _fsync_dir(final.parent)
        return len(stored)

    def stored_size(self, address: str) -> int:
        p = self.path(address)
        return p.stat().st_size if p.is_file() else 0


def _fsync_dir(path: Path) -> None:
    with contextlib.suppress(OSError):  # not every platform lets a directory be fsynced
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

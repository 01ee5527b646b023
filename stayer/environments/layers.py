"""The Docker-free builder's layer cache: what each layer is, when it was last used, and
pruning the least recently used.

Beside each layer (``<cache>/layers/<key>``, a whole root filesystem) lives
``<key>.json``: its parent, the Dockerfile and step that made it, size, creation and last
use, and the Dockerfiles whose image it is. ``fcntl.flock`` locks: ``<key>.build`` while a
layer is made, ``<key>.lock`` shared for as long as a process uses the layer (never
removed then), ``layers/prune.lock`` shared by builds and exclusive while a prune removes.
Removal renames the layer aside and removes it without following links; a cache directory
that is a link or another user's is refused.

Why the locks are split this way: ``docs/internals.md#environments-layers``.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import shutil
import stat
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

import msgspec
from msgspec import UNSET, UnsetType

from stayer.errors import ConfigError
from stayer.records import Record, decode, to_json

T = TypeVar("T")
D = TypeVar("D")
KEY = re.compile(r"[0-9a-f]{24}")
PRUNE_LOCK = "prune.lock"
# Left behind by an interrupted build (or prune) of the layer named before the suffix.
_LEFTOVERS = (".partial.context", ".partial", ".pruning", ".build")
# This process's shared locks on the layers it built or reused, by path: kept open.
_HELD: dict[str, int] = {}


@dataclass
class Layer:
    id: str
    size_bytes: int
    created: float | None = None
    last_used: float | None = None
    parent: str | None = None  # None: built on a base
    dockerfile: str | None = None  # of the step that made it
    step: str | None = None
    images: list[str] = field(default_factory=list)  # Dockerfiles whose image it is
    in_use: bool = False

    def doc(self) -> LayerDoc:
        """The layer as ``stayer images list --json`` shows it: times as ISO dates."""
        return LayerDoc(
            id=self.id,
            size_bytes=self.size_bytes,
            created=_iso(self.created),
            last_used=_iso(self.last_used),
            parent=self.parent,
            dockerfile=self.dockerfile,
            step=self.step,
            images=self.images,
            in_use=self.in_use,
        )


class LayerDoc(Record):
    """A layer in ``stayer images list --json``."""

    id: str
    size_bytes: int
    created: str | None
    last_used: str | None
    parent: str | None
    dockerfile: str | None
    step: str | None
    images: list[str]
    in_use: bool


class LayerMeta(Record, kw_only=True):
    """``<key>.json``: what the builder recorded of a layer (a field it never wrote is
    ``UNSET``, and stays absent when the file is written again)."""

    size_bytes: int | UnsetType = UNSET
    created: float | None | UnsetType = UNSET
    last_used: float | None | UnsetType = UNSET
    parent: str | None | UnsetType = UNSET
    dockerfile: str | None | UnsetType = UNSET
    step: str | None | UnsetType = UNSET
    images: list[str] | UnsetType = UNSET


# -- what the builder records ---------------------------------------------------------


@contextlib.contextmanager
def building(layers: Path) -> Iterator[None]:
    """Held by a build while it runs: no prune removes a layer meanwhile."""
    with open(layers / PRUNE_LOCK, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_SH)
        yield


def used(
    layers: Path,
    key: str,
    *,
    made_on: str | None = None,
    made_by: tuple[str, str] | None = None,
    image_of: str | None = None,
) -> None:
    """Hold ``key``'s lock shared for as long as this process lives, and record now as
    when it was last used; the first time, what it was made on (the parent layer's key)
    and by (Dockerfile, step), and its size; ``image_of``: it is that Dockerfile's image."""
    path = str(layers / f"{key}.lock")
    if path not in _HELD:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
        fcntl.flock(fd, fcntl.LOCK_SH)
        _HELD[path] = fd
    meta = _read(layers, key)
    now = time.time()
    if meta.size_bytes is UNSET:
        meta.size_bytes = tree_size(layers / key)
        meta.created = min(now, os.stat(path).st_mtime)  # the lock: made with the layer
        meta.parent = made_on
        meta.dockerfile, meta.step = made_by or (None, None)
    meta.last_used = now
    if meta.images is UNSET:
        meta.images = []
    if image_of is not None and image_of not in meta.images:
        meta.images.append(image_of)
    _write(layers, key, meta)


def _given(value: T | UnsetType, default: D) -> T | D:
    return default if isinstance(value, UnsetType) else value


def _read(layers: Path, key: str) -> LayerMeta:
    """``key``'s record; an empty one where there is none or it cannot be read."""
    try:
        with open(layers / f"{key}.json", "rb") as f:
            return decode(f.read(), LayerMeta)
    except (OSError, msgspec.DecodeError):
        return LayerMeta()


def _write(layers: Path, key: str, meta: LayerMeta) -> None:
    tmp = layers / f"{key}.json.{os.getpid()}.tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(to_json(meta), f, sort_keys=True)
    os.replace(tmp, layers / f"{key}.json")


# -- listing and pruning --------------------------------------------------------------


def layers_dir(cache: Path) -> Path | None:
    """``cache``/layers, checked: None where there is none yet; ConfigError where it or
    the cache is a link, not a directory, or another user's."""
    for path in (cache, cache / "layers"):
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            return None
        if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode):
            raise ConfigError(f"{path}: not a directory of its own (a link?); refusing to use it")
        if st.st_uid != os.geteuid():
            raise ConfigError(f"{path}: belongs to another user; refusing to use it")
    return cache / "layers"


def list_layers(cache: Path) -> list[Layer]:
    """Every complete layer in ``cache``, most recently used first."""
    layers = layers_dir(cache)
    if layers is None:
        return []
    found = []
    for entry in os.scandir(layers):
        if not KEY.fullmatch(entry.name) or not entry.is_dir(follow_symlinks=False):
            continue
        meta = _read(layers, entry.name)
        st = entry.stat(follow_symlinks=False)
        size = meta.size_bytes
        found.append(
            Layer(
                id=entry.name,
                size_bytes=size if isinstance(size, int) else tree_size(Path(entry.path)),
                created=_given(meta.created, st.st_mtime),
                last_used=_given(meta.last_used, st.st_mtime),
                parent=_given(meta.parent, None),
                dockerfile=_given(meta.dockerfile, None),
                step=_given(meta.step, None),
                images=list(_given(meta.images, [])),
                in_use=_locked(layers / f"{entry.name}.lock"),
            )
        )
    return sorted(found, key=lambda layer: -(layer.last_used or 0))


@dataclass
class PrunedLayers:
    removed: list[Layer]
    kept: list[Layer]
    in_use: list[Layer]  # chosen, but in use: left
    leftovers: list[str]  # of interrupted builds, removed

    @property
    def freed_bytes(self) -> int:
        return sum(layer.size_bytes for layer in self.removed)


def prune(
    cache: Path,
    *,
    older_than: float | None = None,
    keep_bytes: int | None = None,
    everything: bool = False,
    dry_run: bool = False,
    now: float | None = None,
    log: Callable[[str], None] = lambda _: None,
) -> PrunedLayers:
    """Remove the least recently used layers that no kept image needs (its own layer and
    those it was built on). Images are kept, most recently used first, while each was used
    within ``older_than`` seconds and all they need fits in ``keep_bytes``; ``everything``
    keeps none. A layer in use is never removed. ``dry_run``: say, remove nothing."""
    layers = layers_dir(cache)
    if layers is None:
        return PrunedLayers([], [], [], [])
    now = time.time() if now is None else now
    with open(layers / PRUNE_LOCK, "a") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            log(f"{layers}: waiting for the builds under way to finish")
            fcntl.flock(lock, fcntl.LOCK_EX)
        found = {layer.id: layer for layer in list_layers(cache)}
        kept = _kept(found, older_than, keep_bytes, everything, now)
        chosen = sorted(
            (layer for key, layer in found.items() if key not in kept),
            key=lambda layer: layer.last_used or 0,
        )
        removed: list[Layer] = []
        busy: list[Layer] = []
        for layer in chosen:
            if dry_run:
                (busy if layer.in_use else removed).append(layer)
            elif _remove_layer(layers, layer.id):
                removed.append(layer)
            else:
                busy.append(layer)
        leftovers = _leftovers(layers, remove=not dry_run)
    return PrunedLayers(removed, [found[k] for k in found if k in kept], busy, leftovers)


def _kept(
    found: dict[str, Layer],
    older_than: float | None,
    keep_bytes: int | None,
    everything: bool,
    now: float,
) -> set[str]:
    if everything:
        return set()
    parents = {layer.parent for layer in found.values()}
    images = [layer for layer in found.values() if layer.images or layer.id not in parents]
    kept: set[str] = set()
    for image in sorted(images, key=lambda layer: -(layer.last_used or 0)):
        if older_than is not None and now - (image.last_used or 0) > older_than:
            break  # and every image after it, used longer ago
        chain: set[str] = set()
        key: str | None = image.id
        while key is not None and key in found and key not in chain:
            chain.add(key)
            key = found[key].parent
        if keep_bytes is not None:
            size = sum(found[k].size_bytes for k in kept | chain)
            if size > keep_bytes:
                break
        kept |= chain
    return kept


def _locked(lock: Path) -> bool:
    """Whether another holder has the lock ``lock`` (``<key>.lock``: a process uses the
    layer; ``<key>.build``: a build is making it)."""
    try:
        fd = os.open(lock, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False


def _remove_layer(layers: Path, key: str) -> bool:
    """Remove layer ``key`` unless it is in use; whether it was removed."""
    lock = layers / f"{key}.lock"
    fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        aside = layers / f"{key}.pruning"
        if os.path.lexists(aside):
            remove_tree(aside)
        os.rename(layers / key, aside)  # never half a layer under its key
        remove_tree(aside)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(layers / f"{key}.json")
        os.unlink(lock)
        return True
    finally:
        os.close(fd)


def _leftovers(layers: Path, *, remove: bool) -> list[str]:
    """What interrupted builds left (``<key>.partial`` …) whose build is not running."""
    found = []
    for entry in os.scandir(layers):
        suffix = next((s for s in _LEFTOVERS if entry.name.endswith(s)), None)
        if suffix is None or not KEY.fullmatch(entry.name[: -len(suffix)]):
            continue
        if entry.is_symlink() or _locked(layers / f"{entry.name[: -len(suffix)]}.build"):
            continue
        found.append(entry.name)
        if remove:
            remove_tree(Path(entry.path))
    return found


def remove_tree(path: Path) -> None:
    """Remove the directory ``path`` and all in it, never following a link (a link is
    removed as a link); read-only directories in it are made writable first."""
    st = os.lstat(path)
    if not stat.S_ISDIR(st.st_mode):
        os.unlink(path)
        return
    if os.geteuid() != 0:
        # Its owner may not empty a directory it made read-only (root may). In a cache
        # only its owner may enter: os.walk never descends a link.
        os.chmod(path, 0o700)
        for top, dirs, _ in os.walk(path):
            for name in dirs:
                if stat.S_ISDIR(os.lstat(os.path.join(top, name)).st_mode):
                    os.chmod(os.path.join(top, name), 0o700)
    shutil.rmtree(path)


def tree_size(root: Path) -> int:
    """Bytes allocated to the tree ``root`` (each inode once), never through a link."""
    total, seen = 0, set()
    stack = [str(root)]
    while stack:
        try:
            with os.scandir(stack.pop()) as it:
                for entry in it:
                    st = entry.stat(follow_symlinks=False)
                    if (st.st_dev, st.st_ino) in seen:
                        continue
                    seen.add((st.st_dev, st.st_ino))
                    total += st.st_blocks * 512
                    if stat.S_ISDIR(st.st_mode):
                        stack.append(entry.path)
        except OSError:
            continue
    return total


def _iso(ts: float | None) -> str | None:
    if ts is None:
        return None
    from datetime import UTC, datetime

    return datetime.fromtimestamp(ts, UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


__all__ = [
    "Layer",
    "PrunedLayers",
    "building",
    "layers_dir",
    "list_layers",
    "prune",
    "remove_tree",
    "tree_size",
    "used",
]

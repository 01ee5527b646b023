"""Tasks a tenant uploads (``POST /v1/tasks``): a tar.gz in the Harbor layout.

An archive is untrusted input to the host, so it is unpacked under rules stricter than
``tar``'s: only regular files and directories (no links of either kind, no devices or
FIFOs), no absolute names and no ``..``, permission bits reduced to 0o755 / 0o644, at most
``MAX_MEMBERS`` entries and ``MAX_BYTES`` unpacked, all checked from the headers before a
byte is written. It is unpacked into a fresh directory beside its destination, checked as
``stayer tasks check`` checks a task's layout, and renamed into place, so a rejected
upload leaves nothing. Uploaded tasks live in ``$STAYER_HOME/uploads/<tenant>/<name>`` and
are the tenant's alone; they cannot turn on the network (``allow_internet``), which only
the operator's ``--tasks-dir`` may do. An upload is never replaced: runs resume from it.
"""

from __future__ import annotations

import io
import os
import posixpath
import shutil
import tarfile
import tempfile
import zlib
from pathlib import Path

from stayer.errors import ConfigError

MAX_MEMBERS = 5_000
MAX_BYTES = 100 * 1024 * 1024  # unpacked
MAX_ARCHIVE_BYTES = 20 * 1024 * 1024


def uploads_dir(home: Path, tenant: str) -> Path:
    return Path(home) / "uploads" / tenant


def _member_path(name: str) -> tuple[str, ...]:
    if "\\" in name or "\x00" in name:
        raise ConfigError(f"archive: {name!r}: not a portable file name")
    norm = posixpath.normpath(name)
    if norm.startswith("/") or norm == ".." or norm.startswith("../"):
        raise ConfigError(f"archive: {name!r}: outside the task")
    return tuple(p for p in norm.split("/") if p not in ("", "."))


def unpack_task(archive: bytes, home: Path, tenant: str, name: str) -> Path:
    """Check and unpack ``archive`` as the tenant's task ``name``; its directory."""
    if len(archive) > MAX_ARCHIVE_BYTES:
        raise ConfigError(f"archive: larger than {MAX_ARCHIVE_BYTES // 2**20} MiB")
    dest_root = uploads_dir(home, tenant)
    dest = dest_root / name
    if dest.exists():
        raise ConfigError(
            f"task {name!r}: already uploaded; uploads are never replaced (runs resume from them)"
        )
    try:
        with tarfile.open(fileobj=io.BytesIO(archive), mode="r:gz") as tar:
            members = _checked_members(tar)
            dest_root.mkdir(parents=True, exist_ok=True, mode=0o700)
            work = Path(tempfile.mkdtemp(prefix=f".{name}.", dir=dest_root))
            try:
                _unpack(tar, members, work)
                _check_task(work, name)
                os.rename(work, dest)
            except BaseException:
                shutil.rmtree(work, ignore_errors=True)
                raise
    except (tarfile.TarError, EOFError, zlib.error, OSError) as e:
        raise ConfigError(f"archive: not a readable tar.gz ({type(e).__name__})") from None
    return dest


def _checked_members(tar: tarfile.TarFile) -> list[tuple[tuple[str, ...], tarfile.TarInfo]]:
    """Every entry, from the headers alone: kinds, names, count and unpacked size."""
    members: list[tuple[tuple[str, ...], tarfile.TarInfo]] = []
    total = 0
    for m in tar:
        if len(members) >= MAX_MEMBERS:
            raise ConfigError(f"archive: more than {MAX_MEMBERS} entries")
        if not (m.isreg() or m.isdir()):
            raise ConfigError(
                f"archive: {m.name!r}: only regular files and directories are accepted"
            )
        total += m.size
        if total > MAX_BYTES:
            raise ConfigError(f"archive: more than {MAX_BYTES // 2**20} MiB unpacked")
        parts = _member_path(m.name)
        if parts:
            members.append((parts, m))
    # A single top directory holding the task (what `tar czf t.tgz mytask/` makes) is
    # stripped; otherwise the archive's root is the task.
    tops = {parts[0] for parts, _ in members}
    if len(tops) == 1 and all(len(p) > 1 or m.isdir() for p, m in members):
        members = [(p[1:], m) for p, m in members if len(p) > 1]
    return members


def _unpack(
    tar: tarfile.TarFile, members: list[tuple[tuple[str, ...], tarfile.TarInfo]], work: Path
) -> None:
    for parts, m in members:
        target = work.joinpath(*parts)
        if m.isdir():
            target.mkdir(parents=True, exist_ok=True, mode=0o755)
            continue
        target.parent.mkdir(parents=True, exist_ok=True, mode=0o755)
        source = tar.extractfile(m)
        assert source is not None
        # O_EXCL | O_NOFOLLOW: a name given twice, or anything already there, is refused.
        mode = 0o755 if m.mode & 0o111 else 0o644
        fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, mode)
        with os.fdopen(fd, "wb") as out:
            shutil.copyfileobj(source, out, 1 << 20)


def _check_task(work: Path, name: str) -> None:
    from stayer.eval.task import load_task

    try:
        task = load_task(work)
    except ConfigError as e:
        raise ConfigError(
            str(e).replace(str(work), name)
        ) from None  # no server paths in the answer
    if task.allow_internet:
        raise ConfigError(
            f"{name}/task.toml: environment.allow_internet: uploaded tasks run without network"
        )

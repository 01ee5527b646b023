"""Tasks a tenant uploads (``POST /v1/tasks``): a tar.gz in the Harbor layout, kept in the store.

An archive is untrusted input to the host, so it is unpacked under rules stricter than
``tar``'s: only regular files and directories (no links, devices, FIFOs or sparse files),
no absolute names and no ``..``, permission bits reduced to 0o755 / 0o644, at most
``MAX_MEMBERS`` entries, ``MAX_BYTES`` unpacked and ``MAX_EXTENDED_BYTES`` of long-name and
pax headers (read whole by ``tarfile``: unchecked, a 255 KiB archive took 1.6 GB), all
checked from the headers before a byte is written. The task.toml of an upload may not turn
on the network or run outside a sandbox (nor may its MCP servers: stdio in the sandbox
only), and every limit it sets is bounded (``LIMITS``).

The archive is a blob in the journal's store and ``stayer_uploads`` names it, so a worker
on any machine that shares the database runs it: it unpacks it (checked again) into
``$STAYER_HOME/uploads/<tenant>/<sha256>/<name>``, a cache. Uploads are the tenant's alone
and never replaced: runs resume from them.
"""

from __future__ import annotations

import contextlib
import io
import os
import posixpath
import shutil
import tarfile
import tempfile
import zlib
from pathlib import Path
from typing import Any

from stayer.errors import ConfigError
from stayer.journal.blobs import digest
from stayer.journal.sql import SqlStore, utc_now
from stayer.sqlite_tx import private_dir

MAX_MEMBERS = 5_000
MAX_BYTES = 100 * 1024 * 1024  # unpacked
MAX_ARCHIVE_BYTES = 20 * 1024 * 1024
MAX_EXTENDED_BYTES = 1024 * 1024  # GNU long names and pax headers, all of them together
MAX_EXTENDED_CHAIN = 8  # extended headers in front of one entry

#: What an uploaded task.toml may ask for, at most (the operator's --tasks-dir may ask for
#: more: up to stayer.settings' bounds). Harbor tasks ask for 2-4 GiB and 10-20 GiB.
LIMITS: dict[str, tuple[str, float]] = {
    "agent.timeout_sec": ("agent_timeout_s", 24 * 3600.0),
    "verifier.timeout_sec": ("verifier_timeout_s", 4 * 3600.0),
    "environment.memory_mb": ("memory_mb", 16 * 1024),
    "environment.storage_mb": ("storage_mb", 32 * 1024),
}
_EXTENDED = (
    tarfile.GNUTYPE_LONGNAME,
    tarfile.GNUTYPE_LONGLINK,
    tarfile.XHDTYPE,
    tarfile.XGLTYPE,
    tarfile.SOLARIS_XHDTYPE,
)


class _Info(tarfile.TarInfo):
    """A header whose long-name or pax data is bounded before ``tarfile`` reads it whole."""

    def _proc_member(self, tar: Any) -> Any:  # noqa: ANN401 - tarfile's own hook
        if self.type in _EXTENDED:
            tar.extended_bytes += self.size
            tar.chain += 1
            if tar.extended_bytes > MAX_EXTENDED_BYTES:
                raise ConfigError(
                    f"archive: more than {MAX_EXTENDED_BYTES // 1024} KiB of long-name and "
                    "pax headers"
                )
            if tar.chain > MAX_EXTENDED_CHAIN:
                raise ConfigError(
                    f"archive: more than {MAX_EXTENDED_CHAIN} extended headers before one entry"
                )
        elif self.type == tarfile.GNUTYPE_SPARSE:
            raise ConfigError(
                f"archive: {self.name!r}: only regular files and directories are accepted"
            )
        else:
            tar.chain = 0
        return super()._proc_member(tar)  # type: ignore[misc]


class _Tar(tarfile.TarFile):
    tarinfo = _Info
    extended_bytes = 0
    chain = 0


def uploads_dir(home: Path, tenant: str) -> Path:
    """Where this machine keeps its unpacked copies of the tenant's uploads (a cache)."""
    return Path(home) / "uploads" / tenant


def _member_path(name: str) -> tuple[str, ...]:
    if "\\" in name or "\x00" in name:
        raise ConfigError(f"archive: {name!r}: not a portable file name")
    norm = posixpath.normpath(name)
    if norm.startswith("/") or norm == ".." or norm.startswith("../"):
        raise ConfigError(f"archive: {name!r}: outside the task")
    return tuple(p for p in norm.split("/") if p not in ("", "."))


def unpack_task(archive: bytes, root: Path, name: str) -> Path:
    """Check and unpack ``archive`` as the task ``root/name`` (which must not exist); its
    directory. A rejected archive leaves nothing."""
    if len(archive) > MAX_ARCHIVE_BYTES:
        raise ConfigError(f"archive: larger than {MAX_ARCHIVE_BYTES // 2**20} MiB")
    dest = root / name
    try:
        with _Tar.open(fileobj=io.BytesIO(archive), mode="r:gz") as tar:
            members = _checked_members(tar)
            root.mkdir(parents=True, exist_ok=True, mode=0o700)
            work = Path(tempfile.mkdtemp(prefix=f".{name}.", dir=root))
            try:
                _unpack(tar, members, work)
                check_task(work, name)
                os.rename(work, dest)
            except BaseException:
                shutil.rmtree(work, ignore_errors=True)
                raise
    except (tarfile.TarError, EOFError, zlib.error, OSError, RecursionError) as e:
        raise ConfigError(f"archive: not a readable tar.gz ({type(e).__name__})") from None
    return dest


def _checked_members(tar: tarfile.TarFile) -> list[tuple[tuple[str, ...], tarfile.TarInfo]]:
    """Every entry, from the headers alone: kinds, names, count and unpacked size."""
    members: list[tuple[tuple[str, ...], tarfile.TarInfo]] = []
    total = 0
    for m in tar:
        if len(members) >= MAX_MEMBERS:
            raise ConfigError(f"archive: more than {MAX_MEMBERS} entries")
        if not (m.isreg() or m.isdir()) or m.issparse():
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


def check_task(work: Path, name: str) -> None:
    """The task's layout as ``stayer tasks check`` checks it, and what an upload may ask."""
    from stayer.eval.task import load_task

    try:
        task = load_task(work)
    except ConfigError as e:
        raise ConfigError(
            str(e).replace(str(work), name)
        ) from None  # no server paths in the answer
    where = f"{name}/task.toml"
    if task.allow_internet:
        raise ConfigError(
            f"{where}: environment.allow_internet: uploaded tasks run without network"
        )
    if task.sandbox_kind == "local":
        raise ConfigError(f"{where}: environment.sandbox: uploaded tasks run in a sandbox")
    for server, mcp in task.mcp_servers.items():
        if mcp.where != "sandbox":  # a process on the host, or the host's network
            key = "trust" if mcp.url is None else "url"
            raise ConfigError(
                f"{where}: mcp.servers.{server}.{key}: an uploaded task's MCP servers run in "
                "its sandbox (an HTTP server goes in the run's mcp_servers)"
            )
    for key, (attr, most) in LIMITS.items():
        value = getattr(task, attr)
        if value is not None and value > most:
            raise ConfigError(
                f"{where}: {key}: {value:g} is above {most:g}, the most an uploaded task "
                "may ask for"
            )


class TaskUploads:
    """The tenants' uploads in the store ``store``, unpacked on demand under ``home``."""

    def __init__(self, store: SqlStore, home: Path) -> None:
        self.store, self.home = store, Path(home)

    def _address(self, tenant: str, name: str) -> str | None:
        rows = self.store._read(
            "SELECT archive FROM stayer_uploads WHERE tenant = ? AND name = ?", (tenant, name)
        )
        return str(rows[0][0]) if rows else None

    def add(self, tenant: str, name: str, archive: bytes) -> Path:
        """Check, keep and unpack the tenant's task ``name``; its directory here."""
        if self._address(tenant, name) is not None:
            raise ConfigError(
                f"task {name!r}: already uploaded; uploads are never replaced (runs resume from them)"
            )
        address = digest(archive)
        path = self._unpacked(tenant, name, address, archive)
        files = sum(1 for p in path.rglob("*") if p.is_file())
        self.store.put_blobs({address: archive})
        with self.store._tx() as cur:
            if cur.execute(
                f"SELECT 1 FROM stayer_uploads WHERE tenant = ? AND name = ?{self.store.LOCK_ROW}",
                (tenant, name),
            ).fetchone():
                raise ConfigError(
                    f"task {name!r}: already uploaded; uploads are never replaced (runs resume from them)"
                )
            cur.execute(
                "INSERT INTO stayer_uploads (tenant, name, archive, files, created_at) "
                "VALUES (?, ?, ?, ?, ?)",
                (tenant, name, address, files, utc_now()),
            )
        return path

    def names(self, tenant: str) -> list[str]:
        return [
            str(n)
            for (n,) in self.store._read(
                "SELECT name FROM stayer_uploads WHERE tenant = ? ORDER BY name", (tenant,)
            )
        ]

    def path(self, tenant: str, name: str) -> Path | None:
        """The tenant's upload ``name`` unpacked on this machine (from the store the first
        time), or None if the tenant has no such upload."""
        address = self._address(tenant, name)
        if address is None:
            return None
        return self._unpacked(tenant, name, address, None)

    def _unpacked(self, tenant: str, name: str, address: str, archive: bytes | None) -> Path:
        root = uploads_dir(self.home, tenant) / address
        if (root / name).is_dir():
            return root / name
        if archive is None:
            archive = self.store.get_blob(address)
        private_dir(self.home / "uploads")
        root.mkdir(parents=True, exist_ok=True, mode=0o700)
        try:
            return unpack_task(archive, root, name)
        except ConfigError:
            if (root / name).is_dir():  # another process here unpacked it meanwhile
                return root / name
            with contextlib.suppress(OSError):
                root.rmdir()
            raise

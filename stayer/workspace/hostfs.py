"""The host's access to trees the sandbox could write: never through a link, never into a
special file, never more than asked for.

Every host-side access to the workspace, ``/logs/verifier`` and what is snapshotted or
copied out of them goes through here (or :func:`stayer.workspace.tree.walk`): paths are
resolved one component at a time from a directory fd with ``O_NOFOLLOW``; files are
opened ``O_NONBLOCK`` and ``fstat``-ed first, and only regular files are read; reads are
capped; copies keep sparse files sparse and carry permission bits only
(:func:`plain_mode`): no setuid, setgid, sticky bit or device file reaches the host;
sockets are skipped, FIFOs re-created. docs/workspace.md lists the attacks this stops.
"""

from __future__ import annotations

import errno
import hashlib
import os
import shutil
import stat
from collections.abc import Collection
from pathlib import Path

from stayer.workspace.tree import MAX_DEPTH

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_CREATE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
_CHUNK = 1 << 20


class UnsafeFile(OSError):
    """A path the host refused to read: a link, not a regular file, hard-linked where that
    is not allowed, or larger than the caller's cap."""


def plain_mode(mode: int) -> int:
    """The permission bits that may be carried out of the sandbox: read, write, execute.
    Never setuid, setgid or sticky: a root-owned setuid copy on the host is a way in."""
    return mode & 0o777


def describe(mode: int) -> str:
    """What a non-regular file is, in words, for an error message."""
    for test, what in (
        (stat.S_ISLNK, "a symbolic link"),
        (stat.S_ISDIR, "a directory"),
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISSOCK, "a socket"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
    ):
        if test(mode):
            return what
    return "not a regular file"


def open_regular(
    name: str, dir_fd: int, *, single_link: bool = False
) -> tuple[int, os.stat_result]:
    """Open ``name`` in the directory ``dir_fd`` for reading, if it is a regular file (not
    a link to one): ``(fd, fstat)``. ``single_link`` also refuses a file with other hard
    links, which could be a host file linked into a directory the sandbox writes."""
    try:
        fd = os.open(name, _FILE_FLAGS, dir_fd=dir_fd)
    except OSError as e:
        if e.errno == errno.ELOOP:  # O_NOFOLLOW met a link
            raise UnsafeFile(errno.ELOOP, "is a symbolic link", name) from None
        if e.errno == errno.ENXIO:  # a socket, or a FIFO's write end with no reader
            raise UnsafeFile(errno.ENXIO, "not a regular file", name) from None
        raise
    st = os.fstat(fd)
    problem = None
    if not stat.S_ISREG(st.st_mode):
        problem = f"is {describe(st.st_mode)}"
    elif single_link and st.st_nlink > 1:
        problem = f"has {st.st_nlink} hard links"
    if problem is not None:
        os.close(fd)
        raise UnsafeFile(errno.EPERM, problem, name)
    return fd, st


def open_dir_beneath(root: str | Path, rel: str) -> int:
    """An fd of the directory ``rel`` under ``root`` (``""``: ``root`` itself), reached
    without following a link at any component. ``root`` is the caller's own path."""
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        for part in rel.split("/") if rel else ():
            if part in ("", ".", ".."):
                raise UnsafeFile(errno.EINVAL, "not a plain relative path", rel)
            try:
                child = os.open(part, _DIR_FLAGS, dir_fd=fd)
            except OSError as e:
                if e.errno in (errno.ELOOP, errno.ENOTDIR):
                    raise UnsafeFile(e.errno, "is not a directory (a link?)", rel) from None
                raise
            os.close(fd)
            fd = child
    except BaseException:
        os.close(fd)
        raise
    return fd


def read_regular(root: str | Path, rel: str, *, limit: int, single_link: bool = False) -> bytes:
    """The bytes of the regular file ``rel`` under ``root``, at most ``limit`` of them.

    Raises :class:`UnsafeFile` if any component is a link, the file is not a regular file
    (a FIFO is refused without blocking), it has other hard links (with ``single_link``),
    or it holds more than ``limit`` bytes; ``FileNotFoundError`` if it is not there."""
    parent, _, name = rel.rpartition("/")
    dir_fd = open_dir_beneath(root, parent)
    try:
        fd, st = open_regular(name, dir_fd, single_link=single_link)
    finally:
        os.close(dir_fd)
    try:
        if st.st_size > limit:
            raise UnsafeFile(errno.EFBIG, f"larger than {limit} bytes", rel)
        data = read_at_most(fd, limit + 1)
    finally:
        os.close(fd)
    if len(data) > limit:  # it grew after the fstat
        raise UnsafeFile(errno.EFBIG, f"larger than {limit} bytes", rel)
    return data


def read_at_most(fd: int, limit: int) -> bytes:
    """Up to ``limit`` bytes from ``fd``'s current offset (fewer only at end of file)."""
    parts: list[bytes] = []
    left = limit
    while left > 0 and (chunk := os.read(fd, min(left, _CHUNK))):
        parts.append(chunk)
        left -= len(chunk)
    return b"".join(parts)


def is_sparse(st: os.stat_result) -> bool:
    """Whether a regular file has fewer bytes allocated than its size says (holes)."""
    return st.st_blocks * 512 < st.st_size


def data_extents(fd: int, size: int, min_hole: int = 0) -> list[tuple[int, int]]:
    """``(offset, length)`` of the parts of the file ``fd`` that hold data, in order; the
    rest are holes, which read as zeros. Holes shorter than ``min_hole`` are counted as
    data (fewer, longer extents). Where the file system cannot say, the whole file."""
    extents: list[tuple[int, int]] = []
    offset = 0
    try:
        while offset < size:
            try:
                start = os.lseek(fd, offset, os.SEEK_DATA)
            except OSError as e:
                if e.errno == errno.ENXIO:  # only a hole from here to the end
                    break
                raise
            end = min(os.lseek(fd, start, os.SEEK_HOLE), size)
            if extents and start - (extents[-1][0] + extents[-1][1]) < min_hole:
                extents[-1] = (extents[-1][0], end - extents[-1][0])
            else:
                extents.append((start, end - start))
            offset = end
    except OSError:  # no SEEK_DATA here (EINVAL): treat it all as data
        return [(0, size)] if size else []
    return extents


def content_digest(fd: int, st: os.stat_result) -> bytes:
    """SHA-256 of a regular file's content, streamed; a sparse file is hashed as its data
    extents (offset, length, bytes) and size, so its holes are never read."""
    h = hashlib.sha256()
    if is_sparse(st):
        h.update(b"sparse %d\0" % st.st_size)
        extents = data_extents(fd, st.st_size)
    else:
        extents = [(0, st.st_size)]
    for offset, length in extents:
        if len(extents) > 1 or offset:
            h.update(b"%d+%d\0" % (offset, length))
        done = 0
        while done < length and (chunk := os.pread(fd, min(length - done, _CHUNK), offset + done)):
            h.update(chunk)
            done += len(chunk)
    return h.digest()


def tree_digest(root: str | Path) -> str:
    """SHA-256 (hex) of the regular files under ``root``: their relative names (any bytes)
    and contents. Links are left out, never followed."""
    root = Path(root)
    h = hashlib.sha256()
    for path in sorted(p for p in root.rglob("*") if p.is_file() and not p.is_symlink()):
        h.update(os.fsencode(path.relative_to(root)) + b"\0")
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        try:
            h.update(content_digest(fd, os.fstat(fd)))  # streamed; a sparse file's holes unread
        finally:
            os.close(fd)
    return h.hexdigest()


def copy_range(src: int, dst: int, length: int, src_offset: int, dst_offset: int) -> None:
    """Copy ``length`` bytes at ``src_offset`` of ``src`` to ``dst_offset`` of ``dst``: in
    the kernel where it can (sharing extents on file systems with reflinks), else by
    reading and writing. Stops early where ``src`` ends."""
    done = 0
    try:
        while done < length:
            n = os.copy_file_range(
                src, dst, min(length - done, 1 << 30), src_offset + done, dst_offset + done
            )
            if n == 0:
                return
            done += n
        return
    except OSError:
        pass
    while done < length and (chunk := os.pread(src, min(length - done, _CHUNK), src_offset + done)):
        pwrite_all(dst, chunk, dst_offset + done)
        done += len(chunk)


def pwrite_all(fd: int, data: bytes, offset: int) -> None:
    """Write all of ``data`` at ``offset`` of ``fd`` (the file offset is left alone)."""
    view = memoryview(data)
    while view:
        n = os.pwrite(fd, view, offset)
        view, offset = view[n:], offset + n


def copy_contents(src: int, dst: int, st: os.stat_result) -> None:
    """Make the empty file ``dst`` a copy of ``src`` (whose fstat is ``st``): holes stay
    holes, so a 1 TB sparse file costs what it holds, not 1 TB."""
    extents = data_extents(src, st.st_size) if is_sparse(st) else [(0, st.st_size)]
    for offset, length in extents:
        copy_range(src, dst, length, offset, offset)
    os.ftruncate(dst, st.st_size)


def copy_tree(src: str | Path, dst: str | Path, *, skip: Collection[str] = ()) -> None:
    """Copy the tree ``src`` into the directory ``dst`` (created if missing; what is there
    already is replaced where ``src`` has the same name), except the top-level names in
    ``skip``: regular files (content, permission bits, mtime; sparse stays sparse),
    directories, symlinks (the link, never its target) and FIFOs (created, never opened).
    Sockets and device files are not copied, nor setuid, setgid or sticky bits. Neither
    side is ever entered through a link."""
    os.makedirs(dst, exist_ok=True)
    src_fd = os.open(src, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        dst_fd = os.open(dst, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            _copy_dir(src_fd, dst_fd, skip, 0)
        finally:
            os.close(dst_fd)
    finally:
        os.close(src_fd)


def _copy_dir(src_fd: int, dst_fd: int, skip: Collection[str], depth: int) -> None:
    with os.scandir(src_fd) as it:
        entries = [(e.name, e.stat(follow_symlinks=False)) for e in it if e.name not in skip]
    for name, st in entries:
        mode = st.st_mode
        if stat.S_ISDIR(mode):
            if depth >= MAX_DEPTH:
                continue
            _make_dir(name, dst_fd)
            sub_src = os.open(name, _DIR_FLAGS, dir_fd=src_fd)
            try:
                sub_dst = os.open(name, _DIR_FLAGS, dir_fd=dst_fd)
                try:
                    _copy_dir(sub_src, sub_dst, (), depth + 1)
                    # Last: a read-only directory must be filled before it becomes one.
                    _copy_mode_and_times(sub_dst, st)
                finally:
                    os.close(sub_dst)
            finally:
                os.close(sub_src)
        elif stat.S_ISLNK(mode):
            target = os.readlink(name, dir_fd=src_fd)
            _clear(name, dst_fd)
            os.symlink(target, name, dir_fd=dst_fd)
        elif stat.S_ISREG(mode):
            fd, src_st = open_regular(name, src_fd)
            try:
                _clear(name, dst_fd)
                out = os.open(name, _CREATE_FLAGS, 0o600, dir_fd=dst_fd)
                try:
                    copy_contents(fd, out, src_st)
                    _copy_mode_and_times(out, src_st)
                finally:
                    os.close(out)
            finally:
                os.close(fd)
        elif stat.S_ISFIFO(mode):
            _clear(name, dst_fd)
            os.mkfifo(name, plain_mode(mode), dir_fd=dst_fd)
        # sockets and device files are not copied (module doc)


def _copy_mode_and_times(fd: int, st: os.stat_result) -> None:
    """Give the copy at ``fd`` the original's permissions (``plain_mode``) and times."""
    os.fchmod(fd, plain_mode(st.st_mode))
    os.utime(fd, ns=(st.st_atime_ns, st.st_mtime_ns))


def _make_dir(name: str, dst_fd: int) -> None:
    """A directory ``name`` in ``dst_fd``: kept if one is there, else made (replacing
    whatever else has the name)."""
    try:
        st = os.stat(name, dir_fd=dst_fd, follow_symlinks=False)
    except FileNotFoundError:
        os.mkdir(name, 0o700, dir_fd=dst_fd)
        return
    if not stat.S_ISDIR(st.st_mode):
        os.unlink(name, dir_fd=dst_fd)
        os.mkdir(name, 0o700, dir_fd=dst_fd)
    elif st.st_mode & 0o700 != 0o700:
        os.chmod(name, 0o700, dir_fd=dst_fd)  # a directory, just checked; not a link


def _clear(name: str, dst_fd: int) -> None:
    """Remove whatever ``dst_fd`` holds under ``name`` (a file, a link, a whole tree)."""
    try:
        os.unlink(name, dir_fd=dst_fd)
    except FileNotFoundError:
        return
    except IsADirectoryError:
        shutil.rmtree(name, dir_fd=dst_fd)
    except PermissionError:  # EPERM: Linux's answer to unlink() on a directory
        if not stat.S_ISDIR(os.stat(name, dir_fd=dst_fd, follow_symlinks=False).st_mode):
            raise
        shutil.rmtree(name, dir_fd=dst_fd)


__all__ = [
    "UnsafeFile",
    "content_digest",
    "copy_contents",
    "copy_tree",
    "data_extents",
    "describe",
    "is_sparse",
    "open_dir_beneath",
    "open_regular",
    "plain_mode",
    "pwrite_all",
    "read_at_most",
    "read_regular",
]

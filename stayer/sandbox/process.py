"""Run one command with a deadline, bounded output capture and resource limits.

:func:`run_command` is the one exec path: each sandbox kind (a command started for
itself: cold bwrap, docker, local; a bwrap sandbox started ahead; the persistent one)
only starts its command and hands back a :class:`Running` (our ends of its pipes, how to
wait for it and stop it); :func:`run_command` owns the deadline, the capture of stdout
and stderr (each kept to ``max_output_bytes``: its head and tail), stdin, the storage
watch, killing everything the command started and the result. Limits: ``RLIMIT_AS``,
``RLIMIT_FSIZE``, a pids cgroup per command (with the memory of its whole tree where a
memory cgroup can be made), applied from birth by :func:`born_in` or, for a child that
waits at a :class:`StartGate`, from here before it is released. docs/sandbox.md has
the reasons behind each.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
import os
import re
import resource
import signal
import subprocess
import time
import uuid
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from stayer.errors import ConfigError
from stayer.sandbox.base import ExecResult, Mount
from stayer.workspace.tree import disk_usage

log = logging.getLogger(__name__)

_CHUNK = 64 * 1024
# After the main process exits, how long to wait for the pipes to reach EOF before giving up
# on stragglers that escaped the process group (only possible for the local backend).
_DRAIN_GRACE_S = 1.0
# Longer than this, bash -c refuses the command (MAX_ARG_STRLEN): a sandbox that takes the
# command otherwise (started ahead, or kept) gives it one started for it, which reports that.
MAX_COMMAND_BYTES = 128 * 1024 - 1
# Where a shell started ahead of its command waits: the workspace, which lasts as long as
# its sandbox.
AHEAD_CWD = "/app"


def fits_ahead(cwd: str, text: bytes) -> bool:
    """Whether a shell started ahead in :data:`AHEAD_CWD` runs a command of ``text`` (its
    command, encoded) in ``cwd`` exactly as a sandbox started for it would: the same
    directory, and a text ``bash -c`` takes (no NUL, not too long)."""
    return cwd == AHEAD_CWD and b"\0" not in text and len(text) <= MAX_COMMAND_BYTES


@dataclass(frozen=True, slots=True)
class ProcessLimits:
    """Resource limits for one command; ``None`` means no limit."""

    memory_mb: int | None = None  # RLIMIT_AS of every process in the tree
    # The memory of the whole tree: a memory cgroup where one can be made, else RLIMIT_AS
    # (when memory_mb does not set it already).
    memory_cap_mb: int | None = None
    max_processes: int | None = None  # pids cgroup (or RLIMIT_NPROC as a fallback)
    max_file_mb: int | None = None  # RLIMIT_FSIZE: the largest file any process may write


@dataclass(frozen=True, slots=True)
class StorageLimit:
    """``path`` may hold at most ``max_mb`` MiB on disk; a command that grows it past that
    (or past what it already held, if it started over) is killed."""

    path: Path
    max_mb: int
    shown_as: str = "the workspace"  # how the command's own view names ``path`` (``/app``)


def file_size_cap(max_file_mb: int | None, storage_mb: int | None) -> int | None:
    """The ``max_file_mb`` to enforce: no single file may be larger than the space the
    workspace has in total, because the storage limit is only polled while the file-size
    limit stops a write the moment it passes."""
    sizes = [n for n in (max_file_mb, storage_mb) if n is not None]
    return min(sizes) if sizes else None


# A StorageLimit is polled no more often than every _STORAGE_POLL_MIN_S, and no more often
# than _STORAGE_POLL_COST_FACTOR times what one walk took, so that watching a large tree
# costs under a tenth of one core while a small one is watched closely.
_STORAGE_POLL_MIN_S = 0.02
_STORAGE_POLL_COST_FACTOR = 10


class _Capture:
    """Keeps the head and the tail of a byte stream, counting what fell in between."""

    def __init__(self, limit: int) -> None:
        self.head_limit = limit // 2
        self.tail_limit = limit - self.head_limit
        self.head = bytearray()
        self.tail = bytearray()
        self.dropped = 0

    def feed(self, chunk: bytes) -> None:
        room = self.head_limit - len(self.head)
        if room > 0:
            self.head += chunk[:room]
            chunk = chunk[room:]
        if not chunk:
            return
        self.tail += chunk
        excess = len(self.tail) - self.tail_limit
        if excess > 0:
            # bytearray deletes from the front in O(1) amortised (it moves its start offset).
            del self.tail[:excess]
            self.dropped += excess

    def text(self) -> str:
        if not self.dropped:
            return (self.head + self.tail).decode("utf-8", errors="replace")
        return (
            self.head.decode("utf-8", errors="replace")
            + f"\n[... {self.dropped} bytes dropped ...]\n"
            + self.tail.decode("utf-8", errors="replace")
        )


def _pids_cgroup_candidate(controller: str = "pids") -> Path | None:
    """The directory of this process's own cgroup in a hierarchy that has ``controller``
    (its v1 mount or the v2 unified mount), or None."""
    try:
        mountinfo = Path("/proc/self/mountinfo").read_text().splitlines()
        own = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return None
    v1: tuple[str, str] | None = None
    v2: tuple[str, str] | None = None
    for line in mountinfo:
        left, _, right = line.partition(" - ")
        fields, rfields = left.split(), right.split()
        if len(fields) < 5 or len(rfields) < 3:
            continue
        root, mount_point, fstype, opts = fields[3], fields[4], rfields[0], rfields[2]
        if fstype == "cgroup" and controller in opts.split(","):
            v1 = (root, mount_point)
        elif fstype == "cgroup2" and v2 is None:
            v2 = (root, mount_point)
    for line in own:
        hier, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        if v1 and controller in controllers.split(","):
            root, mount_point = v1
        elif v2 and hier == "0" and controllers == "":
            root, mount_point = v2
        else:
            continue
        rel = os.path.relpath(path, root) if path.startswith(root) else "."
        candidate = Path(mount_point) / rel
        if candidate.is_dir():
            return candidate.resolve()
    return None


@functools.cache
def pids_cgroup_parent() -> Path | None:
    """Where per-command pids cgroups can be created, probed once by really creating one.

    Returns None when there is no pids controller, no permission (rootless without
    delegation), or cgroup v2 refuses to enable the controller for children (the parent has
    processes of its own).
    """
    parent = _pids_cgroup_candidate()
    if parent is None:
        return None
    remove_orphans(parent)
    return parent if _takes(parent, "pids", "pids.max", "16") else None


@functools.cache
def memory_cgroup_parent() -> tuple[Path, bool] | None:
    """Where per-command memory cgroups can be made, probed once by really making one:
    ``(directory, separate)``. Not ``separate`` (cgroup v2): the command's pids cgroup
    under :func:`pids_cgroup_parent` takes ``memory.max`` itself; ``separate`` (cgroup v1):
    the command also joins a cgroup of its own in the memory hierarchy. None where neither
    can be made (no controller, no permission): memory caps are then ``RLIMIT_AS``."""
    pids = pids_cgroup_parent()
    v2 = pids is not None and (pids / "cgroup.controllers").exists()
    parent = pids if v2 else _pids_cgroup_candidate("memory")
    if parent is None or (not v2 and (parent / "cgroup.controllers").exists()):
        return None
    if not v2:
        remove_orphans(parent)
    knob = "memory.max" if v2 else "memory.limit_in_bytes"
    return (parent, not v2) if _takes(parent, "memory", knob, str(64 * 2**20)) else None


def _takes(parent: Path, controller: str, knob: str, value: str) -> bool:
    """Whether a cgroup made under ``parent`` takes ``value`` in its file ``knob``: a probe
    made and removed, with ``controller`` enabled for the children of ``parent`` first
    where the probe lacks the file (cgroup v2)."""
    probe = parent / f"stayer-probe-{_owner_tag()}-{uuid.uuid4().hex[:8]}"
    try:
        probe.mkdir()
    except OSError:
        return False
    try:
        if not (probe / knob).exists():
            with contextlib.suppress(OSError):
                (parent / "cgroup.subtree_control").write_text(f"+{controller}")
        (probe / knob).write_text(value)
        return True
    except OSError:
        return False
    finally:
        with contextlib.suppress(OSError):
            probe.rmdir()


def _read_limit_mb(path: Path) -> int | None:
    try:
        value = int(path.read_text().strip())
    except (OSError, ValueError):  # "max", or nothing there
        return None
    return value // 2**20 if 0 < value < 2**62 else None


@functools.cache
def host_memory_mb() -> int:
    """The memory stayer has here, MiB: the host's (``MemTotal``), or less where stayer's
    own memory cgroup (a container's limit) says so."""
    total = 0
    with contextlib.suppress(OSError, ValueError, IndexError):
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                total = int(line.split()[1]) // 1024
    if total <= 0:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 2**20
    own = _pids_cgroup_candidate("memory")
    if own is not None:
        for name in ("memory.max", "memory.limit_in_bytes"):
            limit = _read_limit_mb(own / name)
            if limit is not None:
                total = min(total, limit)
    return max(total, 1)


# Each sandboxed command may use this share of :func:`host_memory_mb` unless told otherwise
# (--memory-mb, task.toml's [environment] memory_mb): a runaway command fails alone, long
# before the host, or stayer itself, is out of memory.
DEFAULT_MEMORY_SHARE = 0.5
_MIN_DEFAULT_MEMORY_MB = 256


def default_memory_mb() -> int:
    """The memory cap of a sandboxed command that sets none, MiB."""
    return max(_MIN_DEFAULT_MEMORY_MB, int(host_memory_mb() * DEFAULT_MEMORY_SHARE))


def memory_enforcement() -> str:
    """How a command's memory cap is enforced here: ``cgroup v1``, ``cgroup v2`` (the
    command's whole tree) or ``RLIMIT_AS`` (each process: no memory cgroup can be made)."""
    found = memory_cgroup_parent()
    return "RLIMIT_AS" if found is None else f"cgroup v{1 if found[1] else 2}"


def _owner_tag() -> str:
    """What a cgroup's name says of the process that made it: its pid, and its pid
    namespace (so that a pid is never read in another namespace's sense)."""
    return f"{os.getpid()}.{os.stat('/proc/self/ns/pid').st_ino}"


_OWNED = re.compile(r"stayer-(?:probe-)?(\d+)\.(\d+)-[0-9a-f]+")


def remove_orphans(parent: Path) -> None:
    """Remove the cgroups under ``parent`` that stayer processes of this pid namespace made
    and left when they were killed, with what is still in them: a sandbox that was starting
    then waits there for good (bwrap killed before it wrote its child's uid map)."""
    ns = os.stat("/proc/self/ns/pid").st_ino
    try:
        entries = list(os.scandir(parent))
    except OSError:
        return
    for entry in entries:
        m = _OWNED.fullmatch(entry.name)
        if m is None or int(m.group(2)) != ns or not entry.is_dir(follow_symlinks=False):
            continue
        try:
            os.kill(int(m.group(1)), 0)
            continue  # its maker lives (or another process has its pid: left alone)
        except ProcessLookupError:
            pass
        except PermissionError:
            continue
        log.info("removing cgroup %s, left by a process that is gone", entry.path)
        _PidsCgroup(Path(entry.path)).remove_now()


class _PidsCgroup:
    """One cgroup per command: caps the number of tasks, and kills every leftover at the end."""

    def __init__(self, path: Path, memory: Path | None = None) -> None:
        self.path = path
        # Where the memory is capped: ``path`` itself (cgroup v2), a cgroup of the v1
        # memory hierarchy, or None (then RLIMIT_AS: see _rlimits).
        self.memory = memory

    @classmethod
    def create(
        cls, parent: Path, max_processes: int | None, memory_mb: int | None = None
    ) -> _PidsCgroup:
        """A new cgroup under ``parent``, named after this process (:func:`remove_orphans`),
        with ``memory_mb`` for the whole tree where a memory cgroup can be made."""
        path = parent / f"stayer-{_owner_tag()}-{uuid.uuid4().hex[:12]}"
        path.mkdir()
        try:
            (path / "pids.max").write_text("max" if max_processes is None else str(max_processes))
        except OSError:
            path.rmdir()
            raise
        made = cls(path)
        if memory_mb is not None and (found := memory_cgroup_parent()) is not None:
            try:
                made.memory = _memory_cgroup(path, found, memory_mb)
            except OSError as e:
                log.warning("could not cap memory with a cgroup (RLIMIT_AS instead): %s", e)
        return made

    def kill_all(self) -> None:
        kill_file = self.path / "cgroup.kill"  # cgroup v2, Linux >= 5.14
        if kill_file.exists():
            with contextlib.suppress(OSError):
                kill_file.write_text("1")
                return
        for _ in range(100):  # v1: a forking loop may add tasks while we kill; retry
            try:
                pids = [int(p) for p in (self.path / "cgroup.procs").read_text().split()]
            except OSError:
                return
            if not pids:
                return
            for pid in pids:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)

    async def remove(self) -> None:
        """Kill what is left in it and remove it, in a thread: removing a cgroup may wait
        in the kernel for milliseconds (behind another process's move into a cgroup), and
        the event loop runs other commands meanwhile."""
        await asyncio.to_thread(self.remove_now)

    def remove_now(self) -> None:
        """:meth:`remove`, blocking."""
        self._remove_pids()
        if self.memory is not None and self.memory != self.path:
            # Its tasks were the pids cgroup's, all gone by now (their charges may linger).
            for pause in (0.0, 0.001, 0.01, *[0.05] * 40):
                time.sleep(pause)
                try:
                    self.memory.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    continue
            else:
                log.warning("could not remove cgroup %s", self.memory)

    def _remove_pids(self) -> None:
        self.kill_all()
        # Killed tasks leave the cgroup asynchronously, most within a millisecond: wait
        # short first, then longer (about 2 s in all).
        for pause in (0.0002, 0.0005, 0.001, 0.002, 0.005, *[0.01] * 200):
            try:
                self.path.rmdir()
                return
            except FileNotFoundError:
                return
            except OSError:
                time.sleep(pause)
                self.kill_all()
        log.warning("could not remove cgroup %s", self.path)


def _memory_cgroup(path: Path, found: tuple[Path, bool], memory_mb: int) -> Path:
    """Cap the memory of the tree in the pids cgroup ``path`` at ``memory_mb``, no swap:
    in ``path`` itself (v2) or in a v1 memory cgroup of the same name, returned."""
    parent, separate = found
    limit = str(int(memory_mb) * 2**20)
    if not separate:
        (path / "memory.max").write_text(limit)
        with contextlib.suppress(OSError):  # no swap accounting: nothing to swap to anyway
            (path / "memory.swap.max").write_text("0")
        return path
    memory = parent / path.name
    memory.mkdir()
    try:
        (memory / "memory.limit_in_bytes").write_text(limit)
        if (memory / "memory.memsw.limit_in_bytes").exists():
            (memory / "memory.memsw.limit_in_bytes").write_text(limit)
    except OSError:
        memory.rmdir()
        raise
    return memory


_warned_nproc = False


def _rlimits(limits: ProcessLimits, cgroup: _PidsCgroup | None) -> list[tuple[int, int]]:
    """The (``RLIMIT_*``, value) pairs that enforce ``limits``, soft = hard."""
    global _warned_nproc
    out = []
    address_space = limits.memory_mb
    if address_space is None and (cgroup is None or cgroup.memory is None):
        address_space = limits.memory_cap_mb  # no cgroup to cap the tree: each process
    if address_space is not None:
        out.append((resource.RLIMIT_AS, int(address_space) * 2**20))
    if limits.max_file_mb is not None:
        out.append((resource.RLIMIT_FSIZE, int(limits.max_file_mb) * 2**20))
    if limits.max_processes is not None and cgroup is None:
        out.append((resource.RLIMIT_NPROC, int(limits.max_processes)))
        if os.geteuid() == 0 and not _warned_nproc:
            _warned_nproc = True
            log.warning(
                "max_processes is not enforced: running as root and no pids cgroup could "
                "be created (RLIMIT_NPROC does not apply to root)"
            )
    return out


# bash's ulimit flag and unit (bytes per unit) of each rlimit born_in's shell sets
_ULIMIT = {
    resource.RLIMIT_AS: ("-v", 1024),
    resource.RLIMIT_FSIZE: ("-f", 1024),
    resource.RLIMIT_NPROC: ("-u", 1),
}


def born_in(
    cgroup: _PidsCgroup | None,
    argv: list[str],
    limits: ProcessLimits = ProcessLimits(),  # noqa: B008
) -> list[str]:
    """``argv`` started by a shell that first moves itself into ``cgroup`` and applies the
    rlimits of ``limits`` to itself, then execs it (``argv`` itself when there is nothing to
    do). So every process it starts is in the cgroup from birth, and killing the cgroup
    kills them all. Moved from here after it started, a process bwrap cloned meanwhile
    stayed out: if bwrap was killed then (stayer killed as a sandbox started), its child
    waited forever for the uid map bwrap would have written. Moving a process also waits
    for the kernel (milliseconds on a busy machine): here the shell waits, not the caller."""
    join = [f"echo $$ > '{cgroup.path}/cgroup.procs'"] if cgroup is not None else []
    if cgroup is not None and cgroup.memory is not None and cgroup.memory != cgroup.path:
        join.append(f"echo $$ > '{cgroup.memory}/cgroup.procs'")
    ulimits = [
        f"ulimit {_ULIMIT[which][0]} {value // _ULIMIT[which][1]}"  # sets soft and hard
        for which, value in _rlimits(limits, cgroup)
    ]
    if not join and not ulimits:
        return argv
    shell = "/bin/bash" if ulimits else "/bin/sh"  # bash for ulimit -u; sh starts faster
    script = "\n".join(["set -e", *join, *ulimits, 'exec "$@"'])
    return [shell, "-c", script, "stayer-limits", *argv]


class StartGate:
    """Pipes to a child that holds still before starting its command (see the module
    docstring). The child reports ``{"child-pid": N}`` on ``child_report`` and closes it
    (bwrap's ``--info-fd``), then waits for a byte on ``child_release`` (``--block-fd``).
    ``report`` and ``release`` are the caller's ends, to close once the child is gone: the
    child must never see ``release`` closed while it may still run, since bwrap reads end
    of file as a release too. :func:`start_child` closes the child's ends once started.
    Each end is closed once only (a descriptor number closed twice may by then be another
    thread's)."""

    __slots__ = ("report", "release", "child_report", "child_release")

    def __init__(self) -> None:
        self.report, self.child_report = os.pipe()
        self.child_release, self.release = os.pipe()

    def close_child_ends(self) -> None:
        for name in ("child_report", "child_release"):
            self._close(name)

    def close(self) -> None:
        for name in ("report", "release", "child_report", "child_release"):
            self._close(name)

    def _close(self, name: str) -> None:
        fd = getattr(self, name)
        if fd >= 0:
            setattr(self, name, -1)
            os.close(fd)


def _set_once(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


async def wait_fd(fd: int, writable: bool = False) -> None:
    """Until ``fd`` is readable (or ``writable``), in the running event loop."""
    loop = asyncio.get_running_loop()
    ready = loop.create_future()
    add, remove = (
        (loop.add_writer, loop.remove_writer) if writable else (loop.add_reader, loop.remove_reader)
    )
    add(fd, _set_once, ready)
    try:
        await ready
    finally:
        remove(fd)


async def read_fd(fd: int, sink: Callable[[bytes], object]) -> None:
    """Read ``fd`` (a pipe of ours) to its end, each chunk into ``sink``."""
    os.set_blocking(fd, False)
    while True:
        try:
            chunk = os.read(fd, _CHUNK)
        except BlockingIOError:
            await wait_fd(fd)
            continue
        if not chunk:
            return
        sink(chunk)


async def feed_fd(ours: list[int], fd: int, data: bytes) -> None:
    """Write ``data`` to the command's stdin (``fd``, our write end), then close it and
    take it off ``ours``: it is the last write end, and the command reads to its end.
    The command may exit, or close stdin, without reading it all: that is its business."""
    os.set_blocking(fd, False)
    view = memoryview(data)
    try:
        while view:
            try:
                view = view[os.write(fd, view[:_CHUNK]) :]
            except BlockingIOError:
                await wait_fd(fd, writable=True)
    except (BrokenPipeError, ConnectionResetError):
        pass
    ours.remove(fd)
    os.close(fd)


async def _confine_and_release(
    gate: StartGate, limits: ProcessLimits, cgroup: _PidsCgroup | None
) -> bool:
    """Apply the rlimits of ``limits`` to the gated child (in ``cgroup`` since birth:
    :func:`born_in`), then release it. False when that could not be done (the child died,
    or reported nothing usable): the caller kills it, never releases it."""
    report: list[bytes] = []
    try:
        await read_fd(gate.report, report.append)
        _confine_inner(gate, b"".join(report), limits, cgroup)
    except (OSError, ValueError, KeyError, TypeError) as e:
        log.warning("could not apply limits to a sandboxed command: %s", e)
        return False
    return True


def confine_and_release_now(
    gate: StartGate, limits: ProcessLimits, cgroup: _PidsCgroup | None
) -> bool:
    """:func:`_confine_and_release`, blocking, for a thread of its own (no event loop: its
    time is in system calls, which let the caller's thread run meanwhile)."""
    try:
        with open(gate.report, "rb", closefd=False) as report:
            _confine_inner(gate, report.read(), limits, cgroup)
    except (OSError, ValueError, KeyError, TypeError) as e:
        log.warning("could not apply limits to a sandboxed command: %s", e)
        return False
    return True


def _confine_inner(
    gate: StartGate, report: bytes, limits: ProcessLimits, cgroup: _PidsCgroup | None
) -> None:
    """The rlimits on the child that bwrap's ``report`` names, then released."""
    inner = int(json.loads(report)["child-pid"])
    for which, value in _rlimits(limits, cgroup):
        resource.prlimit(inner, which, (value, value))
    os.write(gate.release, b"x")


async def watch_storage(
    exited: asyncio.Future[bool], path: Path, cap_bytes: int
) -> tuple[bool, int | None]:
    """Poll the size of ``path`` until ``exited`` (True: the command exited in time) is
    done: ``(timed_out, bytes used)``, the latter only if the tree grew past ``cap_bytes``
    (the caller then kills the command as on a timeout). ``exited`` is cancelled if it is
    still running when this returns."""
    try:
        while True:
            t0 = time.monotonic()
            used = await asyncio.to_thread(disk_usage, path)
            if used > cap_bytes:
                return False, used
            pause = max(_STORAGE_POLL_MIN_S, _STORAGE_POLL_COST_FACTOR * (time.monotonic() - t0))
            done, _ = await asyncio.wait({exited}, timeout=pause)
            if done:
                return not exited.result(), None
    finally:
        exited.cancel()


async def storage_baseline(storage: StorageLimit | None) -> int:
    """What the command may grow ``storage`` to: a tree that is already over the limit may
    still shrink (``rm``), so only growth beyond the larger of the two is stopped."""
    if storage is None:
        return 0
    limit = storage.max_mb * 2**20
    used = await asyncio.to_thread(disk_usage, storage.path)
    if used <= limit:
        return limit
    return max(limit, await asyncio.to_thread(_written_back_usage, storage.path))


def _written_back_usage(path: Path) -> int:
    """The size of ``path`` once the data written to it has reached the disk. While ext4
    writes data back it moves the blocks from its count of reserved blocks to the file's,
    one after the other, so a walk meanwhile can count less than is there. Growth
    measured from such a baseline stops a command that only deletes files: seen once in a
    loaded run, ``rm`` stopped at 159 MiB right after a command that wrote that much."""
    os.sync()
    return disk_usage(path)


async def storage_verdict(
    storage: StorageLimit | None, cap: int, stopped_at: int | None, code: int, stderr: str
) -> tuple[int, str]:
    """The exit code and stderr of a command once it is over: with a note, and failed, if
    it broke the storage limit (``stopped_at``: the size at which the watch stopped it;
    else measured once more now, as it may have finished between two polls)."""
    if storage is None:
        return code, stderr
    stopped = stopped_at is not None
    if not stopped and (used := await asyncio.to_thread(disk_usage, storage.path)) > cap:
        stopped_at = used
    if stopped_at is None:
        return code, stderr
    return code or 1, stderr + (  # a command that broke a limit did not succeed
        f"\n[storage limit: {storage.shown_as} holds {stopped_at / 2**20:.0f} MiB, "
        f"over its limit of {storage.max_mb} MiB; "
        f"{'the command was stopped' if stopped else 'the command went over it'}. "
        "Delete files to free space.]\n"
    )


def _kill_group(pgid: int) -> None:
    # The group may outlive its (already reaped) leader while children remain in it; its id
    # cannot be reused by a new process group while any member is alive.
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


def shell_code(returncode: int) -> int:
    """A process's exit status as a shell reports it: 128 + N when signal N killed it."""
    return 128 - returncode if returncode < 0 else returncode


# --------------------------------------------------------------------------------------
# the one exec path


class Running(Protocol):
    """A command that a sandbox kind has started: our ends of its pipes (``stdin`` only
    when it reads a pipe; :func:`run_command` closes them) and how to wait for it and
    stop it. Each kind only starts its command; :func:`run_command` does the rest."""

    stdout: int
    stderr: int
    stdin: int | None
    note: str  # for its stderr: why it ended, where the kind knows more than its status

    async def wait(self) -> int:
        """Its exit code once it is over, as a shell reports it."""
        ...

    def stop(self) -> None:
        """Kill what is left of it: nothing it started may outlive it. Called whether it
        ended or not, perhaps twice."""

    def stragglers(self) -> bool:
        """Its output stayed open after it ended: kill what may hold it; whether to wait
        for that output once more."""
        ...

    async def close(self) -> None:
        """Let go of what it holds, once it is stopped."""


async def run_command(
    start: Callable[[], Awaitable[Running | None]],
    *,
    timeout: float,
    stdin: bytes | None,
    max_output_bytes: int,
    storage: StorageLimit | None,
) -> ExecResult | None:
    """Start a command (``start()``; None: it could not, nothing was started) and own it
    from there: its deadline, the bounded capture of its output, its stdin, the storage
    watch, killing all of it and its result. Never raises for the command's behaviour; a
    cancellation of the caller kills the command before it propagates."""
    cap = await storage_baseline(storage)
    out, err = _Capture(max_output_bytes), _Capture(max_output_bytes)
    began = time.monotonic()
    running = await start()
    if running is None:
        return None
    ours = [running.stdout, running.stderr]
    tasks = [
        asyncio.create_task(read_fd(running.stdout, out.feed)),
        asyncio.create_task(read_fd(running.stderr, err.feed)),
    ]
    if running.stdin is not None:
        if stdin is None:  # a pipe with nothing to read: at its end for the command
            os.close(running.stdin)
        else:
            ours.append(running.stdin)
            tasks.append(asyncio.create_task(feed_fd(ours, running.stdin, stdin)))
    waiting = asyncio.ensure_future(running.wait())
    used: int | None = None  # set when the storage limit was exceeded
    over = False
    try:
        in_time = asyncio.ensure_future(_done_within(waiting, max(timeout, 0.001)))
        if storage is None:
            timed_out = not await in_time
        else:
            timed_out, used = await watch_storage(in_time, storage.path, cap)
        running.stop()  # whether it finished or not: nothing it started may outlive it
        code = await waiting
        _done, pending = await asyncio.wait(tasks, timeout=_DRAIN_GRACE_S)
        if pending and running.stragglers():
            _done, pending = await asyncio.wait(pending, timeout=_DRAIN_GRACE_S)
        if pending:  # a straggler escaped the group and still holds a pipe open
            log.warning("a process a command started outlived it, holding its output")
        over = True
    finally:
        if not over:  # cancelled, or broken: killed before it propagates
            running.stop()
        for task in (*tasks, waiting):
            task.cancel()
        await asyncio.gather(*tasks, waiting, return_exceptions=True)
        for fd in ours:
            with contextlib.suppress(OSError):
                os.close(fd)
        await running.close()
    code, stderr = await storage_verdict(storage, cap, used, code, err.text() + running.note)
    return ExecResult(
        exit_code=code,
        stdout=out.text(),
        stderr=stderr,
        timed_out=timed_out,
        truncated=bool(out.dropped or err.dropped),
        duration_s=time.monotonic() - began,
    )


async def _done_within(future: asyncio.Future[int], timeout: float) -> bool:
    done, _ = await asyncio.wait({future}, timeout=timeout)
    return bool(done)


# --------------------------------------------------------------------------------------
# a command started for itself: cold bwrap, docker, local


class _ChildProtocol(asyncio.SubprocessProtocol):
    """``exited``: done when the child itself has exited, told by the child watcher (not
    when its pipes close: a background grandchild may hold them)."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.exited: asyncio.Future[None] = loop.create_future()

    def process_exited(self) -> None:
        _set_once(self.exited)


@dataclass(slots=True)
class Launch:
    """How one command starts, as a backend builds it: the argv (the command inside),
    the child's directory and environment, the limits to apply from here and, for a child
    that holds still before its command, its gate and the descriptors it inherits."""

    argv: list[str]
    cwd: str | None = None
    env: Mapping[str, str] | None = None
    limits: ProcessLimits = ProcessLimits()  # noqa: RUF009  (frozen dataclass: safe)
    pass_fds: Sequence[int] = ()
    gate: StartGate | None = None


def new_cgroup(limits: ProcessLimits) -> _PidsCgroup | None:
    """A pids cgroup for one command (or sandbox) wherever one can be made, limit or not:
    killing its members is the one way to also catch what left the process group."""
    if (parent := pids_cgroup_parent()) is None:
        return None
    try:
        return _PidsCgroup.create(parent, limits.max_processes, limits.memory_cap_mb)
    except OSError as e:
        log.warning("could not create pids cgroup under %s: %s", parent, e)
        return None


class _Child:
    """A command started for itself, in its own session and cgroup (:func:`start_child`)."""

    note = ""

    def __init__(
        self,
        transport: asyncio.SubprocessTransport,
        protocol: _ChildProtocol,
        launch: Launch,
        cgroup: _PidsCgroup | None,
        ours: list[int],
    ) -> None:
        self.transport, self.protocol, self.launch, self.cgroup = (
            transport,
            protocol,
            launch,
            cgroup,
        )
        self.pid = transport.get_pid()
        self.stdin = ours[0] if len(ours) == 3 else None
        self.stdout, self.stderr = ours[-2:]

    async def wait(self) -> int:
        gate = self.launch.gate
        if gate is not None and not await _confine_and_release(
            gate, self.launch.limits, self.cgroup
        ):
            self.stop()  # killed at the gate: the command never started
        await asyncio.wait({self.protocol.exited})
        code = self.transport.get_returncode()
        assert code is not None
        return shell_code(code)

    def stop(self) -> None:
        _kill_group(self.pid)
        if self.cgroup is not None:
            self.cgroup.kill_all()

    def stragglers(self) -> bool:
        return False

    async def close(self) -> None:
        if self.cgroup is not None:
            await self.cgroup.remove()
        self.transport.close()


async def start_child(launch: Launch, stdin: bool) -> _Child:
    """Start ``launch`` in its own session (so its own process group) and, where one can
    be made, a cgroup of its own from birth (:func:`born_in`), with pipes of ours for its
    output (and stdin, if ``stdin``). A gated child gets its limits when it waits; any
    other, from a shell prelude. Raises ``OSError`` only when it cannot start at all."""
    cgroup = new_cgroup(launch.limits)
    argv = born_in(cgroup, launch.argv, launch.limits if launch.gate is None else ProcessLimits())
    ours: list[int] = []
    theirs: list[int] = []
    # The caller's cancellation while asyncio starts the process: the start is let finish,
    # and then all of the process group is killed. Left to asyncio, the cancellation kills
    # the direct child only (bwrap's outer process), and the sandbox's own process, a
    # grandchild waiting at the gate, lived on (seen as a trial's time limit fired).
    cancelled: asyncio.CancelledError | None = None
    try:
        for _ in range(3 if stdin else 2):
            r, w = os.pipe()
            ours.append(r)
            theirs.append(w)
        if stdin:  # the first pipe is the command's stdin: it reads, we write
            ours[0], theirs[0] = theirs[0], ours[0]
        loop = asyncio.get_running_loop()
        spawn = asyncio.ensure_future(
            loop.subprocess_exec(
                lambda: _ChildProtocol(loop),
                *argv,
                stdin=theirs[0] if stdin else asyncio.subprocess.DEVNULL,
                stdout=theirs[-2],
                stderr=theirs[-1],
                cwd=launch.cwd,
                env=dict(launch.env) if launch.env is not None else None,
                start_new_session=True,  # own session and process group: kill the whole tree
                pass_fds=tuple(launch.pass_fds),
            )
        )
        try:
            transport, protocol = await asyncio.shield(spawn)
        except asyncio.CancelledError as e:
            cancelled = e
            transport, protocol = await spawn
    except BaseException:
        for fd in ours:
            os.close(fd)
        if cgroup is not None:
            await cgroup.remove()
        raise
    finally:
        for fd in theirs:
            os.close(fd)
        if launch.gate is not None:  # so that the report reads to its end if the child dies
            launch.gate.close_child_ends()
    child = _Child(transport, protocol, launch, cgroup, ours)
    if cancelled is not None:  # cancelled as it started: killed whole before propagating
        child.stop()
        await asyncio.wait({protocol.exited})
        for fd in ours:
            os.close(fd)
        await child.close()
        raise cancelled
    return child


async def run_process(
    argv: Sequence[str],
    *,
    timeout: float,
    stdin: bytes | None = None,
    cwd: str | None = None,
    env: Mapping[str, str] | None = None,
    max_output_bytes: int = 1_000_000,
    limits: ProcessLimits = ProcessLimits(),  # noqa: B008  (frozen dataclass: safe as a default)
    storage: StorageLimit | None = None,
    pass_fds: Sequence[int] = (),
    gate: StartGate | None = None,
) -> ExecResult:
    """Run ``argv`` to completion or until ``timeout`` seconds (:func:`run_command`). With
    a ``gate`` (whose child ends must be among ``pass_fds``) the limits are applied from
    here while the child waits at the gate; without one, by a shell prelude."""
    launch = Launch(list(argv), cwd, env, limits, pass_fds, gate)
    result = await run_command(
        functools.partial(start_child, launch, stdin is not None),
        timeout=timeout,
        stdin=stdin,
        max_output_bytes=max_output_bytes,
        storage=storage,
    )
    assert result is not None  # start_child starts it, or raises
    return result


# --------------------------------------------------------------------------------------
# what the backends share


def probe(argv: list[str], env: dict[str, str], *, failed: tuple[str, str], fix: str) -> None:
    """Run ``argv``, a check that a backend works here. ConfigError if it cannot run
    (``failed[0]``: the error) or fails (``failed[1]``: its last line of stderr), with how
    to ``fix`` it."""
    try:
        proc = subprocess.run(argv, capture_output=True, timeout=30, env=env)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise ConfigError(f"{failed[0]}: {e}; {fix}") from e
    if proc.returncode != 0:
        why = proc.stderr.decode("utf-8", "replace").strip().splitlines()
        raise ConfigError(f"{failed[1]} ({why[-1] if why else proc.returncode}); {fix}")


# Enough for parallel builds and test runners, few enough that a fork bomb stays harmless.
DEFAULT_MAX_PROCESSES = 1024


class ProcessSandbox:
    """What the ``bwrap``, ``docker`` and ``local`` backends share: the workspace and the
    limits every backend takes, and :meth:`exec`. A backend says only how a command starts
    (:meth:`_launch`, around which it may set up and clean up), and may run it in a sandbox
    prepared for it (:meth:`_prepared`); :func:`run_command` does the rest for all."""

    def __init__(
        self,
        workspace: str | Path,
        *,
        allow_net: bool = False,
        memory_mb: int | None = None,
        max_processes: int | None = DEFAULT_MAX_PROCESSES,
        max_file_mb: int | None = None,
        storage_mb: int | None = None,
        max_output_bytes: int = 1_000_000,
        shown_as: str = "/app",
    ) -> None:
        """The limits every backend takes (``None``: unlimited), with the defaults of the
        sandboxes (``local`` has its own); ``shown_as`` is how the command names the
        workspace in a storage limit's message. ``memory_mb`` caps each process's address
        space and the command's whole tree; without it the tree is still capped at
        :func:`default_memory_mb` (a memory cgroup where one can be made, else
        ``RLIMIT_AS``)."""
        self.workspace = Path(workspace).resolve()
        if not self.workspace.is_dir():
            raise ConfigError(f"sandbox: workspace {self.workspace} is not a directory")
        self.allow_net = allow_net
        self.memory_mb = memory_mb
        self.memory_cap_mb = memory_mb if memory_mb is not None else default_memory_mb()
        self.max_processes = max_processes
        self.max_file_mb = file_size_cap(max_file_mb, storage_mb)
        self.storage_mb = storage_mb
        self.max_output_bytes = max_output_bytes
        self.storage = (
            StorageLimit(self.workspace, storage_mb, shown_as=shown_as)
            if storage_mb is not None
            else None
        )

    @property
    def limits(self) -> ProcessLimits:
        """The limits of each command, as given."""
        return ProcessLimits(
            memory_mb=self.memory_mb,
            max_processes=self.max_processes,
            max_file_mb=self.max_file_mb,
            memory_cap_mb=self.memory_cap_mb,
        )

    def _launch(
        self, command: str, *, stdin: bool, mounts: tuple[Mount, ...], cwd: str
    ) -> contextlib.AbstractAsyncContextManager[Launch | ExecResult]:
        """How ``command`` starts, for the time it runs; an :class:`ExecResult` instead when
        the backend answers it without starting anything."""
        raise NotImplementedError

    def _prepared(self, mounts: tuple[Mount, ...]) -> Prepared | None:
        """A sandbox prepared ahead that can take this command now, if the backend has one."""
        return None

    async def close(self) -> None:
        """Stop every process of this sandbox that outlives a command (a sandbox kept or
        started ahead, a container being removed) and wait until all are gone. It stays
        usable: a later command starts what it needs anew."""

    async def exec(
        self,
        command: str,
        *,
        timeout: float = 120.0,
        stdin: bytes | None = None,
        mounts: tuple[Mount, ...] = (),
        cwd: str = "/app",
    ) -> ExecResult:
        if (prepared := self._prepared(mounts)) is not None and (
            result := await prepared.run(
                Command(command, timeout, stdin, cwd, self.max_output_bytes, self.storage)
            )
        ) is not None:
            return result
        async with self._launch(command, stdin=stdin is not None, mounts=mounts, cwd=cwd) as how:
            if isinstance(how, ExecResult):
                return how
            return await run_process(
                how.argv,
                timeout=timeout,
                stdin=stdin,
                cwd=how.cwd,
                env=how.env,
                max_output_bytes=self.max_output_bytes,
                limits=how.limits,
                storage=self.storage,
                pass_fds=how.pass_fds,
                gate=how.gate,
            )


@dataclass(frozen=True)
class Command:
    """A command for a prepared sandbox, with the caps a sandbox of its own would set."""

    command: str
    timeout: float
    stdin: bytes | None
    cwd: str
    max_output_bytes: int
    storage: StorageLimit | None


class Prepared(Protocol):
    """A sandbox prepared before its command comes: started ahead
    (:mod:`stayer.sandbox.ahead`) or persistent (:mod:`stayer.sandbox.persistent`). ``run``
    returns None when it cannot take the command, which then gets a sandbox started for it;
    ``close`` kills it and waits until every process of it is gone."""

    async def run(self, cmd: Command) -> ExecResult | None: ...

    async def close(self) -> None: ...

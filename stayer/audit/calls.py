"""What every importer produces: one session's deduplicated model calls, in a shape that
does not depend on which agent wrote the log.

Importers differ only in how they read bytes; everything after (pricing, cache-break
forensics, context growth, reports) works on :class:`Call` records, so a new log format is
one small module implementing :class:`Importer`.
"""

from __future__ import annotations

import os
import re
import stat
from collections.abc import Iterable, Iterator, Sequence
from datetime import datetime
from decimal import Decimal
from functools import cache
from typing import Any, BinaryIO, Protocol

import msgspec
import orjson

from stayer.usage import Usage

_ZULU_MS = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", re.ASCII)

#: The chain name of a session's own agent; sub-agents get their own chain names.
MAIN_CHAIN = ""


class Call(msgspec.Struct, gc=False):
    """One billed model call, after deduplication. (A Struct: an audit makes one per call
    of every session, and a Struct is made several times faster than a dataclass.)"""

    ts: float  # request time, seconds since the epoch (UTC)
    model: str
    usage: Usage
    chain: str = MAIN_CHAIN  # which agent made it: MAIN_CHAIN or a sub-agent's id
    provider: str | None = None  # the provider whose caching rules and prices apply
    service_tier: str | None = None
    compacted: bool = False  # the log shows a compaction of this chain just before this call
    # A cache-break verdict the log itself carries (stayer's own ledger, reached with the
    # full request in view): "" no break, else the reason; None when the log has none and
    # the usage-only forensics decide.
    cache_break_reason: str | None = None
    approximate_ts: bool = False  # ts reconstructed (stayer runs record latencies, not times)
    # How many API calls the record stands for: more than 1 only where a log keeps totals,
    # not each call's usage (SWE-agent's ``model_stats``); such a record is priced and
    # counted but has no prompt size of its own (no context growth, no costliest call).
    count: int = 1


class LoggedTotal(msgspec.Struct, frozen=True):
    """One total a log records of itself, the reference its audit is checked against."""

    what: str  # the audit's quantity: calls, input_tokens, cache_read_tokens,
    #            cache_write_tokens, output_tokens or cost_usd
    field: str  # where the log keeps it, e.g. ``info.model_stats.instance_cost``
    value: int | str  # the log's value (a cost as the decimal string of the logged float)
    why: str = ""  # why the audit counts otherwise, where the importer knows


class ImportedSession(msgspec.Struct):
    """A session's calls (any order) plus what could not be read."""

    source: str  # "claude-code", "codex", "stayer", "swe-agent", "mini-swe-agent", …
    id: str
    project: str
    calls: list[Call] = msgspec.field(default_factory=list)
    skipped_lines: int = 0
    files: int = 0
    bytes: int = 0
    recorded: list[LoggedTotal] = msgspec.field(default_factory=list)  # the log's own totals

    def check(self, what: str, field: str, value: int | None, why: str = "") -> None:
        """A total the log records of itself at ``field`` (None: it records none)."""
        if value is not None:
            self.recorded.append(LoggedTotal(what, field, value, why))

    def check_cost(self, field: str, value: float | None, why: str = "") -> None:
        """The cost the log records of itself at ``field``, a JSON number (None: none)."""
        cost = logged_cost(value)
        if cost is not None:
            self.recorded.append(LoggedTotal("cost_usd", field, cost, why))


class SessionRef(msgspec.Struct, frozen=True):
    """Where one session's data lives: cheap to build, cheap to send to a worker process
    (its paths are strings, as ``LogFile``'s)."""

    source: str
    id: str
    project: str
    paths: tuple[str, ...]
    bytes: int = 0


class LogFile(msgspec.Struct, frozen=True):
    """A file that discovery found: where it is, its size and its first bytes. Plain strings,
    not ``Path`` s: an audit finds thousands, and pathlib's parsing of each costs more than
    reading its first bytes."""

    path: str
    size: int
    head: bytes

    @property
    def name(self) -> str:
        return os.path.basename(self.path)


class Importer(Protocol):
    """One log format: find its sessions under some paths, and read one session."""

    source: str

    def sniff(self, name: str, head: bytes) -> bool:
        """Whether a file called ``name`` whose first bytes are ``head`` is a log of this
        format."""
        ...

    def group(self, files: Sequence[LogFile]) -> Iterable[SessionRef]:
        """Group files of this format into sessions (a session may span several files)."""
        ...

    def read(self, ref: SessionRef) -> ImportedSession:
        """Read one session, streaming; malformed lines are counted, never fatal."""
        ...


# --- reading log lines: every importer skips and counts malformed lines the same way ---


def open_log(
    path: str | os.PathLike[str], buffering: int = -1
) -> tuple[BinaryIO, os.stat_result] | None:
    """A log file opened for reading, with its stat (links followed); None for anything but a
    regular file (a FIFO, a device, a directory) or when it cannot be opened. Discovery and
    every importer open through here (or ``open_log_fd``), so a log swapped for a FIFO or a
    device after discovery is never opened: a FIFO would have the audit wait for a writer
    (or let a waiting writer through), and opening a device can act on it."""
    opened = open_log_fd(path)
    if opened is None:
        return None
    fd, st = opened
    return os.fdopen(fd, "rb", buffering=buffering), st


def open_session_log(
    path: str, out: ImportedSession, buffering: int = -1
) -> tuple[BinaryIO, os.stat_result] | None:
    """``open_log`` of one of a session's files, counted in ``out.files``; None, counted as
    a skipped line, when it cannot be opened."""
    out.files += 1
    opened = open_log(path, buffering)
    if opened is None:
        out.skipped_lines += 1
    return opened


def open_logs(ref: SessionRef, out: ImportedSession) -> Iterator[BinaryIO]:
    """Each of a session's files that opens (``open_session_log``)."""
    for path in ref.paths:
        opened = open_session_log(path, out)
        if opened is not None:
            yield opened[0]


def open_log_fd(path: str | os.PathLike[str]) -> tuple[int, os.stat_result] | None:
    """``open_log``'s file descriptor, for a caller that reads a few bytes and closes it.

    On Linux the path is pinned with ``O_PATH``, which opens nothing (no reader of a FIFO,
    no driver's open); its type is read from that, and only a regular file is opened for
    reading, through ``/proc/self/fd`` (the same inode, whatever the path names by then).
    Elsewhere, or without ``/proc``, ``O_NONBLOCK`` keeps the open of a FIFO from waiting."""
    pin = _can_reopen()
    try:
        fd = os.open(path, (os.O_PATH if pin else os.O_RDONLY | os.O_NONBLOCK) | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if stat.S_ISREG(st.st_mode):
            readable = (
                os.open(f"/proc/self/fd/{fd}", os.O_RDONLY | os.O_CLOEXEC) if pin else os.dup(fd)
            )
            return readable, st
    except OSError:
        pass
    finally:
        os.close(fd)
    return None


@cache
def _can_reopen() -> bool:
    """Whether an ``O_PATH`` descriptor can be opened again for reading through /proc."""
    return hasattr(os, "O_PATH") and os.path.isdir("/proc/self/fd")


def parse_ts(value: Any) -> float | None:
    """ISO-8601 time (``…Z`` or with offset) → epoch seconds; None if it is not one.

    As ``datetime.fromisoformat`` reads it, except that the form agents write
    (``2025-08-01T12:34:56.789Z``) never has an hour of 24 (newer Pythons read ``24:00`` as
    the next midnight). ``timestamp()`` gives whole microseconds over 10⁶, correctly rounded."""
    if not isinstance(value, str):
        return None
    try:
        t = datetime.fromisoformat(value)
    except ValueError:
        return None
    if not (t.hour or t.minute or t.second) and value[11:13] == "24" and _ZULU_MS.fullmatch(value):
        return None
    return t.timestamp()


def well_framed(line: bytes) -> bool:
    """A line that was not parsed still has to look like one JSON object (or be blank).
    Checked at the ends only: lines can be megabytes of tool output."""
    if line.startswith(b"{") and line.endswith((b"}\n", b"}", b"}\r\n")):
        return True
    return not line.strip()


def json_object(line: bytes, out: ImportedSession) -> dict[str, Any] | None:
    """The line's JSON object; None, counted in ``out.skipped_lines``, when it is not one."""
    try:
        d = orjson.loads(line)
    except orjson.JSONDecodeError:
        d = None
    if type(d) is dict:
        return d
    out.skipped_lines += 1
    return None


def read_document(path: str, out: ImportedSession, decoder: msgspec.json.Decoder[Any]) -> Any:
    """A whole-file JSON log (one document, not lines) decoded by ``decoder``, its bytes and
    files counted in ``out``; None, counted as one skipped line, when it cannot be opened or
    is not that document."""
    opened = open_session_log(path, out)
    if opened is None:
        return None
    try:
        with opened[0] as f:
            raw = f.read()
    except OSError:
        out.skipped_lines += 1
        return None
    out.bytes += len(raw)
    try:
        return decoder.decode(raw)
    except (msgspec.DecodeError, msgspec.ValidationError):
        out.skipped_lines += 1
        return None


class DocumentImporter:
    """An importer of logs that hold one session in one JSON document: each file is a
    session, named by ``_name(file)`` (its id and project); ``read`` decodes each of the
    session's files with ``decoder`` (``read_document``) and hands it to
    ``_session(doc, path, out)``."""

    source: str
    decoder: msgspec.json.Decoder[Any]

    def group(self, files: Sequence[LogFile]) -> Iterable[SessionRef]:
        for f in files:
            yield SessionRef(self.source, *self._name(f), (f.path,), f.size)

    def _name(self, f: LogFile) -> tuple[str, str]:
        raise NotImplementedError

    def read(self, ref: SessionRef) -> ImportedSession:
        out = ImportedSession(self.source, ref.id, ref.project)
        for path in ref.paths:
            doc = read_document(path, out, self.decoder)
            if doc is not None:
                self._session(doc, path, out)
        return out

    @staticmethod
    def _session(doc: Any, path: str, out: ImportedSession) -> None:
        raise NotImplementedError


def logged_cost(value: float | None) -> str | None:
    """A cost a log wrote as a JSON number, as a decimal string (the float's shortest
    round-trip digits, never an exponent); None when it wrote none."""
    return None if value is None else format(Decimal(repr(float(value))), "f")


def file_time(path: str) -> float:
    """A log's modification time: the time of its calls where it records none."""
    try:
        return os.stat(path).st_mtime
    except OSError:
        return 0.0


#: Costs closer than this agree: a log's float total carries its additions' rounding.
COST_TOLERANCE = Decimal("1e-9")


def same_cost(a: Decimal, b: Decimal) -> bool:
    return abs(a - b) <= COST_TOLERANCE

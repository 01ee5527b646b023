"""Find the logs, read each session once, analyse it, and keep only its report.

Memory does not grow with the size of the input: a session is read and analysed inside one
task and only its report (tallies, breaks, the few costliest calls) comes back, so what is
held at any time is one session's calls per worker plus one small report per session
(plus one point per call for plots when ``keep_series`` is set, for ``--html``).
Deduplication is per session — the key includes the session id, and a session's files
(its transcript and its sub-agents') are read together — so nothing global is kept. The one
case this misses and ccusage catches: an entry copied, under its original session id, into
another session's file.

Details and rationale: docs/notes.md, ``stayer/audit/engine.py``.
"""

from __future__ import annotations

import contextlib
import os
import pickle
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import msgspec

from stayer.audit.analysis import SessionReport, analyse
from stayer.audit.atif import AtifImporter
from stayer.audit.calls import Importer, LogFile, SessionRef, open_log_fd
from stayer.audit.claude_code import ClaudeCodeImporter
from stayer.audit.codex import CodexImporter
from stayer.audit.costing import CallPricer, CompiledSteps
from stayer.audit.document import session_fragment
from stayer.audit.mini_swe_agent import MiniSweAgentImporter
from stayer.audit.openhands import OpenHandsImporter
from stayer.audit.stayer_runs import StayerRunImporter
from stayer.audit.swe_agent import SweAgentImporter
from stayer.pricing import PriceBook

_HEAD = 4096
_PARALLEL_MIN_BYTES = 16 << 20  # below this a process pool costs more than it saves
_MIN_BATCH_BYTES = 1 << 20  # a smaller batch costs more to hand over than it evens out


def importers() -> list[Importer]:
    """The formats ``stayer audit`` reads, in sniffing order."""
    return [
        CodexImporter(),
        ClaudeCodeImporter(),
        StayerRunImporter(),
        SweAgentImporter(),
        MiniSweAgentImporter(),
        AtifImporter(),
        OpenHandsImporter(),
    ]


#: What ``stayer audit`` reads, as said to someone who gave it something else.
FORMATS = (
    "Claude Code or Codex .jsonl session, stayer run result.json, SWE-agent .traj, "
    "mini-swe-agent .traj.json, OpenHands event list .json, ATIF trajectory.json"
)

#: Formats that restate another agent's own log (Harbor's ATIF of a Claude Code session):
#: left out of an audit that reads that log too, whose record is the finer one.
_RESTATED = frozenset({AtifImporter.source})


def default_paths(env: dict[str, str] | None = None) -> list[Path]:
    """Where the agents keep their logs when no PATH is given: Claude Code
    (``$CLAUDE_CONFIG_DIR``, comma-separated, else ``~/.claude`` and ``~/.config/claude``),
    Codex (``$CODEX_HOME``, else ``~/.codex``) and stayer (``$STAYER_HOME``, else ``./.stayer``)."""
    env = dict(os.environ) if env is None else env
    home = Path(env.get("HOME") or Path.home())
    claude = [Path(p) for p in env.get("CLAUDE_CONFIG_DIR", "").split(",") if p.strip()]
    if not claude:
        claude = [home / ".claude", home / ".config" / "claude"]
    codex = Path(env.get("CODEX_HOME") or home / ".codex")
    stayer = Path(env.get("STAYER_HOME") or ".stayer")
    return [*(c / "projects" for c in claude), codex / "sessions", stayer / "runs"]


class Discovery(msgspec.Struct):
    refs: list[SessionRef] = msgspec.field(default_factory=list)
    unrecognised: list[Path] = msgspec.field(default_factory=list)
    # Directories with files named like logs, none of which is one: (directory, a file).
    unread: list[tuple[Path, str]] = msgspec.field(default_factory=list)
    # Restatements left out because the session's own log is audited too (their paths).
    restated: list[str] = msgspec.field(default_factory=list)


def _walk(root: str) -> Iterator[str]:
    """Paths of the files under ``root`` that may be logs; links to directories are not
    followed."""
    stack = [root]
    while stack:
        d = stack.pop()
        try:
            entries = list(os.scandir(d))
        except OSError:
            continue
        for e in entries:
            if e.is_dir(follow_symlinks=False):
                stack.append(e.path)
            elif e.name.endswith((".jsonl", ".json", ".traj")):
                yield e.path


def _open_log(path: str) -> tuple[os.stat_result, bytes] | None:
    """(stat, first bytes) of a regular file, links followed; None for anything else (never
    opened: ``open_log_fd``) or when it cannot be read."""
    opened = open_log_fd(path)
    if opened is None:
        return None
    fd, st = opened
    try:
        return st, os.read(fd, _HEAD)
    except OSError:
        return None
    finally:
        os.close(fd)


def discover(paths: Iterable[Path], formats: Sequence[Importer] | None = None) -> Discovery:
    """Sessions under ``paths`` (files or directories); files given by name that no format
    recognises are reported in ``unrecognised``, directories where files that might be logs
    (by their name) were found but none is in ``unread`` (other files found by walking are
    just ignored). Each file is opened once: its size, identity and first bytes come from
    that."""
    formats = list(formats) if formats is not None else importers()
    found: list[list[LogFile]] = [[] for _ in formats]
    out = Discovery()
    seen: set[tuple[int, int]] = set()  # (device, inode): overlapping PATHs count once
    for root in paths:
        named = root.is_file()
        recognised, other = 0, ""
        for path in [os.fspath(root)] if named else _walk(os.fspath(root)):
            opened = _open_log(path)
            if opened is None:
                if named:
                    out.unrecognised.append(root)
                continue
            st, head = opened
            if (st.st_dev, st.st_ino) in seen:
                continue
            seen.add((st.st_dev, st.st_ino))
            name = os.path.basename(path)
            for fmt, files in zip(formats, found, strict=True):
                if fmt.sniff(name, head):
                    files.append(LogFile(path, st.st_size, head))
                    recognised += 1
                    break
            else:
                if named:
                    out.unrecognised.append(root)
                elif not other:
                    other = path
        if other and not recognised:
            out.unread.append((root, other))
    for fmt, files in zip(formats, found, strict=True):
        out.refs.extend(fmt.group(files))
    if any(r.source in _RESTATED for r in out.refs):
        own = {r.id for r in out.refs if r.source not in _RESTATED}
        out.restated = [
            p for r in out.refs if r.source in _RESTATED and r.id in own for p in r.paths
        ]
        out.refs = [r for r in out.refs if r.source not in _RESTATED or r.id not in own]
    return out


class _Audit(msgspec.Struct, frozen=True):
    """What every batch of one audit shares."""

    book: PriceBook
    since: float | None
    keep_series: bool
    compiled: CompiledSteps
    with_json: bool = False


def _run(
    audit: _Audit, batches: Iterable[Sequence[SessionRef]], pricer: CallPricer
) -> Iterator[SessionReport]:
    """The reports of the sessions of ``batches``, priced by ``pricer`` (which learns the
    price steps it compiles on the way)."""
    by_source = {f.source: f for f in importers()}
    for refs in batches:
        for ref in refs:
            report = analyse(
                by_source[ref.source].read(ref), pricer, audit.since, audit.keep_series
            )
            report.ref_id = ref.id
            if audit.with_json:
                report.json_fragment = session_fragment(report)
            yield report


def _read_here(
    audit: _Audit, batches: Iterable[Sequence[SessionRef]], steps: CompiledSteps
) -> Iterator[SessionReport]:
    """:func:`_run` in this process, its price steps added to ``steps`` at the end."""
    pricer = CallPricer(audit.book, audit.compiled)
    yield from _run(audit, batches, pricer)
    steps.update(pricer.learned)


# A helper's reports cross to the caller as MessagePack: encoded and decoded in C, in half
# the time pickle takes for these nested Structs.
_REPORTS_OUT = msgspec.msgpack.Encoder()
_REPORTS_IN = msgspec.msgpack.Decoder(list[SessionReport])


def _take(
    batches: Sequence[tuple[SessionRef, ...]], taken: Any
) -> Iterator[tuple[SessionRef, ...]]:
    """The batches this process takes, in order: each process of the audit takes the next
    one not taken (``taken``: a shared counter) when it has finished its last."""
    while True:
        with taken.get_lock():
            i = taken.value
            taken.value = i + 1
        if i >= len(batches):
            return
        yield batches[i]


def _helper(
    audit: _Audit, batches: Sequence[tuple[SessionRef, ...]], taken: Any, send: Any
) -> None:
    """A helper process: its batches' reports and the price steps it compiled, sent once at
    its end (sending per batch would have it wait whenever the caller, busy with its own
    batches, is not reading); or what it raised. Each batch's reports are encoded as it
    ends, so that the caller, done with its own, waits for the last batch only."""
    try:
        pricer = CallPricer(audit.book, audit.compiled)
        encoded = [
            _REPORTS_OUT.encode(list(_run(audit, [batch], pricer)))
            for batch in _take(batches, taken)
        ]
        outcome: Any = (encoded, pricer.learned)
    except BaseException as e:  # noqa: BLE001 - handed to the caller, which raises it
        outcome = e
    with contextlib.suppress(OSError):  # OSError: the caller is gone, no one to tell
        try:
            send.send(outcome)
        except (pickle.PicklingError, TypeError, AttributeError) as e:  # an error pickle refuses
            send.send(RuntimeError(f"an audit helper process failed: {outcome!r} ({e})"))
    send.close()


def _batches(refs: Sequence[SessionRef], jobs: int) -> list[tuple[SessionRef, ...]]:
    """Batches for ``jobs`` processes, largest first and shrinking ("guided" scheduling):
    each takes a ``2 * jobs``-th of the bytes still to hand out, the largest sessions first,
    so that a process taking the next batch as it finishes one ends close to the others.
    Equal batches left one core idle for as long as a whole batch took: the same bytes can
    take half as long again (other sessions' shapes, a core shared with another machine)."""
    ordered = sorted(refs, key=lambda r: r.bytes, reverse=True)
    left = sum(r.bytes + 1 for r in ordered)
    # The last batches are a 32nd of a process's share (a few ms of work each): smaller
    # ones would only add turns at the shared counter.
    smallest = max(left // (32 * jobs), _MIN_BATCH_BYTES)
    batches: list[tuple[SessionRef, ...]] = []
    start = 0
    while start < len(ordered):
        target = max(left // (2 * jobs), smallest)
        end, size = start, 0
        while end < len(ordered) and (end == start or size + ordered[end].bytes < target):
            size += ordered[end].bytes + 1
            end += 1
        batches.append(tuple(ordered[start:end]))
        left -= size
        start = end
    return batches


def _cores() -> int:
    """The cores this process may run on (a container's CPU set, not the host's)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def analyse_all(
    refs: Sequence[SessionRef],
    book: PriceBook,
    since: float | None = None,
    keep_series: bool = False,
    jobs: int | None = None,
    parallel_min_bytes: int = _PARALLEL_MIN_BYTES,
    compiled_steps: CompiledSteps | None = None,
    with_json: bool = False,
) -> Iterator[SessionReport]:
    """Reports of every session (with or without calls), in no particular order. Inputs smaller than
    ``parallel_min_bytes`` are analysed in this process. ``compiled_steps`` (see
    ``stayer.audit.costing``) are used for pricing, and the steps compiled on the way are
    added to it. ``with_json``: each report's ``to_json()`` is made where it was analysed,
    in parallel, rather than by the caller after the last one."""
    steps: CompiledSteps = {} if compiled_steps is None else compiled_steps
    audit = _Audit(book, since, keep_series, dict(steps), with_json)
    jobs = jobs or _cores()
    total = sum(r.bytes for r in refs)
    if jobs <= 1 or len(refs) < 2 or total < parallel_min_bytes:
        yield from _read_here(audit, [refs], steps)
        return
    yield from _shared(audit, _batches(refs, jobs), jobs, steps)


def _shared(
    audit: _Audit, batches: list[tuple[SessionRef, ...]], jobs: int, steps: CompiledSteps
) -> Iterator[SessionReport]:
    """The reports of ``batches``, shared between this process and ``jobs - 1`` helper
    processes (``fork`` where available): each takes the next batch as it finishes one.
    This process works rather than waits, so a machine of ``jobs`` cores runs ``jobs``
    readers, and its own reports never cross a pipe."""
    import multiprocessing as mp

    ctx = mp.get_context("fork" if "fork" in mp.get_all_start_methods() else None)
    taken = ctx.Value("q", 0)
    helpers = []
    try:
        for _ in range(min(jobs, len(batches)) - 1):
            receive, send = ctx.Pipe(duplex=False)
            process = ctx.Process(target=_helper, args=(audit, batches, taken, send), daemon=True)
            process.start()
            send.close()
            helpers.append((process, receive))
        yield from _read_here(audit, _take(batches, taken), steps)
        for process, receive in helpers:
            try:
                outcome = receive.recv()
            except EOFError:
                process.join()
                raise RuntimeError(
                    f"an audit helper process ended without its reports (exit code {process.exitcode})"
                ) from None
            if isinstance(outcome, BaseException):
                raise outcome
            encoded, learned = outcome
            steps.update(learned)
            for reports in encoded:
                yield from _REPORTS_IN.decode(reports)
    finally:
        for process, receive in helpers:
            receive.close()
            if process.is_alive():
                process.terminate()
            process.join()

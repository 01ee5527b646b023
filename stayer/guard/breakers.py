"""Breakers: what stops a run that is going nowhere or costing too much, and why.

Limit breakers (steps, cost, tokens, wall time) have a soft threshold (default 80 %) at
which the run switches to wrap-up instead of being cut off mid-task. Behaviour breakers
watch the steps: ``tool_errors`` (consecutive steps whose every call failed), ``loop``
(the same action repeated), ``no_progress`` (the workspace unchanged), ``cost_anomaly``
(a step dearer than X× the rolling median; planned misses are exempt). A behaviour trip
is offered to the router first; otherwise the run wraps up. Every trip is a ``Trip`` the
loop writes to the ledger.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import stat
import statistics
from collections import deque
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path
from typing import Protocol

from stayer.settings import GuardConfig as GuardConfig  # its home until 36: re-exported
from stayer.workspace.watch import TreeWatch

#: Reasons a trip can have. Limits first, then behaviour.
LIMIT_REASONS = ("max_steps", "max_cost", "max_tokens", "max_wall_time")
BEHAVIOUR_REASONS = ("tool_errors", "loop", "no_progress", "cost_anomaly")


@dataclass(frozen=True)
class Trip:
    reason: str
    detail: str
    step: int  # the step after which it was decided (0: before the first call)
    action: str = "wrap_up"  # wrap_up, escalate, stop
    soft: bool = False  # a soft threshold, not the limit itself


@dataclass(frozen=True)
class ToolCallRecord:
    name: str
    arguments: str
    is_error: bool
    exit_code: int | None = None  # a command's exit status, when the tool ran one

    @property
    def failed(self) -> bool:
        return self.is_error or self.exit_code not in (None, 0)

    @classmethod
    def of(cls, name: str, arguments: str, is_error: bool, output: str) -> ToolCallRecord:
        """From a tool result; the exit status is read from bash's ``[exit code: N]`` line."""
        codes = _EXIT_CODE.findall(output) if name == "bash" else []
        return cls(name, arguments, is_error, int(codes[-1]) if codes else None)


_EXIT_CODE = re.compile(r"^\[exit code: (-?\d+)\]", re.MULTILINE)


@dataclass(frozen=True)
class StepRecord:
    """What a finished step tells the breakers."""

    step: int
    cost: Decimal | None
    calls: tuple[ToolCallRecord, ...]
    content: str = ""  # the reply's text (an action too, when no tool is called)
    output_tokens: int = 0
    planned_miss: bool = False  # a compaction or priced model switch made this step dear


class WorkspaceProbe(Protocol):
    def fingerprint(self) -> str: ...


@dataclass
class _Listing:
    """What the fingerprint keeps of one directory."""

    inode: int
    mark: int  # hash of its path and of its entries' names, sizes and modification times
    subdirs: tuple[str, ...]
    files: int
    linked: bool  # holds a hard-linked file, whose edits elsewhere no event reports


@dataclass
class TreeFingerprint:
    """Names, sizes and modification times of the workspace files, hashed. ``.stayer/``
    (the harness's own archive and notes) is left out: only the agent's work counts.

    Incremental: it runs every step, and re-reading a 10,000-file workspace costs ~100 ms.
    The tree is read once, with an inotify watch on each directory (``TreeWatch``, as the
    snapshot store uses); after that only the directories that saw an event are read
    again. Where the watch cannot vouch for the tree (no inotify, watches or events lost,
    hard-linked files, more than ``max_entries`` files) every call reads it all."""

    root: Path
    max_entries: int = 50_000
    _watch: TreeWatch = field(default_factory=TreeWatch, init=False, repr=False)
    _dirs: dict[str, _Listing] = field(default_factory=dict, init=False, repr=False)
    _digest: str | None = field(default=None, init=False, repr=False)
    _files: int = field(default=0, init=False, repr=False)  # in ``_dirs``
    # XOR of every listing's mark: the tree's hash, updated per directory in O(1) (paths
    # are unique, so no two marks cancel but by a collision of SHA-256).
    _combined: int = field(default=0, init=False, repr=False)
    _device: int = field(default=-1, init=False, repr=False)  # the root's file system

    def fingerprint(self) -> str:
        key = str(self.root)
        changed = self._watch.changed_directories(key) if self._digest is not None else None
        if changed is None:
            self._scan_all()
        elif not changed:
            assert self._digest is not None
            return self._digest
        else:
            # Parents first: re-reading one may drop or read afresh the subtrees below it.
            for directory in sorted(changed, key=lambda d: d.count(os.sep)):
                if directory in self._dirs:
                    self._read_tree(directory)
        self._digest = f"{self._combined:064x}"
        return self._digest

    def _scan_all(self) -> None:
        key = str(self.root)
        self._watch.begin(key)
        self._dirs.clear()
        self._files = self._combined = 0
        self._device = _device_of(key)
        self._read_tree(key)
        if self._files < self.max_entries and not any(d.linked for d in self._dirs.values()):
            self._watch.end(key)

    def _read_tree(self, top: str) -> None:
        """(Re-)read ``top`` and whatever below it is new, gone or replaced."""
        pending = [top]
        while pending:
            directory = pending.pop()
            old = self._take(directory)
            new = self._read_dir(directory)
            for name in old.subdirs if old else ():
                if new is None or name not in new.subdirs:
                    self._drop_tree(os.path.join(directory, name))
            if new is None:
                continue
            self._put(directory, new)
            for name in new.subdirs:
                sub = os.path.join(directory, name)
                known = self._dirs.get(sub)
                if (
                    known is None
                    or old is None
                    or name not in old.subdirs
                    or known.inode != _inode(sub)
                ):
                    pending.append(sub)

    def _drop_tree(self, top: str) -> None:
        below = top + os.sep
        for directory in [d for d in self._dirs if d == top or d.startswith(below)]:
            self._take(directory)

    def _put(self, directory: str, listing: _Listing) -> None:
        self._dirs[directory] = listing
        self._files += listing.files
        self._combined ^= listing.mark

    def _take(self, directory: str) -> _Listing | None:
        listing = self._dirs.pop(directory, None)
        if listing is not None:
            self._files -= listing.files
            self._combined ^= listing.mark
        return listing

    def _read_dir(self, directory: str) -> _Listing | None:
        """One directory's entries, watched from before they are read; None if it is gone
        (or the file budget is spent)."""
        if self._files >= self.max_entries:
            return None
        self._watch.add(str(self.root), directory)
        lines, subdirs, linked = [], [], False
        try:
            inode = os.lstat(directory).st_ino
            with os.scandir(directory) as entries:
                for entry in entries:
                    if entry.name == ".stayer" and directory == str(self.root):
                        continue
                    try:
                        st = entry.stat(follow_symlinks=False)
                    except OSError:
                        continue
                    # Another file system mounted inside is not entered (as snapshots walk).
                    if stat.S_ISDIR(st.st_mode) and st.st_dev == self._device:
                        subdirs.append(entry.name)
                        continue
                    linked = linked or (stat.S_ISREG(st.st_mode) and st.st_nlink > 1)
                    lines.append(
                        b"%s\0%d\0%d\n" % (os.fsencode(entry.name), st.st_size, st.st_mtime_ns)
                    )
        except OSError:
            return None
        subdirs.sort()
        lines.sort()
        h = hashlib.sha256(os.fsencode(directory) + b"\0\0")
        h.update(b"".join(lines) + b"\0".join(os.fsencode(d) for d in subdirs))
        return _Listing(inode, int.from_bytes(h.digest()), tuple(subdirs), len(lines), linked)


def _device_of(path: str) -> int:
    try:
        return os.lstat(path).st_dev
    except OSError:
        return -1


def _inode(path: str) -> int:
    try:
        return os.lstat(path).st_ino
    except OSError:
        return -1


@dataclass
class BehaviourBreakers:
    """The behaviour breakers' state, fed one ``StepRecord`` at a time."""

    config: GuardConfig
    probe: WorkspaceProbe | None = None
    _errors: int = 0
    _last_action: str | None = None
    _repeats: int = 0
    _fingerprint: str | None = None
    _unchanged: int = 0
    _costs: deque[Decimal] = field(default_factory=deque)

    def __post_init__(self) -> None:
        if self.probe is not None and self.config.no_change_steps:
            self._fingerprint = self.probe.fingerprint()

    def check(self, s: StepRecord) -> list[Trip]:
        c = self.config
        trips: list[Trip] = []

        def trip(reason: str, detail: str) -> None:
            trips.append(Trip(reason, detail, s.step))

        if s.calls and all(call.failed for call in s.calls):
            self._errors += 1
        else:
            self._errors = 0
        if c.max_tool_errors and self._errors >= c.max_tool_errors:
            trip("tool_errors", f"{self._errors} consecutive steps whose tool calls all failed")
            self._errors = 0

        action = json.dumps(
            [[call.name, call.arguments] for call in s.calls] or [["(no tool)", s.content]]
        )
        self._repeats = self._repeats + 1 if action == self._last_action else 1
        self._last_action = action
        if c.loop_repeats and self._repeats >= c.loop_repeats:
            trip("loop", f"the same action {self._repeats} steps in a row: {action[:200]}")
            self._repeats = 0

        if self.probe is not None and c.no_change_steps:
            fp = self.probe.fingerprint()
            self._unchanged = self._unchanged + 1 if fp == self._fingerprint else 0
            self._fingerprint = fp
            if self._unchanged >= c.no_change_steps:
                trip("no_progress", f"no change in the workspace over {self._unchanged} steps")
                self._unchanged = 0

        if s.cost is not None and c.anomaly_factor:
            window = list(self._costs)
            if not s.planned_miss and len(window) >= c.anomaly_window:
                median = statistics.median(window)
                if median > 0 and s.cost > median * Decimal(str(c.anomaly_factor)):
                    trip(
                        "cost_anomaly",
                        f"step cost ${s.cost:.6f}, {s.cost / median:.1f}x the median ${median:.6f} of the last {len(window)} steps",
                    )
            if not s.planned_miss:  # a chosen miss would inflate the median it is judged by
                self._costs.append(s.cost)
                while len(self._costs) > c.anomaly_window:
                    self._costs.popleft()
        return trips

"""Breakers: what stops a run that is going nowhere or costing too much, and why.

Limit breakers (steps, cost, tokens, wall time) have a soft threshold — by default 80 % of
the limit — at which the run switches to wrap-up (``stayer.guard.guard``) instead of being
cut off mid-task. Behaviour breakers watch the steps themselves:

* ``tool_errors`` — that many consecutive steps whose every tool call failed;
* ``loop`` — the same action (tool names and arguments) that many steps in a row;
* ``no_progress`` — the workspace unchanged over that many steps;
* ``cost_anomaly`` — a step costing more than X× the rolling median of recent steps
  (steps whose extra cost was planned — a compaction or a priced model switch — are
  exempt: their cache miss was chosen, not suffered).

A behaviour trip is first offered to the router (a cascade escalates to a stronger model
on such failure signals); if nothing handles it, the run wraps up. Every trip becomes a
``Trip`` that the loop writes to the ledger.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import statistics
from collections import deque
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path
from typing import Any, Protocol

#: Reasons a trip can have. Limits first, then behaviour.
LIMIT_REASONS = ("max_steps", "max_cost", "max_tokens", "max_wall_time")
BEHAVIOUR_REASONS = ("tool_errors", "loop", "no_progress", "cost_anomaly")


@dataclass(frozen=True)
class GuardConfig:
    """Breaker settings (``[guard]`` in stayer.toml). 0 or None turns a breaker off."""

    max_tokens: int | None = None  # input + output tokens over the run
    max_wall_s: float | None = None
    max_tool_errors: int = 5
    loop_repeats: int = 4
    no_change_steps: int = 20
    anomaly_factor: float = 10.0
    anomaly_window: int = 5
    soft_fraction: float = 0.8
    wrapup_steps: int = 2  # 0: no wrap-up; a limit stops the run where it is
    wrapup_output_tokens: int = 1024
    # A call the cap cannot afford pauses the run (``BudgetReached``) instead of wrapping
    # it up: the runtime's runs wait for a raised cap and resume from the journal.
    pause_at_cap: bool = False

    @classmethod
    def off(cls) -> GuardConfig:
        """Only the hard limits: for replaying recorded actions (what-if), which no breaker
        or wrap-up instruction could change."""
        return cls(max_tool_errors=0, loop_repeats=0, no_change_steps=0, anomaly_factor=0, soft_fraction=1.0, wrapup_steps=0)


@dataclass(frozen=True)
class Trip:
    reason: str
    detail: str
    step: int  # the step after which it was decided (0: before the first call)
    action: str = "wrap_up"  # wrap_up, escalate, stop
    soft: bool = False  # a soft threshold, not the limit itself

    def to_dict(self) -> dict[str, Any]:
        return {"reason": self.reason, "detail": self.detail, "step": self.step, "action": self.action, "soft": self.soft}


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
class TreeFingerprint:
    """Names, sizes and modification times of the workspace files, hashed. ``.stayer/``
    (the harness's own archive and notes) is left out: only the agent's work counts."""

    root: Path
    max_entries: int = 50_000

    def fingerprint(self) -> str:
        h = hashlib.sha256()
        seen = 0
        for dirpath, dirnames, filenames in os.walk(self.root):
            dirnames[:] = sorted(d for d in dirnames if not (dirpath == str(self.root) and d == ".stayer"))
            for name in sorted(filenames):
                try:
                    st = os.lstat(os.path.join(dirpath, name))
                except OSError:
                    continue
                h.update(f"{dirpath}/{name}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
                seen += 1
                if seen >= self.max_entries:
                    return h.hexdigest()
        return h.hexdigest()


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

    def observe(self, s: StepRecord) -> list[Trip]:
        c = self.config
        trips: list[Trip] = []
        if s.calls and all(call.failed for call in s.calls):
            self._errors += 1
        else:
            self._errors = 0
        if c.max_tool_errors and self._errors >= c.max_tool_errors:
            trips.append(Trip("tool_errors", f"{self._errors} consecutive steps whose tool calls all failed", s.step))
            self._errors = 0

        action = json.dumps([[call.name, call.arguments] for call in s.calls] or [["(no tool)", s.content]])
        self._repeats = self._repeats + 1 if action == self._last_action else 1
        self._last_action = action
        if c.loop_repeats and self._repeats >= c.loop_repeats:
            trips.append(Trip("loop", f"the same action {self._repeats} steps in a row: {action[:200]}", s.step))
            self._repeats = 0

        if self.probe is not None and c.no_change_steps:
            fp = self.probe.fingerprint()
            self._unchanged = self._unchanged + 1 if fp == self._fingerprint else 0
            self._fingerprint = fp
            if self._unchanged >= c.no_change_steps:
                trips.append(Trip("no_progress", f"no change in the workspace over {self._unchanged} steps", s.step))
                self._unchanged = 0

        if s.cost is not None and c.anomaly_factor:
            window = list(self._costs)
            if not s.planned_miss and len(window) >= c.anomaly_window:
                median = statistics.median(window)
                if median > 0 and s.cost > median * Decimal(str(c.anomaly_factor)):
                    trips.append(
                        Trip(
                            "cost_anomaly",
                            f"step cost ${s.cost:.6f}, {s.cost / median:.1f}x the median ${median:.6f} of the last {len(window)} steps",
                            s.step,
                        )
                    )
            if not s.planned_miss:  # a chosen miss would inflate the median it is judged by
                self._costs.append(s.cost)
                while len(self._costs) > c.anomaly_window:
                    self._costs.popleft()
        return trips

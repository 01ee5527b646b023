"""A gateway session's breakers: what stops a client that is going nowhere or burning money.

* ``max_steps`` — the session's calls (``x-stayer-max-steps``);
* ``loop`` — the same request body that many times in a row (the guard's ``loop_repeats``);
* ``cost_anomaly`` — a call far dearer than the median of the session's recent calls (the
  guard's ``anomaly_factor`` × median of ``anomaly_window`` calls);
* ``tokens_per_minute`` — input and output tokens over the last 60 s
  (``--max-tokens-per-minute``).

A tripped session refuses its further calls with the trip's reason and detail; a new
session id starts afresh. The state is this process's (a session served by several gateway
processes is judged by each on the calls it saw); a trip is also written to the ledger and
to the session's status, which every process reads.
"""

from __future__ import annotations

import hashlib
import time
from collections import deque
from dataclasses import dataclass, field
from decimal import Decimal

from stayer.guard.breakers import BehaviourBreakers, GuardConfig, StepRecord, Trip


@dataclass
class SessionBreakers:
    config: GuardConfig = field(default_factory=GuardConfig)
    max_tokens_per_minute: int | None = None
    tripped: Trip | None = None
    calls: int = 0  # the session's calls this process has judged
    _behaviour: BehaviourBreakers = field(init=False)
    _window: deque[tuple[float, int]] = field(default_factory=deque)

    def __post_init__(self) -> None:
        self._behaviour = BehaviourBreakers(self.config)

    def refusal(self, steps_done: int, max_steps: int | None) -> str | None:
        """Why the session's next call may not be made, or None."""
        if self.tripped is not None:
            t = self.tripped
            return f"breaker {t.reason} tripped at call {t.step} of this session: {t.detail}"
        if max_steps is not None and steps_done >= max_steps:
            return (
                f"breaker max_steps: this session made its {max_steps} calls (x-stayer-max-steps)"
            )
        return None

    def after(
        self, cost: Decimal | None, body: bytes, tokens: int, now: float | None = None
    ) -> list[Trip]:
        """Judge a finished call; the first trip, if any, ends the session."""
        now = time.monotonic() if now is None else now
        self.calls += 1
        step = self.calls
        digest = hashlib.sha256(body).hexdigest()
        trips = []
        for t in self._behaviour.check(StepRecord(step, cost, (), content=digest)):
            detail = (
                f"the same request body {self.config.loop_repeats} times in a row"
                if t.reason == "loop"
                else t.detail.replace("step cost", "call cost").replace(" steps", " calls")
            )
            trips.append(Trip(t.reason, detail, step, "stop"))
        self._window.append((now, tokens))
        while self._window and self._window[0][0] < now - 60:
            self._window.popleft()
        used = sum(n for _, n in self._window)
        if self.max_tokens_per_minute is not None and used > self.max_tokens_per_minute:
            trips.append(
                Trip(
                    "tokens_per_minute",
                    f"{used:,} tokens in the last minute > {self.max_tokens_per_minute:,}",
                    step,
                    "stop",
                )
            )
        if trips and self.tripped is None:
            self.tripped = trips[0]
        return trips

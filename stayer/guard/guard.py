"""The guard: one object the loop asks before and after every step.

* ``begin_step`` / ``admit`` — may this step run (limits and soft thresholds); the first
  trip switches the run to wrap-up; ``admit`` raises ``stayer.errors.Stopped``.
* ``reserve`` / ``settle`` / ``release`` — the step's worst case held before the call and
  replaced by its real cost after; ``hold_call`` for calls outside the step's own.
* ``after_step`` — feeds the behaviour breakers; a trip goes to ``escalate`` (the
  router's cascade), else starts the wrap-up.
* ``final_summary`` — the model's wrap-up summary if usable, else one from the trajectory.

The wrap-up is paid for by a slice carved at the start (above the soft threshold), so the
work can never eat it. Phases: ``work`` → ``wrap_up`` → stopped.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from decimal import Decimal

from stayer.errors import BudgetReached, Stopped
from stayer.guard.breakers import (
    BehaviourBreakers,
    GuardConfig,
    StepRecord,
    Trip,
    WorkspaceProbe,
)
from stayer.guard.budget import Budget, Reservation
from stayer.guard.reserve import MIN_OUTPUT_TOKENS, RatesAt, margin_tokens, quote
from stayer.guard.wrapup import instruction, summary_from_trajectory, usable
from stayer.messages import Message
from stayer.settings import RunSettings

# Behaviour trips a stronger model may fix; the others (cost anomaly) are not its doing.
ESCALATABLE = frozenset({"tool_errors", "loop", "no_progress"})


@dataclass(frozen=True)
class Held:
    reservation: Reservation
    max_tokens: int


@dataclass(frozen=True)
class Clearance:
    """Whether a step may call the model (``go``), and what to append before it does."""

    go: bool
    instruction: Message | None = None  # append before the call: the wrap-up has begun


@dataclass
class Guard:
    budget: Budget
    config: GuardConfig = field(default_factory=GuardConfig)
    max_steps: int = RunSettings.max_steps
    max_output_tokens: int = 8192
    probe: WorkspaceProbe | None = None
    escalate: Callable[[Trip], bool] = lambda trip: False
    clock: Callable[[], float] = time.monotonic

    phase: str = field(default="work", init=False)  # work, wrap_up, stopped
    trips: list[Trip] = field(default_factory=list, init=False)
    stop_reason: str = field(default="", init=False)
    tokens_used: int = field(default=0, init=False)
    _steps_done: int = field(default=0, init=False)
    _wrapup_steps: int = field(default=0, init=False)
    _pending: Message | None = field(default=None, init=False)
    _new_trips: list[Trip] = field(default_factory=list, init=False)

    def __post_init__(self) -> None:
        self.started = self.clock()
        self.breakers = BehaviourBreakers(self.config, self.probe)
        self.slice: Budget | None = None
        available = self.budget.available
        # A run that pauses at its cap needs no money kept for a wrap-up on cost.
        if available is not None and self.config.wrapup_steps and not self.config.pause_at_cap:
            share = (available * Decimal(str(1 - self.config.soft_fraction))).quantize(
                Decimal("1e-12")
            )
            self.slice = self.budget.carve(max(share, Decimal(0)), "wrap-up")

    # --- state ---------------------------------------------------------------------

    @property
    def working(self) -> bool:
        return self.phase == "work"

    @property
    def stopped(self) -> bool:
        return self.phase == "stopped"

    @property
    def delegable(self) -> Decimal | None:
        """What a sub-agent may be given: the working budget left (the wrap-up slice is not
        the work's to give away)."""
        return self.budget.available

    def take_trips(self) -> list[Trip]:
        """Trips since the last call, for the step's ledger entry."""
        out, self._new_trips = self._new_trips, []
        return out

    # --- before a step ----------------------------------------------------------------

    def begin_step(self, step: int) -> Clearance:
        done = self._steps_done = step - 1
        if not self.stopped:
            hard = self._hard_limit(done)
            if hard is not None:
                self._stop(hard)
            elif self.working and (soft := self._soft_limit(done)) is not None:
                self.wrap_up(soft)
        if self.phase == "wrap_up" and self._wrapup_steps >= self.config.wrapup_steps:
            self._stop(None)  # the wrap-up had its steps
        if self.stopped:
            return Clearance(False)
        pending, self._pending = self._pending, None
        return Clearance(True, pending)

    def admit(self, step: int) -> Message | None:
        """``begin_step`` for the loop: the wrap-up instruction to append, if it has just
        begun; raises ``Stopped`` when the run may not take another step."""
        gate = self.begin_step(step)
        if not gate.go:
            raise Stopped(self.stop_reason)
        return gate.instruction

    def _hard_limit(self, done: int) -> Trip | None:
        if done >= self.max_steps:
            return Trip("max_steps", f"{done} of {self.max_steps} steps", done, "stop")
        c = self.config
        if c.max_tokens and self.tokens_used >= c.max_tokens:
            return Trip(
                "max_tokens", f"{self.tokens_used:,} of {c.max_tokens:,} tokens", done, "stop"
            )
        elapsed = self.clock() - self.started
        if c.max_wall_s and elapsed >= c.max_wall_s:
            return Trip("max_wall_time", f"{elapsed:.0f} s of {c.max_wall_s:.0f} s", done, "stop")
        return None

    def _soft_limit(self, done: int) -> Trip | None:
        c, soft = self.config, self.config.soft_fraction
        if not c.wrapup_steps:
            return None
        if done >= 1 and (done >= soft * self.max_steps or self.max_steps - done <= c.wrapup_steps):
            return Trip("max_steps", f"{done} of {self.max_steps} steps", done, soft=True)
        if c.max_tokens and self.tokens_used >= soft * c.max_tokens:
            return Trip(
                "max_tokens", f"{self.tokens_used:,} of {c.max_tokens:,} tokens", done, soft=True
            )
        elapsed = self.clock() - self.started
        if c.max_wall_s and elapsed >= soft * c.max_wall_s:
            return Trip(
                "max_wall_time", f"{elapsed:.0f} s of {c.max_wall_s:.0f} s", done, soft=True
            )
        return None

    def wrap_up(self, trip: Trip) -> None:
        """Switch to wrap-up: record why, free the reserved slice for it, and queue the
        instruction for the next step."""
        if not self.config.wrapup_steps:
            self._stop(Trip(trip.reason, trip.detail, trip.step, "stop", trip.soft))
            return
        self._record(trip)
        if not self.working:
            return
        self.phase = "wrap_up"
        self.stop_reason = trip.reason
        self._release_slice()
        steps_left = min(self.config.wrapup_steps, self.max_steps - trip.step)
        self._pending = instruction(trip.reason, trip.detail, max(steps_left, 1))

    def _stop(self, trip: Trip | None) -> None:
        if trip is not None:
            self._record(trip)
            self.stop_reason = self.stop_reason or trip.reason
        self.phase = "stopped"
        self._release_slice()

    def _release_slice(self) -> None:
        if self.slice is not None:
            self.slice.close()
            self.slice = None

    def _record(self, trip: Trip) -> None:
        self.trips.append(trip)
        self._new_trips.append(trip)

    # --- the call's money -------------------------------------------------------------

    def reserve(
        self,
        rates_at: RatesAt,
        prompt_tokens: int,
        cache_ttl: str = "5m",
        attempts: int = 1,
        upper: int | None = None,
    ) -> Held | None:
        """Hold the call's worst case (``attempts`` times: earlier attempts lost in a crash
        were billed too). ``upper`` bounds the provider's count of the prompt (default: our
        count with ``TOKEN_MARGIN``). None: not affordable — the run has switched to wrap-up
        (call ``begin_step`` again) or stopped. With ``pause_at_cap``, BudgetReached instead,
        unless the budget can be topped up (a raised cap), when the call is held again."""
        while True:
            try:
                return self._reserve(rates_at, prompt_tokens, cache_ttl, attempts, upper)
            except BudgetReached:
                if not self.budget.top_up():
                    raise

    def _reserve(
        self,
        rates_at: RatesAt,
        prompt_tokens: int,
        cache_ttl: str,
        attempts: int,
        upper: int | None,
    ) -> Held | None:
        c = self.config
        bound = margin_tokens(prompt_tokens) if upper is None else max(upper, prompt_tokens)
        wanted = c.wrapup_output_tokens if self.phase == "wrap_up" else self.max_output_tokens
        wanted = min(wanted, self.max_output_tokens)
        if c.max_tokens:
            wanted = min(wanted, c.max_tokens - self.tokens_used - bound)
            if wanted < MIN_OUTPUT_TOKENS:
                return self.unaffordable(
                    "max_tokens",
                    f"the next call needs about {bound + MIN_OUTPUT_TOKENS:,} tokens; {c.max_tokens - self.tokens_used:,} of {c.max_tokens:,} are left",
                )
        q = quote(rates_at, prompt_tokens, cache_ttl, upper)
        if q is None:  # no price data for this model at this tier
            if self.budget.cap is not None:
                # Its worst case is unknown, so it cannot be held against the cap: the call
                # is never sent. (A run is refused up front when any model it could call is
                # unpriced; this holds whatever the router picks at run time.)
                return self.unaffordable(
                    "max_cost",
                    "no price data for the next call's model and service tier, so it cannot be held against the cost cap",
                )
            r = self.budget.reserve(Decimal(0))
            return (
                Held(r, wanted)
                if r is not None
                else self.unaffordable("max_cost", "the budget is spent")
            )
        available = self.budget.available
        max_tokens = q.affordable_output(available, wanted)
        r = None
        if max_tokens >= MIN_OUTPUT_TOKENS and attempts > 1:
            # The request must stay the one the lost attempt sent (a resume replays it), so
            # its max_tokens is a single attempt's; the lost ones are held beside it.
            r = self.budget.reserve(attempts * q.worst_case(max_tokens))
            if r is None:
                self._record(
                    Trip(
                        "lost_attempt_unreserved",
                        f"the budget cannot also hold the {attempts - 1} attempt(s) lost in a crash; their estimated cost is charged after the call",
                        self._steps_done + 1,
                        "record",
                    )
                )
        if r is None and max_tokens >= MIN_OUTPUT_TOKENS:
            r = self.budget.reserve(q.worst_case(max_tokens))
        if r is None:
            where = (
                f"; ${self.slice.available:.6f} more is kept for the wrap-up"
                if self.working and self.slice is not None and self.slice.available is not None
                else ""
            )
            fewest = " (the fewest a call is sent with)"
            return self.unaffordable(
                "max_cost",
                f"the next call's worst case (${q.worst_case(MIN_OUTPUT_TOKENS):.6f} or more) does "
                f"not fit the ${available:.6f} left of the ${self.budget.cap} cap: "
                f"{q.explain(MIN_OUTPUT_TOKENS, fewest)}{where}",
            )
        return Held(r, max_tokens)

    def hold_call(
        self, rates_at: RatesAt, prompt_tokens: int, output_tokens: int
    ) -> Reservation | None:
        """Hold the worst case of a call outside the step's own (a compaction's summary),
        at the output it asks for; a prompt of 0 tokens is no call and holds nothing. None:
        the budget cannot hold it (an unpriced call only fits an uncapped budget)."""
        q = quote(rates_at, prompt_tokens) if prompt_tokens else None
        if q is None:
            priced_free = not prompt_tokens or self.budget.cap is None
            return self.budget.reserve(Decimal(0)) if priced_free else None
        return self.budget.reserve(q.worst_case(output_tokens))

    def tight(self, rates_at: RatesAt, prompt_tokens: int, upper: int) -> bool:
        """Whether the prompt's error bound decides the next call: under a cap, its worst
        case at ``upper`` does not fit what is left (an exact count may still let it run)."""
        available = self.budget.available
        if available is None:
            return False
        q = quote(rates_at, prompt_tokens, upper=upper)
        return q is not None and q.worst_case(self.max_output_tokens) > available

    def unaffordable(self, reason: str, detail: str) -> Held | None:
        """No call can be held: wrap up or stop (or pause, at a cost cap that pauses). None,
        for the caller to return as its hold."""
        if reason == "max_cost" and self.config.pause_at_cap:
            raise BudgetReached(detail)
        trip = Trip(reason, detail, self._steps_done, soft=self.working)
        if self.working:
            self.wrap_up(trip)
        else:
            self._stop(Trip(reason, detail, self._steps_done, "stop"))
        return None

    def settle(self, held: Held, cost: Decimal | None) -> None:
        """Replace the hold by the call's real cost (unknown prices: the hold stays spent)."""
        overrun = self.budget.settle(
            held.reservation, held.reservation.amount if cost is None else cost
        )
        if overrun > 0:
            self._record(
                Trip(
                    "reservation_overrun",
                    f"the call cost ${overrun} more than its reserved worst case (token counts far off)",
                    self._steps_done + 1,
                    "record",
                )
            )

    def release(self, held: Held) -> None:
        self.budget.release(held.reservation)

    # --- after a step -----------------------------------------------------------------

    def after_step(self, record: StepRecord, tokens: int) -> None:
        self.tokens_used += tokens
        if self.phase == "wrap_up":
            self._wrapup_steps += 1
            return
        for trip in self.breakers.check(record):
            if trip.reason in ESCALATABLE and self.working and self.escalate(trip):
                self._record(Trip(trip.reason, trip.detail, trip.step, "escalate"))
            else:
                self.wrap_up(trip)

    def final_summary(
        self, submitted: str, messages: Sequence[Message], steps: int, spent: Decimal | None
    ) -> str:
        if usable(submitted):
            return submitted.removeprefix("submitted: ")
        reason = self.stop_reason or "stopped"
        detail = next((t.detail for t in self.trips if t.reason == reason), "")
        return summary_from_trajectory(messages, reason, detail, steps, spent)

    def finish(self) -> None:
        """Give back an unused wrap-up slice (a finished run needs none)."""
        self._release_slice()

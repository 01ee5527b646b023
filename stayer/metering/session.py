"""A metered session: what every door does around one provider call, in one place.

``SessionStates`` keeps each session's cache forensics and breakers (the least recently
used of ``MAX_SESSIONS`` are forgotten). ``settle_call`` settles a call's holds at the
price of what the provider reported, explains any cache break, judges the breakers and
returns the ledger entry, in a run step's shape plus ``charged_usd``, ``complete`` and
``max_tokens``. The gateway and ``stayer.meter`` both call it; the journal records the
entry (``stayer.journal.metered``).
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field

from stayer.context.forensics import CacheBreak
from stayer.guard.breakers import GuardConfig, Trip
from stayer.ledger import BreakerTrip, LedgerEntry
from stayer.metering.breakers import SessionBreakers
from stayer.metering.breaks import SessionForensics
from stayer.metering.meter import Admission, Meter, Metered
from stayer.metering.requests import Parsed
from stayer.metering.usage import Reading
from stayer.money import Usd
from stayer.usage import Usage

MAX_SESSIONS = 10_000  # sessions whose forensics and breakers one process keeps


@dataclass
class SessionState:
    forensics: SessionForensics
    breakers: SessionBreakers


@dataclass
class SessionStates:
    guard: GuardConfig = field(default_factory=GuardConfig)
    max_tokens_per_minute: int | None = None
    _states: OrderedDict[str, SessionState] = field(default_factory=OrderedDict)

    def get(self, session: str, provider: str, model: str) -> SessionState:
        st = self._states.get(session)
        if st is None:
            st = self._states[session] = SessionState(
                SessionForensics(provider, model),
                SessionBreakers(self.guard, self.max_tokens_per_minute),
            )
            while len(self._states) > MAX_SESSIONS:
                self._states.popitem(last=False)
        self._states.move_to_end(session)
        return st


@dataclass
class Settled:
    step: LedgerEntry  # the call's ledger entry, as a run's step has it
    metered: Metered
    cache_break: CacheBreak | None
    trips: list[Trip]


def settle_call(
    meter: Meter,
    state: SessionState,
    admission: Admission,
    parsed: Parsed,
    body: bytes,
    reading: Reading,
    latency_s: float,
) -> Settled:
    """Settle ``admission`` at what ``reading`` says the provider billed, and judge it."""
    metered = meter.settle(admission, reading)
    usage = metered.usage or Usage()
    model = reading.model or admission.model
    verdict = None
    if metered.usage is not None:
        verdict = state.forensics.observe(
            parsed.request,
            usage,
            model,
            admission.provider,
            reading.service_tier or admission.tier,
            meter.prices,
        )
    trips = state.breakers.after(metered.charged, body, usage.input_tokens + usage.output_tokens)
    step = LedgerEntry.made(
        step=0,
        model=model,
        usage=usage,
        cost=metered.cost,
        context_tokens=usage.input_tokens or admission.prompt_tokens,
        latency_s=latency_s,
        cache_break=verdict,
        breakers=[BreakerTrip.of(t) for t in trips],
    )
    step.charged_usd = None if metered.charged is None else Usd(metered.charged)
    step.complete = metered.complete
    step.max_tokens = admission.max_tokens
    return Settled(step, metered, verdict, trips)

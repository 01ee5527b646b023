"""Which model (and service tier) makes the next call.

The router keeps a *desired* model and the *current* one: roles (``planning`` for the
first steps, then ``execution``; ``summariser`` and ``subagent`` looked up by their
users), a cascade (cheapest first, one up on a failure signal, one down after
``relax_after`` good steps) and failover (the next model of ``[failover]`` after a call
that failed past the adapter's retries). Moving to a dearer model is made at once;
moving to a cheaper one, with ``cache_aware``, only when it pays back against the prompt
cache (:mod:`stayer.routing.switch`) within the expected remaining steps.
``cache_aware=False`` is the usual router, a baseline.

More: ``docs/internals.md#routing``.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from decimal import Decimal

from msgspec import UNSET, UnsetType

from stayer.context.policies import remaining_steps
from stayer.events import HandoffPriced
from stayer.guard.breakers import StepRecord, Trip
from stayer.models.base import Model
from stayer.models.caching import CacheRules, cache_rules
from stayer.pricing import PriceBook, Rates
from stayer.records import Record
from stayer.routing.switch import Outlook, Priced, SwitchQuote, price_switch
from stayer.routing.tiers import TierPolicy
from stayer.settings import StayerConfig

TRIPS_TO_ESCALATE = frozenset({"loop", "no_progress", "tool_errors"})
TEST_COMMAND = re.compile(
    r"\b(pytest|test|tests|make check|ctest|cargo test|go test|npm test|jest|unittest)\b"
)
# Before any step-down has been seen to end, assume one lasts this many steps (it counts
# as one observation of that length, so real observations soon dominate).
PRIOR_DOWN_SPELL = 10


@dataclass(frozen=True)
class Route:
    model: Model
    tier: str | None
    reason: str
    switched: bool = False
    quote: SwitchQuote | None = None  # the priced decision, when one was weighed
    latency_s: float | None = None  # modelled, when a latency target chose the tier

    def record(self) -> RouteRecord:
        """The route as its step's ledger entry keeps it."""
        q = self.quote
        return RouteRecord(
            model=self.model.spec,
            tier=self.tier,
            reason=self.reason,
            switched=self.switched,
            quote=UNSET if q is None else QuoteRecord.of(q),
            modelled_latency_s=UNSET if self.latency_s is None else round(self.latency_s, 3),
        )


class QuoteRecord(Record):
    """A priced switch decision: staying, switching and coming back, over a horizon."""

    stay_usd: Decimal
    switch_usd: Decimal
    comeback_usd: Decimal
    horizon_steps: int
    pays: bool

    @classmethod
    def of(cls, q: SwitchQuote) -> QuoteRecord:
        cent = Decimal("1e-6")
        return cls(
            stay_usd=q.stay.quantize(cent),
            switch_usd=q.switch.quantize(cent),
            comeback_usd=q.comeback.quantize(cent),
            horizon_steps=q.horizon,
            pays=q.pays,
        )


class RouteRecord(Record):
    """A model switch made, or one weighed and declined."""

    model: str | UnsetType = UNSET  # absent on a step whose only route note is a handoff
    tier: str | None | UnsetType = UNSET
    reason: str | UnsetType = UNSET
    switched: bool | UnsetType = UNSET
    quote: QuoteRecord | UnsetType = UNSET
    modelled_latency_s: float | UnsetType = UNSET
    handoff: HandoffPriced | UnsetType = UNSET  # a team's handoff (stayer.teams)


@dataclass(frozen=True)
class RouteView:
    """What the router may know before a step."""

    step: int
    max_steps: int
    context_tokens: int
    prefix_tokens: int  # the pinned prefix (survives compactions on explicit caches)
    compactions: int  # how many times history was rewritten so far
    now: float
    messages: int = 0  # messages in the history (explicit caches look back a bounded number)


@dataclass
class _Seen:
    at: float
    tokens: int
    compactions: int
    messages: int


@dataclass
class Router:
    main: Model
    prices: PriceBook
    roles: Mapping[str, Model] = field(default_factory=dict)
    planning_steps: int = 0
    cascade: Sequence[Model] = ()
    escalate_after_errors: int = 2
    escalate_on_loop: bool = True
    escalate_after_failing_tests: int = 2
    relax_after: int = 5
    failover_to: Mapping[str, Sequence[Model]] = field(default_factory=dict)
    cache_aware: bool = True
    tiers: TierPolicy | None = None
    service_tier: str | None = None  # fixed tier when no tier policy

    level: int = field(default=0, init=False)
    current: Model | None = field(default=None, init=False)
    down_spells: list[int] = field(default_factory=list, init=False)  # steps each step-down lasted
    _down_since: int | None = field(default=None, init=False)
    down: set[str] = field(default_factory=set, init=False)
    _seen: dict[str, _Seen] = field(default_factory=dict, init=False)
    _errors: int = field(default=0, init=False)
    _failing_tests: int = field(default=0, init=False)
    _good: int = field(default=0, init=False)
    _growth: float = field(default=0.0, init=False)
    output_per_step: float = field(default=0.0, init=False)  # output tokens per call (EWMA)
    _interval: float = field(default=0.0, init=False)
    _last: RouteView | None = field(default=None, init=False)

    @classmethod
    def from_config(
        cls,
        config: StayerConfig,
        main: Model,
        make_model: Callable[[str], Model],
        prices: PriceBook,
        service_tier: str | None = None,
    ) -> Router:
        built: dict[str, Model] = {main.spec: main}

        def model(spec: str) -> Model:
            if spec not in built:
                built[spec] = make_model(spec)
            return built[spec]

        m = config.models
        roles = {
            role: model(spec)
            for role in ("planning", "execution", "summariser", "subagent")
            if (spec := getattr(m, role))
        }
        c = config.cascade
        t = config.tiers
        return cls(
            main=main,
            prices=prices,
            roles=roles,
            planning_steps=m.planning_steps if "planning" in roles else 0,
            cascade=[model(s) for s in c.models] if c else (),
            escalate_after_errors=c.escalate_after_errors if c else 0,
            escalate_on_loop=c.escalate_on_loop if c else False,
            escalate_after_failing_tests=c.escalate_after_failing_tests if c else 0,
            relax_after=c.relax_after if c else 0,
            failover_to={
                primary: [model(s) for s in fallbacks]
                for primary, fallbacks in config.failover.items()
            },
            cache_aware=config.routing.cache_aware,
            tiers=TierPolicy(t.latency_target_s, t.batch)
            if (t.latency_target_s or t.batch)
            else None,
            service_tier=service_tier,
        )

    def role(self, name: str) -> Model:
        """The model for a role (summariser, subagent, …); the main model by default."""
        return self.roles.get(name, self.main)

    # --- choosing -----------------------------------------------------------------------

    def choose(self, view: RouteView) -> Route:
        self._learn(view)
        want, why = self._desired(view)
        cur = self.current
        quote = None
        if cur is None or cur.spec in self.down or want is cur:
            chosen, switched = want, cur is not None and want is not cur
        elif not self.cache_aware or self._dearer(want, cur):
            chosen, switched = want, True
        else:
            quote = self.quote(cur, want, view)
            chosen, switched = (want, True) if quote is None or quote.pays else (cur, False)
            if not switched:
                why = f"staying on {cur.spec}: switching to {want.spec} would not pay back"
        self.current = chosen
        self._seen[chosen.spec] = _Seen(
            view.now, view.context_tokens, view.compactions, view.messages
        )
        tier, latency = self._tier(chosen, view)
        return Route(chosen, tier, why, switched, quote, latency)

    def _desired(self, view: RouteView) -> tuple[Model, str]:
        if "planning" in self.roles and view.step <= self.planning_steps:
            want, why = self.roles["planning"], "planning phase"
        elif self.cascade:
            want, why = self.cascade[self.level], f"cascade level {self.level}"
        else:
            want, why = self.roles.get("execution", self.main), "execution"
        seen: set[str] = set()
        while want.spec in self.down and want.spec not in seen:
            seen.add(want.spec)
            live = [m for m in self.failover_to.get(want.spec, ()) if m.spec not in self.down]
            if not live:
                break
            want, why = live[0], f"failover from {want.spec}"
        return want, why

    def _rates(self, m: Model, tier: str | None = None) -> Callable[[int], Rates | None]:
        return lambda tokens: self.prices.rates(
            m.model_id, m.provider, tier or self.service_tier, tokens
        )

    def _dearer(self, a: Model, b: Model) -> bool:
        """Is ``a`` the pricier model (a stronger one, by the cascade's own assumption)?"""
        ra, rb = self._rates(a)(0), self._rates(b)(0)
        if ra is None or rb is None:
            return True  # unknown prices: do not hold a quality switch back on cost grounds
        return ra.input + ra.output > rb.input + rb.output

    def quote(self, current: Model, candidate: Model, view: RouteView) -> SwitchQuote | None:
        """The priced switch from ``current`` to ``candidate`` at this step."""
        remaining = remaining_steps(view.step, view.max_steps)
        stepping_down = (
            bool(self.cascade) and self.level < len(self.cascade) - 1 and current in self.cascade
        )
        if not stepping_down:
            outlook = Outlook(
                view.context_tokens,
                self._growth,
                self.output_per_step,
                max(1, remaining),
                self._interval,
            )
            return price_switch(self._priced(current, view), self._priced(candidate, view), outlook)
        # A step-down lasts until the next escalation: how long past ones lasted (with one
        # prior observation) gives the horizon, and the share that outlasted the current
        # model's cache (TTL, or an explicit cache's lookback) the chance that coming back
        # re-bills the whole context on it.
        spells = self.down_spells
        mean = (sum(spells) + PRIOR_DOWN_SPELL) / (len(spells) + 1)
        cold_after = self._steps_until_cold(current, view)
        prior_cold = (1 - 1 / PRIOR_DOWN_SPELL) ** cold_after  # geometric, of the prior's mean
        cold_p = (sum(1 for n in spells if n > cold_after) + prior_cold) / (len(spells) + 1)
        horizon = max(1, int(min(remaining, mean)))
        comeback_p = min(1.0, remaining / mean)
        outlook = Outlook(
            view.context_tokens, self._growth, self.output_per_step, horizon, self._interval
        )
        return price_switch(
            self._priced(current, view), self._priced(candidate, view), outlook, comeback_p, cold_p
        )

    def _steps_until_cold(self, m: Model, view: RouteView) -> float:
        rules = rules_for(m)
        steps = rules.ttl_s / self._interval if self._interval > 0 else float("inf")
        if rules.mode == "explicit" and view.messages and view.step > 1:
            per_step = view.messages / (view.step - 1)
            steps = min(steps, rules.lookback_blocks / max(per_step, 1.0))
        return steps

    def _priced(self, m: Model, view: RouteView) -> Priced:
        rules = rules_for(m)
        return Priced(
            m.spec,
            self._rates(m),
            rules.mode == "explicit",
            self._warm(m, rules, view),
            rules.ttl_s,
        )

    def _warm(self, m: Model, rules: CacheRules, view: RouteView) -> int:
        """How much of the current context ``m`` still has cached."""
        seen = self._seen.get(m.spec)
        if seen is None or view.now - seen.at >= rules.ttl_s:
            return 0
        explicit = rules.mode == "explicit"
        if seen.compactions != view.compactions or (
            explicit and view.messages - seen.messages > rules.lookback_blocks
        ):
            # Rewritten since, or too far back for the provider's lookback: only the pinned
            # prefix (explicit breakpoint at its end) is still found.
            return view.prefix_tokens if explicit else 0
        return min(seen.tokens, view.context_tokens)

    def _tier(self, m: Model, view: RouteView) -> tuple[str | None, float | None]:
        if self.tiers is None:
            return self.service_tier, None
        out = int(self.output_per_step) or 500

        def rates_for(tier: str | None) -> Rates | None:
            return self.prices.rates(m.model_id, m.provider, tier, view.context_tokens)

        choice = self.tiers.choose(m.provider, rates_for, view.context_tokens, out)
        return choice.tier, choice.latency_s

    def _learn(self, view: RouteView) -> None:
        last, self._last = self._last, view
        if last is None:
            return
        grown = max(view.context_tokens - last.context_tokens, 0)
        interval = max(view.now - last.now, 0.0)
        self._growth = grown if self._growth == 0 else 0.7 * self._growth + 0.3 * grown
        self._interval = interval if self._interval == 0 else 0.7 * self._interval + 0.3 * interval

    # --- signals ------------------------------------------------------------------------

    def escalate(self, reason: str = "") -> bool:
        """One cascade level up; False at the top (or without a cascade)."""
        self._good = 0
        if not self.cascade or self.level >= len(self.cascade) - 1:
            return False
        self.level += 1
        if self._down_since is not None:
            spell = self._now_step() - self._down_since
            if spell > 0:  # lowered and raised again before any step ran: no spell
                self.down_spells.append(spell)
            self._down_since = None
        return True

    def relax(self) -> None:
        """A good step; after ``relax_after`` of them the cascade wants one level down."""
        self._good += 1
        if self.cascade and self.level > 0 and self._good >= max(self.relax_after, 1):
            self.level -= 1
            self._good = 0
            if self._down_since is None:
                self._down_since = self._now_step()

    def _now_step(self) -> int:
        return self._last.step if self._last is not None else 0

    def on_trip(self, trip: Trip) -> bool:
        """The guard's breaker tripped: escalate if that is what the cascade does for it."""
        return (
            self.escalate_on_loop
            and trip.reason in TRIPS_TO_ESCALATE
            and self.escalate(trip.reason)
        )

    def record_step(self, record: StepRecord) -> None:
        """Failure signals of a finished step: failed tool calls, failing test runs."""
        self.output_per_step = (
            record.output_tokens
            if self.output_per_step == 0
            else 0.7 * self.output_per_step + 0.3 * record.output_tokens
        )
        failed = bool(record.calls) and all(c.failed for c in record.calls)
        tests = [c for c in record.calls if c.name == "bash" and TEST_COMMAND.search(c.arguments)]
        self._errors = self._errors + 1 if failed else 0
        if tests:
            self._failing_tests = self._failing_tests + 1 if any(c.failed for c in tests) else 0
        if self.escalate_after_errors and self._errors >= self.escalate_after_errors:
            self._errors = 0
            self.escalate("repeated errors")
        elif (
            self.escalate_after_failing_tests
            and self._failing_tests >= self.escalate_after_failing_tests
        ):
            self._failing_tests = 0
            self.escalate("failing tests")
        elif not failed:
            self.relax()

    def failover(self, failed: Model) -> Model | None:
        """Take ``failed`` out of rotation; the model that replaces it, if any."""
        self.down.add(failed.spec)
        live = [m for m in self.failover_to.get(failed.spec, ()) if m.spec not in self.down]
        return live[0] if live else None

    def models(self) -> list[Model]:
        """Every model this router may call (for price checks up front)."""
        out = {self.main.spec: self.main}
        for m in [
            *self.roles.values(),
            *self.cascade,
            *(x for fs in self.failover_to.values() for x in fs),
        ]:
            out.setdefault(m.spec, m)
        return list(out.values())


def rules_for(m: Model) -> CacheRules:
    """The model's provider caching rules; automatic caching when none are documented."""
    try:
        return cache_rules(m.provider, m.model_id)
    except ValueError:
        return CacheRules("automatic", 1024)


__all__ = ["Route", "RouteView", "Router", "rules_for"]

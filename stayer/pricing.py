"""Usage × model × service tier → Cost, in exact ``Decimal`` USD.

Why this module exists: the cost equation (DESIGN.md) is only useful if every call is
priced exactly — cache reads, 5 m and 1 h cache writes, long-context tiers and service
tiers included — and if a price we do not know is reported as *unknown*, never as 0
(a silent 0 would let a budget be overshot). Prices come from genai-prices, the
maintained community price data; stayer adds only what it lacks:

* service tiers genai-prices has no variant for (a small built-in table shipped as
  ``stayer/data/price_overrides.toml``, each figure commented with its source);
* user overrides: models genai-prices does not know (fine-tunes, self-hosted
  endpoints), negotiated prices, or tier multipliers.

Details and rationale: docs/notes.md, ``stayer/pricing.py``.
"""

from __future__ import annotations

import os
import pkgutil
import tomllib
from collections.abc import Collection, Iterator, Mapping
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from decimal import Decimal, InvalidOperation
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

import msgspec

from stayer.errors import ConfigError
from stayer.money import MTOK, Usd, plain
from stayer.usage import Usage

if TYPE_CHECKING:
    from genai_prices import Usage as GPUsage
    from genai_prices.types import ModelInfo, ModelPrice, Provider, TieredPrices

# genai-prices is imported where it is first needed: importing it and its price data takes
# a quarter of a second, longer than an audit of many megabytes whose rates are compiled
# (see ``PriceBook.rate_steps`` and ``stayer.audit.costing``).

__all__ = ["Cost", "PriceBook", "Rates", "STANDARD_TIERS"]


#: Tier names that mean "standard pricing" (request-side and response-side spellings).
STANDARD_TIERS = frozenset({"", "default", "standard", "auto", "standard_only", "on_demand"})

_RATE_KEYS = ("input", "cache_read", "cache_write_5m", "cache_write_1h", "output")
_MODEL_KEYS = frozenset({"provider", *_RATE_KEYS})
_TIER_KEYS = frozenset({"multiplier", "models"})
_BUILTIN = "price_overrides.toml"


@dataclass(frozen=True)
class Rates:
    """Prices in force, per million tokens (exact ``Decimal``)."""

    input: Decimal
    cache_read: Decimal
    cache_write_5m: Decimal
    cache_write_1h: Decimal
    output: Decimal
    currency: str = "USD"

    def scaled(self, k: Decimal) -> Rates:
        """Every rate multiplied by ``k`` (a service-tier multiplier)."""
        if k == 1:
            return self
        return replace(self, **{n: getattr(self, n) * k for n in _RATE_KEYS})

    def dearest(self, other: Rates) -> Rates:
        """Each rate the higher of the two (a worst case over two possible tiers)."""
        return replace(self, **{n: max(getattr(self, n), getattr(other, n)) for n in _RATE_KEYS})

    def parts(self, usage: Usage) -> dict[str, Decimal]:
        """The cost of ``usage`` by kind of token: cache ``read``, cache ``write`` (5 m and
        1 h), ``uncached`` input and ``output``, same rules as genai-prices."""
        uncached = usage.uncached_input_tokens
        if uncached < 0:
            raise ValueError(
                f"inconsistent usage: cache reads+writes exceed input_tokens ({usage!r})"
            )
        return {
            "read": self.cache_read * usage.cache_read_tokens / MTOK,
            "write": (
                self.cache_write_5m * usage.cache_write_5m_tokens
                + self.cache_write_1h * usage.cache_write_1h_tokens
            )
            / MTOK,
            "uncached": self.input * uncached / MTOK,
            "output": self.output * usage.output_tokens / MTOK,
        }

    def price(self, usage: Usage) -> tuple[Decimal, Decimal]:
        """(input cost, output cost) of ``usage`` at these rates, same rules as genai-prices."""
        p = self.parts(usage)
        return p["read"] + p["write"] + p["uncached"], p["output"]

    def to_dict(self) -> dict[str, str]:
        d = {n: plain(getattr(self, n)) for n in _RATE_KEYS}
        d["currency"] = self.currency
        return d


class Cost:
    """The price of one call (or a sum). ``total is None`` means unknown — never 0. (A plain
    class: in a ledger entry's JSON a cost is its total's text, ``to_json``; one read back
    from JSON knows only its total.)"""

    __slots__ = ("total", "input", "output", "model_ref", "provider", "tier", "long_context")

    def __init__(
        self,
        total: Decimal | None,
        input: Decimal | None,
        output: Decimal | None,
        model_ref: str,
        provider: str | None = None,
        tier: str | None = None,
        long_context: bool = False,  # priced at a long-context (>threshold) tier
    ) -> None:
        self.total, self.input, self.output = total, input, output
        self.model_ref, self.provider, self.tier = model_ref, provider, tier
        self.long_context = long_context

    def _key(self) -> tuple[object, ...]:
        return tuple(getattr(self, n) for n in self.__slots__)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Cost) and self._key() == other._key()

    def __hash__(self) -> int:
        return hash(self._key())

    def __repr__(self) -> str:
        return "Cost(" + ", ".join(f"{n}={getattr(self, n)!r}" for n in self.__slots__) + ")"

    @property
    def known(self) -> bool:
        return self.total is not None

    def to_json(self) -> str:
        """The total as a JSON-ready string, or the literal ``"unknown"``."""
        return Usd(self.total).to_json()

    def to_dict(self) -> dict[str, Any]:
        def m(d: Decimal | None) -> str:
            return Usd(d).to_json()

        return {
            "total": m(self.total),
            "input": m(self.input),
            "output": m(self.output),
            "model": self.model_ref,
            "provider": self.provider,
            "tier": self.tier,
            "long_context": self.long_context,
        }

    @classmethod
    def unknown(cls, model_ref: str, provider: str | None = None, tier: str | None = None) -> Cost:
        return cls(None, None, None, model_ref, provider, tier)


# --- override tables -----------------------------------------------------------------

# msgspec Structs, not dataclasses: a Struct class is made in a tenth of a dataclass's
# time, and every command that prices makes these at its start.


class _TierRule(msgspec.Struct, frozen=True):
    multiplier: Decimal
    models: tuple[str, ...] = ()  # lower-case model-id prefixes; empty = every model

    def applies(self, names: tuple[str, ...]) -> bool:
        return not self.models or any(n.startswith(p) for n in names for p in self.models)


class _ModelOverride(msgspec.Struct, frozen=True):
    rates: Rates
    provider: str | None


class _Table(msgspec.Struct, frozen=True):
    models: Mapping[str, _ModelOverride] = msgspec.field(default_factory=dict)
    tiers: Mapping[tuple[str, str], _TierRule] = msgspec.field(default_factory=dict)

    def tier_rule(
        self, provider: str | None, tier: str, names: tuple[str, ...]
    ) -> _TierRule | None:
        if provider is None:
            return None
        rule = self.tiers.get((provider.lower(), tier))
        return rule if rule is not None and rule.applies(names) else None


def _decimal(v: object, where: str, name: str) -> Decimal:
    if isinstance(v, bool) or not isinstance(v, (str, int, Decimal)):
        raise ConfigError(f'{where}: expected a decimal number as a string, e.g. "2.50"')
    try:
        d = Decimal(v.strip() if isinstance(v, str) else v)
    except InvalidOperation:
        raise ConfigError(f"{where}: {v!r} is not a decimal number") from None
    if not d.is_finite() or d < 0:
        raise ConfigError(f"{where}: {name} must be a finite number >= 0, got {v!r}")
    return d


def _check_keys(src: str, here: str, body: Mapping[str, Any], allowed: Collection[str]) -> None:
    for k in body:
        if k not in allowed:
            raise ConfigError(
                f"{src}: {here}.{k}: unknown key; expected one of {', '.join(sorted(allowed))}"
            )


def _mapping(value: Any, where: str, expected: str) -> Mapping[str, Any]:
    """``value`` if it is a table; else the error saying what ``where`` should hold."""
    if not isinstance(value, Mapping):
        raise ConfigError(f"{where}: expected {expected}")
    return value


def _parse_table(data: Mapping[str, Any], src: str) -> _Table:
    """Validate a parsed override document; every error names ``src`` and the field."""
    for key in data:
        if key not in ("models", "tiers"):
            raise ConfigError(f"{src}: {key}: unknown top-level key; expected [models] or [tiers]")
    models: dict[str, _ModelOverride] = {}
    raw_models = _mapping(
        data.get("models", {}), f"{src}: models", 'a table of [models."name"] tables'
    )
    for name, body in raw_models.items():
        here = f"models.{name}"
        body = _mapping(body, f"{src}: {here}", "a table")
        _check_keys(src, here, body, _MODEL_KEYS)
        for k in ("input", "output"):
            if k not in body:
                raise ConfigError(f"{src}: {here}.{k}: required (USD per million tokens)")
        r = {k: _decimal(body[k], f"{src}: {here}.{k}", k) for k in _RATE_KEYS if k in body}
        r.setdefault("cache_read", r["input"])
        r.setdefault("cache_write_5m", r["input"])
        r.setdefault("cache_write_1h", r["cache_write_5m"])
        provider = body.get("provider")
        if provider is not None and not isinstance(provider, str):
            raise ConfigError(f"{src}: {here}.provider: expected a string")
        rates = Rates(
            r["input"], r["cache_read"], r["cache_write_5m"], r["cache_write_1h"], r["output"]
        )
        models[name.lower()] = _ModelOverride(rates, provider.lower() if provider else None)
    tiers: dict[tuple[str, str], _TierRule] = {}
    raw_tiers = _mapping(data.get("tiers", {}), f"{src}: tiers", "[tiers.<provider>.<tier>] tables")
    for provider, by_tier in raw_tiers.items():
        where = f"{src}: tiers.{provider}"
        for tier, body in _mapping(by_tier, where, f"[tiers.{provider}.<tier>] tables").items():
            here = f"tiers.{provider}.{tier}"
            body = _mapping(body, f"{src}: {here}", 'a table with multiplier = "…"')
            _check_keys(src, here, body, _TIER_KEYS)
            if "multiplier" not in body:
                raise ConfigError(f"{src}: {here}.multiplier: required")
            mult = _decimal(body["multiplier"], f"{src}: {here}.multiplier", "multiplier")
            prefixes = body.get("models", [])
            if not isinstance(prefixes, list) or not all(isinstance(p, str) for p in prefixes):
                raise ConfigError(f"{src}: {here}.models: expected a list of model-id prefixes")
            tiers[(provider.lower(), tier.lower())] = _TierRule(
                mult, tuple(p.lower() for p in prefixes)
            )
    return _Table(models, tiers)


def _parse_text(text: str, src: str) -> _Table:
    try:
        data = tomllib.loads(text, parse_float=Decimal)
    except tomllib.TOMLDecodeError as e:
        msg = " ".join(str(e).split())
        raise ConfigError(f"{src}: invalid TOML: {msg}") from None
    return _parse_table(data, src)


def _load_file(path: Path) -> _Table:
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"{path}: price override file not found") from None
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"{path}: cannot read price override file: {e}") from None
    return _parse_text(text, str(path))


@cache
def _builtin_table() -> _Table:
    # pkgutil, not importlib.resources: the same package data through the package's loader,
    # without importing tempfile, shutil and random into every command that prices
    data = pkgutil.get_data("stayer", f"data/{_BUILTIN}")
    assert data is not None  # (None only from a loader that cannot read data)
    return _parse_text(data.decode("utf-8"), f"stayer/data/{_BUILTIN}")


# --- genai-prices helpers ------------------------------------------------------------


def _at_size(price: Decimal | TieredPrices | None, prompt_tokens: int) -> Decimal | None:
    """The per-MTok rate for a prompt of ``prompt_tokens`` (genai-prices' cliff rule)."""
    if price is None or isinstance(price, Decimal):  # else TieredPrices
        return price
    for tier in reversed(price.tiers):
        if prompt_tokens > tier.start:
            return tier.price
    return price.base


def _long_context(mp: ModelPrice, prompt_tokens: int) -> bool:
    from genai_prices.types import TieredPrices

    return any(
        isinstance(p, TieredPrices) and any(prompt_tokens > t.start for t in p.tiers)
        for p in mp.__dict__.values()
    )


def _tier_contexts(tier: str) -> tuple[dict[str, str], ...]:
    if tier == "batch":
        return ({"processing": "batch"},)
    return ({"service_tier": tier}, {"speed": tier})


def _variant_context(
    model: ModelInfo, provider: Provider, tier: str, at: datetime
) -> dict[str, str] | None:
    """The genai-prices ``price_context`` that selects ``tier`` for this model, if any."""
    if not any(model is m for m in provider.models):
        return None  # genai-prices ignores variants for models reached via a fallback provider
    for ctx in _tier_contexts(tier):
        for v in model.price_variants or ():
            if v.constraint is not None and not v.constraint.active(at):
                continue
            if all(ctx.get(k) == val for k, val in v.when.items()):
                return ctx
    return None


def _gp_usage(u: Usage) -> GPUsage:
    from genai_prices import Usage as GPUsage

    # reasoning_tokens is deliberately not passed: it is already inside output_tokens.
    return GPUsage(
        input_tokens=u.input_tokens,
        cache_read_tokens=u.cache_read_tokens,
        cache_write_tokens=u.cache_write_tokens,
        cache_write_5m_tokens=u.cache_write_5m_tokens,
        cache_write_1h_tokens=u.cache_write_1h_tokens,
        output_tokens=u.output_tokens,
    )


def _norm_tier(service_tier: str | None) -> str | None:
    if service_tier is None:
        return None
    t = service_tier.strip().lower()
    return None if t in STANDARD_TIERS else t


class _Plan(msgspec.Struct, frozen=True):
    """How one (model, provider, tier) is priced."""

    provider: str | None
    multiplier: Decimal | None  # None: no known price for the requested tier
    override: Rates | None = None
    gp_provider: Provider | None = None
    gp_model: ModelInfo | None = None
    context: dict[str, str] | None = None


class PriceBook:
    """Prices calls. Holds its override tables; no module-level mutable state."""

    def __init__(self, overrides: Path | None = None) -> None:
        self.overrides_path = Path(overrides) if overrides is not None else None
        self._builtin = _builtin_table()
        self._user = _load_file(self.overrides_path) if self.overrides_path else _Table()

    @classmethod
    def load(cls, path: Path | None = None) -> PriceBook:
        """``path``, else ``$STAYER_PRICES`` (must exist), else ``./stayer-prices.toml`` if present."""
        if path is None:
            env = os.environ.get("STAYER_PRICES")
            if env:
                path = Path(env)
            elif Path("stayer-prices.toml").is_file():
                path = Path("stayer-prices.toml")
        return cls(path)

    # --- public API ---------------------------------------------------------------

    def knows(
        self, model_id: str, provider: str | None = None, service_tier: str | None = None
    ) -> bool:
        """Can a call to ``model_id`` at ``service_tier`` be priced (so held to a budget)?"""
        plan = self._plan(model_id, provider, _norm_tier(service_tier), datetime.now(UTC))
        return plan is not None and plan.multiplier is not None

    def closest(self, model_id: str, provider: str, n: int = 3) -> list[str]:
        """Priced model ids of ``provider`` that look most like ``model_id`` (for "did you
        mean"): the price data's and the override tables'."""
        import difflib

        from genai_prices.data_snapshot import get_snapshot

        ids = {m.id for p in get_snapshot().providers if p.id == provider for m in p.models}
        for table in (self._user, self._builtin):
            ids |= {ref for ref, o in table.models.items() if o.provider in (None, provider)}
        return difflib.get_close_matches(model_id.lower(), sorted(ids), n=n, cutoff=0.5)

    def cost(
        self,
        usage: Usage,
        model_id: str,
        provider: str | None = None,
        service_tier: str | None = None,
        *,
        at: datetime | None = None,
    ) -> Cost:
        """Price one call's normalised usage. Unknown model, provider or tier → unknown cost."""
        at = at or datetime.now(UTC)
        tier = _norm_tier(service_tier)
        plan = self._plan(model_id, provider, tier, at)
        if plan is None or plan.multiplier is None:
            return Cost.unknown(model_id, plan.provider if plan else provider, tier)
        if plan.override is not None:
            inp, out = plan.override.scaled(plan.multiplier).price(usage)
            return Cost(inp + out, inp, out, model_id, plan.provider, tier)
        assert plan.gp_model is not None and plan.gp_provider is not None
        calc = plan.gp_model.calc_price(
            _gp_usage(usage),
            plan.gp_provider,
            genai_request_timestamp=at,
            price_context=plan.context,
        )
        inp = calc.input_price * plan.multiplier
        out = calc.output_price * plan.multiplier
        return Cost(
            inp + out,
            inp,
            out,
            model_id,
            plan.provider,
            tier,
            long_context=_long_context(calc.model_price, usage.input_tokens),
        )

    def rates(
        self,
        model_id: str,
        provider: str | None = None,
        service_tier: str | None = None,
        prompt_tokens: int = 0,
        *,
        at: datetime | None = None,
    ) -> Rates | None:
        """Rates in force for a prompt of ``prompt_tokens`` (long-context tier included)."""
        at = at or datetime.now(UTC)
        plan = self._plan(model_id, provider, _norm_tier(service_tier), at)
        if plan is None or plan.multiplier is None:
            return None
        if plan.override is not None:
            return plan.override.scaled(plan.multiplier)
        assert plan.gp_model is not None
        mp = plan.gp_model.get_prices(at, plan.context)
        return _rates_of(mp, prompt_tokens).scaled(plan.multiplier)

    def rate_steps(
        self, model_id: str, provider: str | None = None, service_tier: str | None = None
    ) -> list[tuple[int, Rates | None]] | None:
        """What :meth:`rates` answers for every prompt size, as steps ``[(from_tokens, rates),
        …]`` in ascending order (rates None: the price is unknown) — when the answer does not
        depend on the time of the call; None when it does (dated prices, time-of-day
        discounts, time-limited variants): then ask :meth:`rates` per call time."""
        from genai_prices.types import ModelPrice, TieredPrices

        tier = _norm_tier(service_tier)
        if self._override(model_id, provider) is None:
            found = self._find(model_id, provider)
            if found is not None and not (
                isinstance(found[1].prices, ModelPrice)
                # price variants are only looked at for a non-standard tier
                and (
                    tier is None or all(v.constraint is None for v in found[1].price_variants or ())
                )
            ):
                return None
        at = datetime.now(UTC)  # any time gives the same answer from here on
        plan = self._plan(model_id, provider, tier, at)
        if plan is None or plan.multiplier is None:
            return [(0, None)]
        if plan.override is not None:
            return [(0, plan.override.scaled(plan.multiplier))]
        assert plan.gp_model is not None
        mp = plan.gp_model.get_prices(at, plan.context)
        # the cliff rule: a tier applies to prompts longer than its start
        starts = sorted(
            {
                t.start + 1
                for p in mp.__dict__.values()
                if isinstance(p, TieredPrices)
                for t in p.tiers
            }
        )
        return [(n, _rates_of(mp, n).scaled(plan.multiplier)) for n in (0, *starts)]

    def fingerprint(self) -> str:
        """Changes whenever an answer of this book could: the price data and override files.
        The text itself (under a kilobyte), not a digest of it: importing hashlib loads
        OpenSSL, which takes an audit longer than comparing the text does."""
        from importlib.util import find_spec

        spec = find_spec("genai_prices")
        data = Path(spec.origin).with_name("data.py") if spec is not None and spec.origin else None
        parts = [repr(self._builtin), repr(self._user)]
        try:
            st = data.stat() if data is not None else None
            parts.append(f"{data}:{st.st_size}:{st.st_mtime_ns}" if st else "")
        except OSError:
            parts.append("")
        return "\n".join(parts)

    # --- resolution ---------------------------------------------------------------

    def _override(self, model_id: str, provider: str | None) -> _ModelOverride | None:
        for ref, prov in _candidates(model_id, provider):
            for table in (self._user, self._builtin):
                o = table.models.get(ref.lower())
                if o is not None and (
                    prov is None or o.provider is None or o.provider == prov.lower()
                ):
                    return o
        return None

    def _find(self, model_id: str, provider: str | None) -> tuple[Provider, ModelInfo] | None:
        """The genai-prices provider and model ``model_id`` names, priced or not."""
        from genai_prices.data_snapshot import get_snapshot

        snap = get_snapshot()
        for ref, prov in _candidates(model_id, provider):
            try:
                return snap.find_provider_model(ref, None, prov, None)
            except LookupError:
                continue
        return None

    def _lookup(
        self, model_id: str, provider: str | None, at: datetime | None = None
    ) -> tuple[Provider, ModelInfo] | None:
        found = self._find(model_id, provider)
        if found is None:
            return None
        mp = found[1].get_prices(at or datetime.now(UTC))
        if mp.input_mtok is None and mp.output_mtok is None:
            return None  # not priced per token (audio seconds, images…): not ours to guess
        return found

    def _multiplier(
        self,
        tier: str | None,
        provider: str | None,
        names: tuple[str, ...],
        found: tuple[Provider, ModelInfo] | None = None,
        at: datetime | None = None,
    ) -> tuple[Decimal, dict[str, str] | None] | None:
        """(multiplier, genai-prices price_context) for ``tier``; None if no price is known.

        Order: user [tiers] rule, genai-prices variant, built-in [tiers] rule.
        """
        if tier is None:
            return Decimal(1), None
        rule = self._user.tier_rule(provider, tier, names)
        if rule is not None:
            return rule.multiplier, None
        if found is not None:
            ctx = _variant_context(found[1], found[0], tier, at or datetime.now(UTC))
            if ctx is not None:
                return Decimal(1), ctx
        rule = self._builtin.tier_rule(provider, tier, names)
        if rule is not None:
            return rule.multiplier, None
        return None

    def _plan(
        self, model_id: str, provider: str | None, tier: str | None, at: datetime
    ) -> _Plan | None:
        names = tuple(ref.lower() for ref, _ in _candidates(model_id, provider))
        o = self._override(model_id, provider)
        if o is not None:
            prov = o.provider or (provider.lower() if provider else None)
            m = self._multiplier(tier, prov, names)
            return _Plan(prov, None if m is None else m[0], override=o.rates)
        found = self._lookup(model_id, provider, at)
        if found is None:
            return None
        gp_provider, gp_model = found
        names = (*names, gp_model.id.lower())
        m = self._multiplier(tier, gp_provider.id, names, found, at)
        return _Plan(
            gp_provider.id,
            None if m is None else m[0],
            gp_provider=gp_provider,
            gp_model=gp_model,
            context=None if m is None else m[1],
        )


def _candidates(model_id: str, provider: str | None) -> Iterator[tuple[str, str | None]]:
    """``model_id`` as given, then with a ``sim:`` or ``provider:``/``provider/`` prefix split off."""
    from genai_prices.data_snapshot import find_provider_by_id, get_snapshot

    yield model_id, provider
    for sep in (":", "/"):
        if sep not in model_id:
            continue
        prefix, rest = model_id.split(sep, 1)
        if prefix.lower() == "sim":
            yield from _candidates(rest, provider)
        elif (
            rest
            and (provider is None or provider.lower() == prefix.lower())
            and find_provider_by_id(get_snapshot().providers, prefix)
        ):
            yield rest, prefix.lower()


def _rates_of(mp: ModelPrice, prompt_tokens: int) -> Rates:
    def r(key: str) -> Decimal | None:
        return _at_size(getattr(mp, key, None), prompt_tokens)

    inp = r("input_mtok")
    inp = Decimal(0) if inp is None else inp
    read = r("cache_read_mtok")
    w5 = r("cache_write_5m_mtok")
    w5 = r("cache_write_mtok") if w5 is None else w5
    w5 = inp if w5 is None else w5
    w1 = r("cache_write_1h_mtok")
    out = r("output_mtok")
    return Rates(
        input=inp,
        cache_read=inp if read is None else read,
        cache_write_5m=w5,
        cache_write_1h=w5 if w1 is None else w1,
        output=Decimal(0) if out is None else out,
    )

"""Which model and service tier make each call: roles and phases, a cascade that escalates
on failure signals, latency-targeted tiers, failover — and switches priced against the
prompt cache (``switch``). Configured in ``stayer.toml`` (``config``)."""

from stayer.routing.router import Route, Router, RouteView
from stayer.settings import StayerConfig, load_config

__all__ = ["Route", "RouteView", "Router", "StayerConfig", "load_config"]

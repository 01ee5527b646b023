"""``stayer gateway``: the Anthropic and OpenAI wire APIs in front of any upstream, every
call priced, capped and journaled per session on its way through."""

from __future__ import annotations

from typing import Annotated

import typer

from stayer.cli.common import app, bad_input, serve_app
from stayer.cli.options import (
    FreePortOption,
    HostOption,
    MetricsTokenOption,
    PrivateWebhooksOption,
)


@app.command()
def gateway(
    upstream: Annotated[
        list[str],
        typer.Option(
            "--upstream",
            help="anthropic=URL or openai=URL (a provider, `stayer sim serve`, llama.cpp, "
            "vLLM); given again for one provider, the next upstream tried on failure.",
        ),
    ],
    host: HostOption = "127.0.0.1",
    port: FreePortOption = 8088,
    upstream_timeout: Annotated[
        float,
        typer.Option(
            "--upstream-timeout",
            help="Seconds an upstream may stay silent before the call fails (502).",
            min=1,
            max=3600,
        ),
    ] = 600.0,
    max_tokens_per_minute: Annotated[
        int | None,
        typer.Option(
            "--max-tokens-per-minute",
            help="Breaker: a session's input + output tokens over the last minute.",
            min=1,
            max=10**12,
        ),
    ] = None,
    failover: Annotated[
        list[str] | None,
        typer.Option(
            "--failover",
            metavar="PROVIDER=URL",
            help="anthropic=URL or openai=URL tried, in order, when the upstream before it "
            "answers 5xx/429 or cannot be reached (nothing billed; nothing sent yet).",
        ),
    ] = None,
    alias: Annotated[
        list[str] | None,
        typer.Option(
            "--alias",
            metavar="NAME=MODEL",
            help="NAME=MODEL: a request for model NAME calls (and is priced as) MODEL.",
        ),
    ] = None,
    auto_cache: Annotated[
        bool,
        typer.Option(
            "--auto-cache",
            help="Add Anthropic cache breakpoints to requests that carry none (after the "
            "tools and system prompt, and at the last message); the saving is on the ledger.",
        ),
    ] = False,
    allow_private_webhooks: PrivateWebhooksOption = False,
    metrics_token: MetricsTokenOption = None,
) -> None:
    """Meter any agent: point its base URL here and authenticate with a stayer tenant key
    (`stayer tenants create`). The provider keys are the gateway's own:
    ANTHROPIC_API_KEY and OPENAI_API_KEY (or STAYER_UPSTREAM_ANTHROPIC_KEY / _OPENAI_KEY).

    Example: stayer gateway --upstream anthropic=https://api.anthropic.com"""
    import os
    from concurrent.futures import ThreadPoolExecutor
    from urllib.parse import urlsplit

    try:
        from stayer.gateway.app import Gateway, Upstream, create_app
    except ImportError as e:
        bad_input(f"stayer gateway needs the serve extra: pip install 'stayer[serve]' ({e})")
    from stayer.errors import ConfigError
    from stayer.journal.backends import open_store, stayer_home
    from stayer.journal.metered import SessionLedger
    from stayer.metering.meter import Meter
    from stayer.metering.session import SessionStates
    from stayer.pricing import PriceBook
    from stayer.runtime.db import ServiceDB
    from stayer.runtime.tenants import open_budget_store
    from stayer.runtime.webhooks import Webhooks

    upstreams: dict[str, Upstream] = {}
    fallbacks: dict[str, list[Upstream]] = {}
    given = [("--upstream", item) for item in upstream]
    for flag, item in given + [("--failover", item) for item in failover or []]:
        name, eq, url = item.partition("=")
        parts = urlsplit(url)
        if name not in ("anthropic", "openai") or not eq:
            bad_input(f"{flag} {item}: expected anthropic=URL or openai=URL")
        if parts.scheme not in ("http", "https") or not parts.hostname or parts.username:
            bad_input(f"{flag} {item}: expected an http(s) URL without credentials")
        key = os.environ.get(f"STAYER_UPSTREAM_{name.upper()}_KEY") or os.environ.get(
            f"{name.upper()}_API_KEY"
        )
        if name in upstreams:
            fallbacks.setdefault(name, []).append(Upstream(url, key))
        elif flag == "--failover":
            bad_input(f"--failover {item}: no --upstream {name}=URL to fail over from")
        else:
            upstreams[name] = Upstream(url, key)
    aliases: dict[str, str] = {}
    for item in alias or []:
        asked, eq, served = (part.strip() for part in item.partition("="))
        if not asked or not eq or not served:
            bad_input(f"--alias {item}: expected NAME=MODEL")
        if asked in aliases:
            bad_input(f"--alias {asked}: given twice")
        aliases[asked] = served

    def build(db: ThreadPoolExecutor) -> Gateway:  # on the thread that will use the stores
        home = stayer_home()
        store = open_store(home)
        assert store is not None
        service = ServiceDB(store)  # type: ignore[arg-type]
        return Gateway(
            meter=Meter(PriceBook.load(), open_budget_store(home)),
            ledger=SessionLedger(store),
            key_info=service.gateway_key,
            upstreams=upstreams,
            failover=fallbacks,
            aliases=aliases,
            auto_cache=auto_cache,
            timeout_s=upstream_timeout,
            states=SessionStates(max_tokens_per_minute=max_tokens_per_minute),
            metrics_token=metrics_token,
            webhooks=Webhooks(allow_private=allow_private_webhooks),
            db=db,
        )

    db = ThreadPoolExecutor(1, "stayer-gw-db")
    try:
        gw = db.submit(build, db).result()
    except ConfigError as e:
        bad_input(str(e))
    ups = ", ".join(
        f"{n}={u.base_url}" + "".join(f" (failover {f.base_url})" for f in fallbacks.get(n, ()))
        for n, u in upstreams.items()
    )
    serve_app(create_app(gw), host, port, f"gateway · {ups}")

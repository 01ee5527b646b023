"""``stayer serve``, ``stayer worker`` and ``stayer tenants``: the runtime as a service."""

from __future__ import annotations

from decimal import Decimal
from pathlib import Path
from typing import Annotated

import typer

from stayer.cli.common import (
    JsonFlag,
    app,
    bad_input,
    console,
    emit_json,
    parse_decimal,
    stderr,
    sub_app,
)
from stayer.cli.options import (
    HostOption,
    MetricsTokenOption,
    OtlpOption,
    PrivateWebhooksOption,
    SandboxOption,
)
from stayer.errors import ConfigError

# asyncio, signal and rich are imported inside the commands: `stayer --help` and the
# other commands load this module too (see stayer.cli.common).
tenants_app = sub_app("tenants", "Tenants of the runtime: API keys and dollar budgets.")

TENANT_NAME = r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}"
TenantArgument = Annotated[str, typer.Argument(help="Tenant name: letters, digits, '.', '_', '-'.")]


# Options that `serve` (for its embedded worker) and `worker` share.
TasksDirOption = Annotated[
    str, typer.Option("--tasks-dir", help="Directory of tasks that runs may name.")
]
LeaseTtlOption = Annotated[
    float,
    typer.Option(
        "--lease-ttl",
        help="Seconds a dead worker's run waits before another takes it.",
        min=1.0,
        max=3600.0,
    ),
]
DrainTimeoutOption = Annotated[
    float,
    typer.Option(
        "--drain-timeout",
        help="On SIGTERM, seconds to hand the runs back (at a step boundary) and exit.",
        min=1.0,
        max=86400.0,
    ),
]


def _home() -> Path:
    from stayer.journal.backends import stayer_home

    return stayer_home()


def _service_db():  # noqa: ANN202 - ServiceDB (imported lazily: the CLI starts fast)
    from stayer.journal import open_store
    from stayer.journal.sql import SqlStore
    from stayer.runtime.db import ServiceDB

    store = open_store(_home())
    assert isinstance(store, SqlStore)
    return ServiceDB(store)


def _budgets():  # noqa: ANN202 - TenantBudgets
    from stayer.runtime.tenants import TenantBudgets, open_budget_store

    return TenantBudgets(open_budget_store(_home()))


def _tasks_dir(tasks_dir: str) -> Path:
    path = Path(tasks_dir)
    if not path.is_dir():
        bad_input(f"--tasks-dir {tasks_dir}: not a directory")
    return path.resolve()


def _worker(  # noqa: ANN202 - Worker (imported lazily: the CLI starts fast)
    tasks: Path,
    concurrency: int,
    sandbox: str,
    allow_private_webhooks: bool,
    lease_ttl: float,
    otlp: str | None,
    drain_timeout: float = 30.0,
):
    """The worker of ``stayer worker``, and the one ``stayer serve`` embeds: both take the
    same options for it."""
    from stayer.runtime.webhooks import Webhooks
    from stayer.runtime.worker import Worker

    return Worker(
        _home(),
        tasks,
        concurrency=concurrency,
        lease_ttl_s=lease_ttl,
        drain_timeout_s=drain_timeout,
        sandbox=sandbox,
        webhooks=Webhooks(allow_private=allow_private_webhooks),
        otlp=otlp,
    )


# A tenant's caps, as `tenants create` and `tenants budget` take them.
TenantMaxCostOption = Annotated[
    str | None,
    typer.Option(
        "--max-cost", help="The tenant's budget in USD over all its runs ('none' for unlimited)."
    ),
]
KeyMaxCostOption = Annotated[
    str | None,
    typer.Option(
        "--key-max-cost",
        help="Budget in USD of the tenant's key over its `stayer gateway` calls "
        "('none' for unlimited).",
    ),
]
SessionMaxCostOption = Annotated[
    str | None,
    typer.Option(
        "--session-max-cost",
        help="Default cap in USD of each `stayer gateway` session of the tenant that sends "
        "no x-stayer-max-cost ('none' for unlimited).",
    ),
]


@tenants_app.command("create")
def tenants_create(
    name: TenantArgument,
    max_cost: TenantMaxCostOption = None,
    key_max_cost: KeyMaxCostOption = None,
    session_max_cost: SessionMaxCostOption = None,
    json_out: JsonFlag = False,
) -> None:
    """Add a tenant; prints its API key (shown once: only its hash is stored).

    Example: stayer tenants create acme --max-cost 50 --json"""
    import re

    if not re.fullmatch(TENANT_NAME, name):
        bad_input(f"tenant {name!r}: use letters, digits, '.', '_' and '-' (at most 64)")
    cap, key_cap, session_cap = _caps(max_cost, key_max_cost, session_max_cost)
    try:
        db = _service_db()
        key = db.create_tenant(name)
        account = _budgets().set_cap(name, cap)
        secret = db.webhook_secret(name)
        gateway = _set_gateway_caps(db, name, key_max_cost, key_cap, session_max_cost, session_cap)
    except ConfigError as e:
        bad_input(str(e))
    doc = {
        "tenant": name,
        "api_key": key,
        "webhook_secret": secret,
        "max_cost": _money(account.cap),
        **gateway,
    }
    if json_out:
        emit_json(doc)
        return
    from rich.console import Console
    from rich.markup import escape

    out = Console()
    out.print(
        f"tenant [bold]{escape(name)}[/] created; budget {_money(account.cap) or 'unlimited'}"
    )
    out.print(f"API key (shown once): {key}", highlight=False, soft_wrap=True)
    out.print(f"webhook secret: {secret}", highlight=False, soft_wrap=True)


@tenants_app.command("budget")
def tenants_budget(
    name: TenantArgument,
    max_cost: TenantMaxCostOption = None,
    key_max_cost: KeyMaxCostOption = None,
    session_max_cost: SessionMaxCostOption = None,
    json_out: JsonFlag = False,
) -> None:
    """Set a tenant's budget; runs paused on it are queued again. The key's budget and
    the default session cap apply to `stayer gateway` calls.

    Example: stayer tenants budget acme --max-cost 80 --key-max-cost 20"""
    if max_cost is None and key_max_cost is None and session_max_cost is None:
        bad_input("stayer tenants budget: give --max-cost, --key-max-cost or --session-max-cost")
    cap, key_cap, session_cap = _caps(max_cost, key_max_cost, session_max_cost)
    try:
        db = _service_db()
        if not db.tenant_exists(name):
            bad_input(f"tenant {name!r}: no such tenant; `stayer tenants list` shows them")
        # Counted before the raise: a worker admits the runs that fit as soon as it sees
        # the room, so some may be queued before requeue_paused gets to them.
        requeued = sum(1 for r in db.paused_on_tenant() if r.tenant == name)
        budgets = _budgets()
        account = budgets.set_cap(name, cap) if max_cost is not None else budgets.account(name)
        db.requeue_paused(name)
        gateway = _set_gateway_caps(db, name, key_max_cost, key_cap, session_max_cost, session_cap)
    except ConfigError as e:
        bad_input(str(e))
    doc = {"tenant": name, **_account_doc(account), "requeued_runs": requeued, **gateway}
    if json_out:
        emit_json(doc)
    else:
        from rich.console import Console
        from rich.markup import escape

        Console().print(
            f"tenant {escape(name)}: budget {_money(account.cap) or 'unlimited'}; {requeued} paused run(s) queued again"
        )


@tenants_app.command("webhook")
def tenants_webhook(
    name: TenantArgument,
    url: Annotated[str, typer.Argument(help="http(s) URL, or 'none' to stop sending.")],
    allow_private_webhooks: PrivateWebhooksOption = False,
    json_out: JsonFlag = False,
) -> None:
    """Where `stayer gateway` sends the tenant's cache-miss webhooks (signed with its
    webhook secret, like the runs' status webhooks). A loopback or private address is
    refused without --allow-private-webhooks (which the gateway needs too).

    Example: stayer tenants webhook acme https://hooks.example.com/stayer"""
    from stayer.runtime.webhooks import resolve

    target = None if url.lower() == "none" else url
    if target is not None:
        _, problem = resolve(target, allow_private=allow_private_webhooks)
        if problem is not None:
            bad_input(f"webhook {url!r}: {problem}")
    try:
        db = _service_db()
        if not db.tenant_exists(name):
            bad_input(f"tenant {name!r}: no such tenant; `stayer tenants list` shows them")
        db.set_gateway_settings(name, webhook=target)
    except ConfigError as e:
        bad_input(str(e))
    if json_out:
        emit_json({"tenant": name, "webhook": target})
    else:
        from rich.markup import escape

        console().print(f"tenant {escape(name)}: cache-miss webhook {escape(target or 'off')}")


@tenants_app.command("list")
def tenants_list(json_out: JsonFlag = False) -> None:
    """The tenants, with their budgets: cap, spent, held by running runs, available.

    Example: stayer tenants list --json"""
    try:
        db, budgets = _service_db(), _budgets()
        rows = [
            {
                "tenant": n,
                "created_at": c,
                **_account_doc(budgets.account(n)),
                **_gateway_doc(db, budgets, n),
            }
            for n, c in db.tenants()
        ]
    except ConfigError as e:
        bad_input(str(e))
    if json_out:
        emit_json({"tenants": rows})
        return
    from stayer.tables import Col, FitTable, print_table

    t = FitTable(
        Col("tenant", whole=True),
        Col("cap", number=True),
        Col("spent", number=True),
        Col("held", number=True, drop=1),
        Col("available", number=True),
        Col("created", number=True, drop=2),
    )
    for r in rows:
        t.add_row(
            r["tenant"],
            r["max_cost"] or "—",
            r["spent_usd"],
            r["reserved_usd"],
            r["available_usd"] or "—",
            r["created_at"],
        )
    print_table(console(), t)


def _cap(text: str | None, flag: str = "--max-cost"):  # noqa: ANN202 - Decimal | None
    from decimal import Decimal

    cap = parse_decimal(text, flag)
    if cap is not None and not (Decimal(0) <= cap <= Decimal(10) ** 9):
        bad_input(f"{flag} {text}: must be between 0 and 1,000,000,000 USD")
    return cap


def _cap_or_none(text: str | None, flag: str) -> Decimal | None:
    return None if text is None or text.lower() in ("none", "unlimited") else _cap(text, flag)


def _caps(
    max_cost: str | None, key_max_cost: str | None, session_max_cost: str | None
) -> tuple[Decimal | None, Decimal | None, Decimal | None]:
    """The tenant's budget, its key's and its sessions' default cap; None: unlimited."""
    return (
        _cap_or_none(max_cost, "--max-cost"),
        _cap_or_none(key_max_cost, "--key-max-cost"),
        _session_cap(session_max_cost),
    )


def _session_cap(text: str | None) -> Decimal | None:
    from stayer.settings import MAX_USD

    cap = _cap_or_none(text, "--session-max-cost")
    if cap is not None and not (Decimal(0) < cap <= MAX_USD):
        bad_input(f"--session-max-cost {text}: must be above 0 and at most {MAX_USD} USD")
    return cap


def _set_gateway_caps(
    db,  # noqa: ANN001 - ServiceDB
    name: str,
    key_text: str | None,
    key_cap: Decimal | None,
    session_text: str | None,
    session_cap: Decimal | None,
) -> dict[str, str | None]:
    """Set the caps given (text None: unchanged); the tenant's gateway caps as they are."""
    budgets = _budgets()
    digest = db.tenant_key_hash(name)
    key = (
        budgets.set_key_cap(name, digest, key_cap)
        if key_text is not None
        else budgets.key_account(digest)
    )
    if session_text is not None:
        db.set_gateway_settings(name, session_max_cost=session_cap)
    return _gateway_doc(db, budgets, name, key)


def _gateway_doc(db, budgets, name: str, key=None) -> dict[str, str | None]:  # noqa: ANN001
    """The tenant's caps over its `stayer gateway` calls: its key's budget, its sessions'
    default cap."""
    key = key or budgets.key_account(db.tenant_key_hash(name))
    return {
        "key_max_cost": _money(key.cap),
        "key_spent_usd": str(key.spent),
        "key_reserved_usd": str(key.reserved),
        "session_max_cost": _money(db.gateway_settings(name)[0]),
    }


def _default_cap(text: str) -> Decimal:
    from stayer.runtime.schemas import MAX_RUN_COST

    cap = parse_decimal(text, "--default-max-cost")
    if cap is None or not (Decimal(0) < cap <= MAX_RUN_COST):
        bad_input(
            f"--default-max-cost {text}: must be above 0 and at most {MAX_RUN_COST:,} USD "
            "(a run's largest cap)"
        )
    return cap


def _money(value: object) -> str | None:
    return None if value is None else str(value)


def _account_doc(a) -> dict[str, str | None]:  # noqa: ANN001 - guard.budget.Account
    return {
        "max_cost": _money(a.cap),
        "spent_usd": str(a.spent),
        "reserved_usd": str(a.reserved),
        "available_usd": _money(a.available),
    }


@app.command()
def serve(
    host: HostOption = "127.0.0.1",
    port: Annotated[
        int, typer.Option("--port", help="Port to listen on.", min=1, max=65535)
    ] = 8080,
    workers: Annotated[
        int,
        typer.Option(
            "--workers",
            help="Embedded worker slots (0: API only; run `stayer worker`s).",
            min=0,
            max=1000,
        ),
    ] = 4,
    tasks_dir: TasksDirOption = "tasks",
    sandbox: SandboxOption = "bwrap",
    allow_private_webhooks: PrivateWebhooksOption = False,
    lease_ttl: LeaseTtlOption = 30.0,
    drain_timeout: DrainTimeoutOption = 30.0,
    otlp: OtlpOption = None,
    metrics_token: MetricsTokenOption = None,
    default_max_cost: Annotated[
        str,
        typer.Option(
            "--default-max-cost",
            help="Cap (USD) of a run that names none, for tenants with a budget.",
        ),
    ] = "1",
) -> None:
    """Serve the HTTP API (and, by default, one embedded worker) on the journal.

    Example: stayer serve --tasks-dir examples --port 8080"""
    import asyncio

    import uvicorn
    from rich.markup import escape

    from stayer.runtime.api import create_app

    tasks = _tasks_dir(tasks_dir)
    default_cap = _default_cap(default_max_cost)  # before anything is opened or written
    try:
        worker = (
            _worker(tasks, workers, sandbox, allow_private_webhooks, lease_ttl, otlp, drain_timeout)
            if workers
            else None
        )
        application = create_app(
            _home(),
            tasks,
            allow_private_webhooks=allow_private_webhooks,
            metrics_token=metrics_token,
            worker_registry=worker.metrics.registry if worker else None,
            default_max_cost=default_cap,
        )
    except ConfigError as e:
        bad_input(str(e))
    stop = asyncio.Event()
    background: list[asyncio.Task[None]] = []

    @application.on_event("startup")
    async def start_worker() -> None:
        if worker is not None:
            background.append(asyncio.create_task(worker.serve(stop)))

    @application.on_event("shutdown")
    async def stop_worker() -> None:
        stop.set()
        if background:
            await asyncio.gather(*background, return_exceptions=True)

    where = f"[{host}]" if ":" in host else host
    stderr().print(
        f"stayer serve: dashboard and API on http://{escape(where)}:{port}/ · tasks "
        f"{escape(str(tasks))} · {workers} worker slot(s)",
        highlight=False,
        soft_wrap=True,
    )
    uvicorn.run(application, host=host, port=port, log_level="warning")


@app.command()
def worker(
    concurrency: Annotated[
        int, typer.Option("--concurrency", help="Runs at once.", min=1, max=1000)
    ] = 4,
    tasks_dir: TasksDirOption = "tasks",
    sandbox: SandboxOption = "bwrap",
    allow_private_webhooks: PrivateWebhooksOption = False,
    lease_ttl: LeaseTtlOption = 30.0,
    drain_timeout: DrainTimeoutOption = 30.0,
    otlp: OtlpOption = None,
    metrics_port: Annotated[
        int | None,
        typer.Option(
            "--metrics-port",
            help="Serve this worker's Prometheus metrics (/metrics) and health (/healthz) "
            "on 127.0.0.1:PORT.",
            min=1,
            max=65535,
        ),
    ] = None,
) -> None:
    """Claim runs from the journal's queue and run them (any number of workers, any
    number of machines, one database: STAYER_DB=postgresql://…).

    Example: STAYER_DB=postgresql://… stayer worker --concurrency 8 --tasks-dir tasks"""
    import asyncio
    import contextlib
    import signal

    from rich.markup import escape

    tasks = _tasks_dir(tasks_dir)
    try:
        w = _worker(
            tasks, concurrency, sandbox, allow_private_webhooks, lease_ttl, otlp, drain_timeout
        )
    except ConfigError as e:
        bad_input(str(e))

    if metrics_port is not None:
        from stayer.runtime.worker import serve_health

        try:
            serve_health(w, metrics_port)
        except OSError as e:
            bad_input(f"--metrics-port {metrics_port}: {e.strerror or e}")

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            with contextlib.suppress(NotImplementedError):
                loop.add_signal_handler(sig, stop.set)
        stderr().print(
            f"stayer worker {escape(w.name)} · {concurrency} slot(s) · {escape(w.store.location)}",
            highlight=False,
        )
        await w.serve(stop)

    asyncio.run(main())

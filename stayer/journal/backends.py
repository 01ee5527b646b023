"""Choosing a journal backend: SQLite under ``$STAYER_HOME`` unless ``STAYER_DB`` names
PostgreSQL.

Apart from ``stayer.journal.store`` (the protocol) so that the backends can import the
protocol's types without the protocol's module importing them back.
"""

from __future__ import annotations

import os
from pathlib import Path

from stayer.errors import ConfigError
from stayer.journal.store import JournalError, Store


def stayer_home() -> Path:
    """Where state lives: ``$STAYER_HOME``, default ``./.stayer``."""
    home = os.environ.get("STAYER_HOME") or ".stayer"
    if not home.isprintable() or not home.encode("utf-8", "replace").decode() == home:
        # The journal stores paths as UTF-8 text (SQLite, JSON): such a name cannot be kept.
        raise ConfigError(
            f"STAYER_HOME {home!r}: not a UTF-8 path; choose a directory whose name is UTF-8"
        )
    return Path(home)


def open_store(home: Path, url: str | None = None, *, create: bool = True) -> Store | None:
    """The store ``STAYER_DB`` (or ``url``) names, else SQLite at ``home/stayer.db``.

    With ``create=False`` a SQLite journal that does not exist yet is not created: the
    result is None (read-only commands on a fresh home).
    """
    url = os.environ.get("STAYER_DB") if url is None else url
    if url:
        if url.startswith(("postgresql://", "postgres://")):
            from stayer.journal.postgres import PostgresStore

            return PostgresStore(url)
        raise JournalError(
            "STAYER_DB: expected a postgresql://… URL; unset it to use SQLite in $STAYER_HOME"
        )
    from stayer.journal.sqlite import SqliteStore

    db = Path(home) / "stayer.db"
    if not create and not db.exists():
        return None
    return SqliteStore(db, Path(home) / "blobs")

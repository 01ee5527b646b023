"""A throwaway PostgreSQL server for the Postgres journal tests.

    python tests/pg_server.py start DIR   # prints postgresql://… ; .ci/run exports it as STAYER_TEST_PG
    python tests/pg_server.py stop DIR

The tests' ``pg_url`` fixture (``database_fixture()``) uses the server ``STAYER_TEST_PG``
names when it is set, else starts one of its own in a temporary directory; either way each
test module gets a fresh, empty database. Where no server can be started (no PostgreSQL
binaries, or they fail) the tests skip, saying why; a server named by ``STAYER_TEST_PG``
that cannot be used is an error, not a skip.
"""

from __future__ import annotations

import glob
import os
import pwd
import shlex
import shutil
import socket
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path


def _bindir() -> Path | None:
    if shutil.which("pg_ctl") and shutil.which("initdb"):
        return Path(shutil.which("pg_ctl") or "").resolve().parent
    found = sorted(
        glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=lambda p: int(p.split("/")[4])
    )
    return Path(found[-1]).parent if found else None


def _as_server_user(argv: list[str]) -> list[str]:
    # PostgreSQL refuses to run as root: use the postgres account the package creates.
    if os.geteuid() != 0:
        return argv
    return (
        ["runuser", "-u", "postgres", "--", *argv]
        if shutil.which("runuser")
        else ["su", "postgres", "-s", "/bin/sh", "-c", shlex.join(argv)]
    )


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start(base: Path, port: int | None = None) -> str:
    """Start a server with its data in ``base`` (on ``port``, default a free one: give the
    same port to start it again after ``stop``); returns the URL of its ``postgres`` db."""
    bindir = _bindir()
    if bindir is None:
        raise RuntimeError("no PostgreSQL binaries (initdb, pg_ctl) on this machine")
    base.mkdir(parents=True, exist_ok=True)
    if os.geteuid() == 0:
        try:
            user = pwd.getpwnam("postgres")
        except KeyError:
            raise RuntimeError(
                "running as root and there is no postgres user to run the server as"
            ) from None
        os.chown(base, user.pw_uid, user.pw_gid)
    data, port = base / "data", port or _free_port()

    def run(argv):
        return subprocess.run(_as_server_user(argv), capture_output=True, text=True, timeout=120)

    if not (data / "PG_VERSION").exists():
        r = run(
            [
                str(bindir / "initdb"),
                "-D",
                str(data),
                "-A",
                "trust",
                "-U",
                "postgres",
                "-E",
                "UTF8",
                "--no-sync",
            ]
        )
        if r.returncode != 0:
            raise RuntimeError(f"initdb failed: {(r.stderr or r.stdout).strip()[-300:]}")
    opts = f"-p {port} -k {base} -c listen_addresses=127.0.0.1 -c max_connections=200"
    r = run(
        [
            str(bindir / "pg_ctl"),
            "-D",
            str(data),
            "-l",
            str(base / "server.log"),
            "-o",
            opts,
            "-w",
            "-t",
            "60",
            "start",
        ]
    )
    if r.returncode != 0:
        raise RuntimeError(f"pg_ctl start failed: {(r.stderr or r.stdout).strip()[-300:]}")
    return f"postgresql://postgres@127.0.0.1:{port}/postgres"


def stop(base: Path) -> None:
    bindir = _bindir()
    if bindir is not None and (base / "data").exists():
        subprocess.run(
            _as_server_user(
                [str(bindir / "pg_ctl"), "-D", str(base / "data"), "-m", "immediate", "stop"]
            ),
            capture_output=True,
            timeout=60,
        )


def _fresh_database(url: str) -> str:
    import psycopg

    name = "stayer_test_" + uuid.uuid4().hex[:10]
    with psycopg.connect(url, autocommit=True, connect_timeout=10) as conn:
        conn.execute(f"CREATE DATABASE {name}")
    return url.rsplit("/", 1)[0] + "/" + name


class PgDatabase:
    """A fresh database on the CI server or on a server started for this session."""

    def __init__(self) -> None:
        self.url: str | None = None
        self.skip_reason: str | None = None
        self._own: Path | None = None

    def __enter__(self) -> PgDatabase:
        try:
            import psycopg  # noqa: F401
        except ImportError:
            self.skip_reason = "psycopg is not installed (pip install 'stayer[postgres]')"
            return self
        server = os.environ.get("STAYER_TEST_PG")
        if not server:
            self._own = Path(tempfile.mkdtemp(prefix="stayer-pg-"))
            try:
                server = start(self._own)
            except (RuntimeError, OSError, subprocess.SubprocessError) as e:
                self.skip_reason = f"no PostgreSQL server could be started here: {e}"
                return self
        # A server we were told about but cannot use is an error, not a skip.
        self.url = _fresh_database(server)
        return self

    def __exit__(self, *exc: object) -> None:
        if self._own is not None:
            stop(self._own)
            shutil.rmtree(self._own, ignore_errors=True)


def database_fixture():  # noqa: ANN201  (a pytest fixture)
    """A module-scoped fixture, ``pg_url``: a fresh database's URL, or a skip saying why
    there is none. Each test module assigns it: ``pg_url = database_fixture()``."""
    import pytest

    @pytest.fixture(scope="module")
    def pg_url():  # noqa: ANN202
        with PgDatabase() as db:
            if db.url is None:
                pytest.skip(db.skip_reason or "no PostgreSQL")
            yield db.url

    return pg_url


if __name__ == "__main__":
    cmd, where = sys.argv[1], Path(sys.argv[2])
    if cmd == "start":
        print(start(where))
    elif cmd == "stop":
        stop(where)
    else:
        sys.exit(f"usage: {sys.argv[0]} start|stop DIR")

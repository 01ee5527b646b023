"""Attacks on the hosted runtime (issue 34): uploads, request bodies, cursors, event ids,
webhooks and the files the store keeps. The API runs in-process (on SQLite and on
PostgreSQL where the store matters); the across-machines check runs real processes."""

from __future__ import annotations

import asyncio
import gzip
import hashlib
import hmac
import io
import os
import socket
import stat
import tarfile
import threading
import time
import tracemalloc
import uuid
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path
from typing import Any

import pytest
from pg_server import _fresh_database as fresh_database
from pg_server import database_fixture
from service_helpers import Env, copy_tasks, finished, spawn, start_server, wait_for
from starlette.testclient import TestClient

from stayer import addresses
from stayer.errors import ConfigError
from stayer.runtime import webhooks
from stayer.runtime.uploads import unpack_task

pg_url = database_fixture()
ROOT = Path(__file__).resolve().parent.parent
SIM = "sim:claude-sonnet-4-5"
BACKENDS = ["sqlite", pytest.param("postgres", marks=pytest.mark.slow)]


@pytest.fixture(params=BACKENDS)
def db_url(request: pytest.FixtureRequest) -> str:
    return "" if request.param == "sqlite" else fresh_database(request.getfixturevalue("pg_url"))


@pytest.fixture
def api(db_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """The API in-process (no workers): ``api.client(key)``, ``api.tenant()``, ``api.db``."""
    from stayer.runtime.api import create_app

    if db_url:
        monkeypatch.setenv("STAYER_DB", db_url)
    else:
        monkeypatch.delenv("STAYER_DB", raising=False)
    home = tmp_path / "home"
    tasks = copy_tasks(tmp_path / "tasks", "hello-file")
    app = create_app(home, tasks)

    class Api:
        def __init__(self) -> None:
            self.home = home
            self.db = app.state.databases.get()

        def tenant(self) -> str:
            return self.db.create_tenant("t" + uuid.uuid4().hex[:10])

        def client(self, key: str) -> TestClient:
            return TestClient(
                app,
                headers={"Authorization": f"Bearer {key}"},
                raise_server_exceptions=False,
            )

    yield Api()
    app.state.databases.close()


# --- uploads ----------------------------------------------------------------------------------


def _tgz(entries: list[tuple[tarfile.TarInfo, bytes]]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for info, data in entries:
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def _task(toml: bytes = b"") -> bytes:
    root = ROOT / "examples" / "hello-file"
    entries = []
    for p in sorted(root.rglob("*")):
        if p.is_file():
            info = tarfile.TarInfo(f"t/{p.relative_to(root)}")
            info.mode = p.stat().st_mode & 0o777
            data = toml if p.name == "task.toml" and toml else p.read_bytes()
            entries.append((info, data))
    return _tgz(entries)


def _header_bomb(kind: bytes, size: int) -> bytes:
    """A tar.gz whose first header announces ``size`` bytes of long name (GNU ``L``) or
    pax records (``x``): a few hundred KiB that inflate to ``size``."""
    head = tarfile.TarInfo("././@LongLink")
    head.type, head.size = kind, size
    out = io.BytesIO()
    with gzip.GzipFile(fileobj=out, mode="wb", compresslevel=9) as gz:
        gz.write(head.tobuf(format=tarfile.GNU_FORMAT))
        chunk = b"a" * (1 << 20)
        for _ in range(size // len(chunk)):
            gz.write(chunk)
        gz.write(tarfile.TarInfo("x").tobuf(format=tarfile.GNU_FORMAT) + bytes(1024))
    return out.getvalue()


@pytest.mark.parametrize("kind", [tarfile.GNUTYPE_LONGNAME, tarfile.XHDTYPE])
def test_a_tar_header_bomb_is_refused_before_it_is_read(kind: bytes, tmp_path: Path) -> None:
    bomb = _header_bomb(kind, 256 << 20)
    assert len(bomb) < 1 << 20  # under 1 MiB on the wire
    tracemalloc.start()
    try:
        with pytest.raises(ConfigError, match="long-name and pax headers"):
            unpack_task(bomb, tmp_path / "uploads", "bomb")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 16 << 20, f"unpacking a header bomb took {peak >> 20} MiB"
    assert not (tmp_path / "uploads").exists()


def test_many_chained_extended_headers_are_refused(tmp_path: Path) -> None:
    out = io.BytesIO()
    with gzip.GzipFile(fileobj=out, mode="wb") as gz:
        for _ in range(5000):  # unchecked: tarfile recurses once per header
            head = tarfile.TarInfo("././@LongLink")
            head.type, head.size = tarfile.GNUTYPE_LONGNAME, 1
            gz.write(head.tobuf(format=tarfile.GNU_FORMAT) + b"a" + bytes(511))
        gz.write(tarfile.TarInfo("x").tobuf(format=tarfile.GNU_FORMAT) + bytes(1024))
    with pytest.raises(ConfigError, match="extended headers before one entry"):
        unpack_task(out.getvalue(), tmp_path / "uploads", "chain")


@pytest.mark.parametrize(
    ("toml", "field"),
    [
        (b"[environment]\nstorage_mb = 16777216\n", "environment.storage_mb"),
        (b"[environment]\nmemory_mb = 1048576\n", "environment.memory_mb"),
        (b"[agent]\ntimeout_sec = 604800.0\n", "agent.timeout_sec"),
        (b"[verifier]\ntimeout_sec = 604800.0\n", "verifier.timeout_sec"),
        (b'[environment]\nsandbox = "local"\n', "environment.sandbox"),
        (b"[environment]\nallow_internet = true\n", "environment.allow_internet"),
    ],
)
def test_an_uploaded_task_cannot_choose_its_own_limits(api: Any, toml: bytes, field: str) -> None:
    with api.client(api.tenant()) as c:
        r = c.post("/v1/tasks", params={"name": "greedy"}, content=_task(toml))
        assert r.status_code == 422, r.text
        assert field in r.json()["detail"], r.text
        assert str(api.home) not in r.text
        assert c.post("/v1/runs", json={"task": "greedy", "model": SIM}).status_code == 422
        # What real Harbor tasks ask for is accepted.
        ok = b"[environment]\nmemory_mb = 4096\nstorage_mb = 20480\n"
        assert c.post("/v1/tasks", params={"name": "fair"}, content=_task(ok)).status_code == 201


# --- request bodies, cursors, event ids --------------------------------------------------------


def test_a_lone_surrogate_is_refused_before_anything_is_stored(api: Any) -> None:
    with api.client(api.tenant()) as c:
        for body in (
            b'{"task": "hello-file", "model": "%s", "metadata": {"k": "\\ud800"}}' % SIM.encode(),
            b'{"task": "hello-file", "model": "%s", "metadata": {"\\udfff": "v"}}' % SIM.encode(),
            b'{"task": "hello-file", "model": "%s", "team": {"x": ["\\ud800"]}}' % SIM.encode(),
        ):
            r = c.post("/v1/runs", content=body, headers={"Content-Type": "application/json"})
            assert r.status_code == 422, r.text
        listed = c.get("/v1/runs")
        assert listed.status_code == 200 and listed.json()["data"] == []


def test_another_tenants_run_id_as_a_cursor_reveals_nothing(api: Any) -> None:
    alice, bob = api.tenant(), api.tenant()
    with api.client(alice) as a, api.client(bob) as b:
        mine = b.post("/v1/runs", json={"task": "hello-file", "model": SIM}).json()["id"]
        theirs = a.post("/v1/runs", json={"task": "hello-file", "model": SIM}).json()["id"]
        with api.db.store._tx() as cur:  # bob's run is the older one, whatever the clock said
            cur.execute(
                "UPDATE stayer_service_runs SET created_at = ? WHERE id = ?",
                ("2020-01-01T00:00:00.000+00:00", mine),
            )
        made_up = b.get("/v1/runs", params={"cursor": "20200101-000000-000000000000"})
        probe = b.get("/v1/runs", params={"cursor": theirs})
        assert made_up.status_code == probe.status_code == 200
        assert probe.json() == made_up.json() == {"data": [], "next_cursor": None}


def test_event_ids_past_what_the_store_counts_are_422(api: Any) -> None:
    with api.client(api.tenant()) as c:
        run_id = c.post("/v1/runs", json={"task": "hello-file", "model": SIM}).json()["id"]
        assert c.post(f"/v1/runs/{run_id}/cancel").json()["status"] == "cancelled"
        for big in (2**63, 2**64, 10**30):
            r = c.get(f"/v1/runs/{run_id}/events", params={"after": big})
            assert r.status_code == 422, r.text
            r = c.get(f"/v1/runs/{run_id}/events", headers={"Last-Event-ID": str(big)})
            assert r.status_code == 422 and "Last-Event-ID" in r.text, r.text
        r = c.get(f"/v1/runs/{run_id}/events", headers={"Last-Event-ID": "-2"})
        assert r.status_code == 422, r.text
        r = c.get(f"/v1/runs/{run_id}/events", params={"after": 2**31})  # past the end: ends
        assert r.status_code == 200


# --- the files of the SQLite store -------------------------------------------------------------


def _mode(p: Path) -> int:
    return stat.S_IMODE(p.stat().st_mode)


def test_the_store_and_home_are_private(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from stayer.journal import open_store
    from stayer.runtime.db import ServiceDB
    from stayer.runtime.tenants import open_budget_store

    monkeypatch.delenv("STAYER_DB", raising=False)
    home = tmp_path / "home"
    store = open_store(home)
    ServiceDB(store).create_tenant("acme")  # a webhook secret is written
    open_budget_store(home)
    assert _mode(home) == 0o700 and _mode(home / "blobs") == 0o700
    for name in ("stayer.db", "stayer.db-wal", "stayer.db-shm", "budgets.db"):
        assert _mode(home / name) & 0o077 == 0, name
    store.close()

    # A home an older stayer made, readable by all: its files are made private.
    old = tmp_path / "old"
    old.mkdir(mode=0o755)
    (old / "blobs").mkdir(mode=0o755)
    for name in ("stayer.db", "stayer.db-wal", "stayer.db-shm"):
        (old / name).touch(mode=0o644)
        os.chmod(old / name, 0o644)
    os.chmod(old / "blobs", 0o755)
    open_store(old).close()
    for name in ("stayer.db", "stayer.db-wal", "stayer.db-shm"):
        if (old / name).exists():
            assert _mode(old / name) & 0o077 == 0, name
    assert _mode(old / "blobs") == 0o700


# --- webhooks -----------------------------------------------------------------------------------


class _Hook(BaseHTTPRequestHandler):
    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        body = self.rfile.read(int(self.headers["Content-Length"]))
        self.server.got.append((body, dict(self.headers)))  # type: ignore[attr-defined]
        self.send_response(204)
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


def _listen(address: str, port: int = 0) -> HTTPServer:
    server = HTTPServer((address, port), _Hook)
    server.got = []  # type: ignore[attr-defined]
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def test_a_webhook_goes_to_the_address_that_was_checked(monkeypatch: pytest.MonkeyPatch) -> None:
    """DNS rebinding: the name resolves to an allowed address for the check, then to a
    refused one. 127.0.0.1 stands for a public address and 127.0.0.2 for an internal one."""
    checked = _listen("127.0.0.1")
    port = checked.server_port
    try:
        internal = _listen("127.0.0.2", port)
    except OSError:
        checked.shutdown()
        pytest.skip("127.0.0.2 cannot be bound here")
    real = socket.getaddrinfo
    answers = iter(["127.0.0.1"])

    def rebinding(host: Any, *args: Any, **kwargs: Any) -> Any:
        if host in ("hooks.example", b"hooks.example"):  # anyio asks with bytes
            address = next(answers, "127.0.0.2")
            return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", (address, port))]
        return real(host, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", rebinding)
    monkeypatch.setattr(webhooks, "_allowed", lambda a: str(a) == "127.0.0.1")
    try:
        hooks = webhooks.Webhooks(attempts=1, backoff_s=0)

        async def deliver() -> None:
            hooks.send(f"http://hooks.example:{port}/in", "secret", {"run_id": "r1"})
            await hooks.aclose(timeout_s=60)

        asyncio.run(deliver())
    finally:
        checked.shutdown()
        internal.shutdown()
    assert internal.got == []  # type: ignore[attr-defined]
    [(body, headers)] = checked.got  # type: ignore[attr-defined]
    assert headers["Host"] == f"hooks.example:{port}"


def test_a_webhook_signature_ties_the_body_to_its_delivery_and_time() -> None:
    body = b'{"type":"run.status","run_id":"r1","status":"succeeded","stop_reason":null}'
    now = int(time.time())
    headers = webhooks.signed_headers("s3cret", body, delivery_id="d1", timestamp=now)
    assert headers[webhooks.ID_HEADER] == "d1"
    assert headers[webhooks.TIMESTAMP_HEADER] == str(now)
    expected = hmac.new(b"s3cret", f"d1.{now}.".encode() + body, hashlib.sha256).hexdigest()
    assert headers[webhooks.SIGNATURE_HEADER] == "sha256=" + expected
    assert webhooks.verify("s3cret", body, headers, now=now)
    # Replayed later, or with another delivery's id, or the body alone signed: refused.
    assert not webhooks.verify("s3cret", body, headers, now=now + 3600)
    assert not webhooks.verify("s3cret", body, {**headers, webhooks.ID_HEADER: "d2"}, now=now)
    body_only = "sha256=" + hmac.new(b"s3cret", body, hashlib.sha256).hexdigest()
    assert not webhooks.verify(
        "s3cret", body, {**headers, webhooks.SIGNATURE_HEADER: body_only}, now=now
    )


# --- uploads live in the store -------------------------------------------------------------------


@pytest.mark.slow
def test_an_uploaded_task_runs_on_a_worker_whose_home_is_another_machines(
    pg_url: str, tmp_path: Path
) -> None:
    db = fresh_database(pg_url)
    api_env = Env(tmp_path / "api-host" / "home", db)
    worker_env = Env(tmp_path / "worker-host" / "home", db)
    empty = tmp_path / "worker-host" / "tasks"
    empty.mkdir(parents=True)
    api = start_server(api_env, copy_tasks(tmp_path / "api-host" / "tasks"), "--workers", "0")
    worker = spawn(
        worker_env, ["worker", "--tasks-dir", str(empty), "--concurrency", "1"], tmp_path / "w.log"
    )
    try:
        key = api_env.tenant("acme")["api_key"]
        with api.client(key) as c:
            assert c.post("/v1/tasks", params={"name": "up"}, content=_task()).status_code == 201
            run_id = c.post("/v1/runs", json={"task": "up", "model": SIM}).json()["id"]
            run = wait_for(c, run_id, finished)
            assert run["status"] == "succeeded", (run, worker.output())
    finally:
        worker.kill()
        api.process.kill()
    assert list((worker_env.home / "uploads").glob("*/*/up/instruction.md"))


def test_an_upload_is_run_from_the_store_when_this_machine_has_no_copy(tmp_path: Path) -> None:
    env = Env(tmp_path / "home")
    api = start_server(env, copy_tasks(tmp_path / "tasks"), "--workers", "1")
    try:
        key = env.tenant("acme")["api_key"]
        with api.client(key) as c:
            assert c.post("/v1/tasks", params={"name": "up"}, content=_task()).status_code == 201
            import shutil

            shutil.rmtree(env.home / "uploads")  # the cache only: the store keeps the task
            run_id = c.post("/v1/runs", json={"task": "up", "model": SIM}).json()["id"]
            assert wait_for(c, run_id, finished)["status"] == "succeeded", api.process.output()
    finally:
        api.process.kill()


def test_a_pinned_delivery_keeps_the_urls_host_and_tls_name() -> None:
    url, headers, extensions = addresses.pinned("https://hooks.example/in?x=1", "2001:db8::1")
    assert url == "https://[2001:db8::1]/in?x=1"
    assert headers == {"Host": "hooks.example"}
    assert extensions == {"sni_hostname": "hooks.example"}  # the name TLS asks for and checks
    url, headers, extensions = addresses.pinned("http://hooks.example:8080/in", "192.0.2.7")
    assert (url, headers, extensions) == (
        "http://192.0.2.7:8080/in",
        {"Host": "hooks.example:8080"},
        {},
    )


def test_an_in_memory_database_stays_in_memory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from stayer.guard.shared import SqliteBudgetStore

    monkeypatch.chdir(tmp_path)
    SqliteBudgetStore(":memory:")
    assert list(tmp_path.iterdir()) == []

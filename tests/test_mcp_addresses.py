"""Where a streamable-HTTP MCP server's connection goes (issue 39's attack tests): a run's
own ``mcp_servers`` URL is checked against the private-address rule when the run is
created, and again when the run connects, on the one DNS answer the connection then uses
(``stayer.addresses``): a name re-pointed between the check and the connection (DNS
rebinding), or between two requests of the session (a redirect within the origin), does
not reach a loopback or private listener. With private addresses allowed, a real local
server (``tests/mcp_servers/http_echo.py``, on the official SDK) is still called.

Runs are prepared as ``stayer run`` and the worker prepare them (``prepare``, ``run_mcp``);
the name ``mcp.example`` is answered by a patched ``socket.getaddrinfo``; no packet leaves
the machine (every answer the connection may use is a loopback address).
"""

from __future__ import annotations

import asyncio
import http.server
import json
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from stayer import addresses
from stayer.mcp.client import McpStartError
from stayer.mcp.config import check_api_servers
from stayer.prepare import PreparedRun, prepare, run_mcp
from stayer.runtime.webhooks import url_problem
from stayer.settings import RunSettings
from stayer.tools.base import ToolContext
from tests.service_helpers import free_port

ROOT = Path(__file__).resolve().parent.parent
ECHO = ROOT / "tests" / "mcp_servers" / "http_echo.py"
NAME = "mcp.example"
PUBLIC = "93.184.216.34"  # what the check is told; never dialled


class _Recorder(http.server.BaseHTTPRequestHandler):
    """Records every request; answers ``redirect`` (a 307 to it, closing the
    connection) for /mcp, else 404."""

    def _any(self) -> None:
        self.server.got.append((self.command, self.path, self.headers.get("Host")))  # type: ignore[attr-defined]
        length = int(self.headers.get("Content-Length") or 0)
        self.rfile.read(length)
        redirect = self.server.redirect  # type: ignore[attr-defined]
        if redirect and self.path == "/mcp":
            self.send_response(307)
            self.send_header("Location", redirect)
        else:
            self.send_response(404)
        self.send_header("Content-Length", "0")
        self.send_header("Connection", "close")
        self.end_headers()
        self.close_connection = True

    do_GET = do_POST = do_DELETE = _any

    def log_message(self, *args: Any) -> None:
        pass


def _listen(host: str, port: int = 0, redirect: str | None = None) -> http.server.HTTPServer:
    server = http.server.ThreadingHTTPServer((host, port), _Recorder)
    server.got = []  # type: ignore[attr-defined]
    server.redirect = redirect  # type: ignore[attr-defined]
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def _dns(monkeypatch: pytest.MonkeyPatch, port: int, answers: list[str], then: str) -> list[str]:
    """``NAME`` resolves to ``answers`` in turn, then always to ``then``; the answers
    given are returned (a list that grows)."""
    real = socket.getaddrinfo
    given: list[str] = []

    def lookup(host: Any, *args: Any, **kwargs: Any) -> Any:
        if host in (NAME, NAME.encode()):  # anyio asks with bytes
            address = answers[len(given)] if len(given) < len(answers) else then
            given.append(address)
            return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", (address, port))]
        return real(host, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", lookup)
    return given


def _prepared(tmp_path: Path, servers: dict[str, Any], **settings: Any) -> PreparedRun:
    task = tmp_path / "task"
    if not task.exists():
        shutil.copytree(ROOT / "examples" / "hello-file", task)
    config = RunSettings(
        task_dir=str(task),
        model="sim:claude-sonnet-4-5",
        sandbox="local",
        mcp_servers=servers,
        **settings,
    )
    return prepare(config)


def _call(p: PreparedRun, tool: str, args: dict[str, Any], workspace: Path) -> str:
    """Connect the run's servers as a run does, and call ``tool``: its output, or the
    start error's text."""

    async def go() -> str:
        try:
            async with run_mcp(p, None) as mcp:  # type: ignore[arg-type]  (no stdio server)
                [found] = [t for t in mcp.tools if t.spec.name == tool]
                ctx = ToolContext(
                    sandbox=None, workspace=str(workspace), command_timeout=30.0,
                    output_token_budget=200,
                )  # fmt: skip
                out = await found(args, ctx)
                assert not out.is_error, out.output
                return out.output
        except McpStartError as e:
            return f"start error: {e}"

    return asyncio.run(go())


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("STAYER_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("STAYER_DB", raising=False)
    return tmp_path / "home"


def test_a_name_rebound_after_the_check_does_not_reach_a_local_listener(
    tmp_path: Path, home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The API's check is told a public address; the run's connection, 127.0.0.1, where
    a listener waits: it is refused there, on that one answer, and nothing reaches it."""
    local = _listen("127.0.0.1")
    port = local.server_port
    try:
        given = _dns(monkeypatch, port, [PUBLIC], then="127.0.0.1")
        servers = {"web": {"url": f"http://{NAME}:{port}/mcp"}}
        # POST /v1/runs: passes the webhooks' rule (one lookup, a public answer).
        check_api_servers(servers, lambda url: url_problem(url, allow_private=False))
        said = _call(_prepared(tmp_path, servers), "web__echo", {}, tmp_path)
    finally:
        local.shutdown()
    assert local.got == []  # type: ignore[attr-defined]
    assert said.startswith("start error: mcp server web: url resolves to a non-public address")
    assert "(127.0.0.1)" in said
    assert given == [PUBLIC, "127.0.0.1"]  # the connection asked once


def test_a_worker_connects_only_where_the_api_checked(tmp_path: Path) -> None:
    """End to end: `stayer serve` without --allow-private-webhooks, in which the name
    resolves to a public address for the API's check and to 127.0.0.1 for the worker
    (tests/fixtures/rebind): the run stops saying why, and the listener gets nothing."""
    pytest.importorskip("fastapi")
    from service_helpers import Env, copy_tasks, spawn, wait_for

    local = _listen("127.0.0.1")
    port = local.server_port

    class Rebinding(Env):
        def vars(self) -> dict[str, str]:
            env = super().vars()
            env["PYTHONPATH"] += os.pathsep + str(ROOT / "tests" / "fixtures" / "rebind")
            env["STAYER_TEST_REBIND"] = f"{NAME} {port} {PUBLIC} 127.0.0.1"
            return env

    env = Rebinding(tmp_path / "home")
    api = free_port()
    tasks = copy_tasks(tmp_path / "tasks", "hello-file")
    args = ["serve", "--port", str(api), "--tasks-dir", str(tasks), "--sandbox", "local"]
    server = spawn(env, args, tmp_path / "serve.log")
    try:
        key = env.tenant("acme")["api_key"]
        deadline = time.monotonic() + 120
        while socket.socket().connect_ex(("127.0.0.1", api)) != 0:
            assert time.monotonic() < deadline and server.proc.poll() is None, server.output()
            time.sleep(0.2)
        with httpx.Client(
            base_url=f"http://127.0.0.1:{api}",
            headers={"Authorization": f"Bearer {key}"},
            timeout=60.0,
        ) as client:
            servers = {"web": {"url": f"http://{NAME}:{port}/mcp"}}
            r = client.post(
                "/v1/runs",
                json={
                    "task": "hello-file",
                    "model": "sim:claude-sonnet-4-5",
                    "mcp_servers": servers,
                },
            )
            assert r.status_code == 201, r.text  # the check saw the public address
            run = wait_for(
                client, r.json()["id"], lambda x: x["status"] not in ("queued", "running")
            )
    finally:
        server.kill()
        local.shutdown()
    assert local.got == [], server.output()  # type: ignore[attr-defined]
    assert run["status"] != "succeeded", run
    assert "non-public address (127.0.0.1)" in json.dumps(run) + server.output(), run


@pytest.mark.parametrize("same_name", [True, False])
def test_a_redirect_does_not_lead_to_another_address(
    tmp_path: Path, home: Path, monkeypatch: pytest.MonkeyPatch, same_name: bool
) -> None:
    """127.0.0.1 stands for a public address and 127.0.0.2 for an internal one. The
    server redirects /mcp (307, closing the connection) to its own name, which the next
    lookup points at 127.0.0.2, or to 127.0.0.2 itself: neither is reached."""
    monkeypatch.setattr(addresses, "is_public", lambda a: str(a) == "127.0.0.1", raising=False)
    checked = _listen("127.0.0.1")
    port = checked.server_port
    try:
        internal = _listen("127.0.0.2", port)
    except OSError:
        checked.shutdown()
        pytest.skip("127.0.0.2 cannot be bound here")
    checked.redirect = (  # type: ignore[attr-defined]
        f"http://{NAME}:{port}/next" if same_name else f"http://127.0.0.2:{port}/mcp"
    )
    try:
        _dns(monkeypatch, port, ["127.0.0.1"], then="127.0.0.2")
        servers = {"web": {"url": f"http://{NAME}:{port}/mcp"}}
        said = _call(_prepared(tmp_path, servers), "web__echo", {}, tmp_path)
    finally:
        checked.shutdown()
        internal.shutdown()
    assert internal.got == []  # type: ignore[attr-defined]
    assert said.startswith("start error: mcp server web could not start"), said
    got = checked.got  # type: ignore[attr-defined]
    assert got and all(host == f"{NAME}:{port}" for _, _, host in got), got
    if same_name:  # followed within the origin: to the address checked, Host the name's
        assert ("POST", "/next", f"{NAME}:{port}") in got


@pytest.fixture
def echo_server() -> Iterator[int]:
    port = free_port()
    server = subprocess.Popen(
        [sys.executable, str(ECHO), str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 60
        while socket.socket().connect_ex(("127.0.0.1", port)) != 0:
            assert time.monotonic() < deadline and server.poll() is None, "did not listen"
            time.sleep(0.2)
        yield port
    finally:
        server.kill()
        server.wait()


def test_a_local_server_is_called_where_private_addresses_are_allowed(
    tmp_path: Path, home: Path, echo_server: int
) -> None:
    url = f"http://localhost:{echo_server}/mcp"  # a name: resolved once, then pinned
    allowed = _prepared(tmp_path, {"web": {"url": url}}, allow_private_mcp=True)
    assert _call(allowed, "web__echo", {"text": "hi"}, tmp_path) == "echo: hi"
    # The same server from task.toml or stayer.toml (the operator's): always allowed.
    (tmp_path / "task" / "task.toml").write_text(
        (ROOT / "examples" / "hello-file" / "task.toml").read_text()
        + f'\n[mcp.servers.local]\nurl = "{url}"\n'
    )
    configured = _prepared(tmp_path, {})
    assert _call(configured, "local__echo", {"text": "there"}, tmp_path) == "echo: there"
    # A run's own server where they are not allowed (the default): refused at connection.
    refused = _prepared(tmp_path, {"web": {"url": url}})
    said = _call(refused, "web__echo", {"text": "hi"}, tmp_path)
    assert said.startswith("start error: mcp server web: url resolves to a non-public"), said


def test_the_pinned_transport_keeps_the_names_host_and_tls_name() -> None:
    """What goes to the wire: the checked address dialled, the URL's Host header and TLS
    name (https), the first address that accepts kept; another host refused unsent."""
    httpx2 = pytest.importorskip("httpx2")
    from stayer.mcp.client import _Pinned

    sent: list[Any] = []

    class Wire(httpx2.AsyncBaseTransport):
        async def handle_async_request(self, request: Any) -> Any:
            sent.append(request)
            if request.url.host == "2001:db8::1":
                raise httpx2.ConnectError("refused", request=request)
            return httpx2.Response(200, request=request)

    async def go() -> str:
        transport = _Pinned(f"https://{NAME}:8443/mcp", ["2001:db8::1", "192.0.2.7"])
        transport.inner = Wire()
        async with httpx2.AsyncClient(transport=transport) as client:  # type: ignore[arg-type]
            for _ in range(2):
                await client.post(f"https://{NAME}:8443/mcp", content=b"{}")
            try:
                await client.get("https://127.0.0.1:8443/mcp")
            except httpx2.ConnectError as e:
                return str(e)
        return "sent"

    refused = asyncio.run(go())
    assert [str(r.url) for r in sent] == [
        "https://[2001:db8::1]:8443/mcp",
        "https://192.0.2.7:8443/mcp",
        "https://192.0.2.7:8443/mcp",  # the one that accepted, from then on
    ]
    assert all(r.headers["Host"] == f"{NAME}:8443" for r in sent)
    assert all(r.extensions["sni_hostname"] == NAME for r in sent)
    assert refused.startswith("refused: 127.0.0.1 is not the server's host")

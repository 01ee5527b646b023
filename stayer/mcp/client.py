"""One connection to an MCP server, on the official ``mcp`` SDK, that never hangs its caller.

Each server is owned by a task of its own (the SDK's transports are anyio task groups: a
server that dies must not cancel the agent's task). ``start`` connects, initialises and
lists the tools within ``startup_timeout_s``; ``call`` sends one ``tools/call`` and returns
its result, or raises :class:`McpCallError` when the server dies, sends a line that is not
JSON-RPC, or does not answer in time. A ``notifications/tools/list_changed`` sets
``list_changed`` (what to do with it is the caller's). A stdio server in a sandbox is
started through the sandbox's own ``exec`` (:mod:`stayer.mcp.pipes`); on the host with the
SDK's ``stdio_client``; an HTTP server with ``streamable_http_client``, whose HTTP client
dials only the addresses its host resolved to when it connected, each checked unless
``allow_private`` (``stayer.addresses``; docs/mcp.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any, cast
from urllib.parse import urlsplit

from stayer.addresses import resolve
from stayer.mcp.config import McpServer
from stayer.sandbox.base import Sandbox
from stayer.tools.effects import META_KEY

# The SDK logs a traceback for each line a server sends that is not JSON-RPC; here that is
# a tool error the model reads (see ``Connection.call``), not the operator's business.
logging.getLogger("mcp.client.stdio").setLevel(logging.CRITICAL)


class McpCallError(Exception):
    """A call that got no answer: the server died, hung, or sent garbage."""


class AddressRefused(OSError):
    """An HTTP server's URL that resolves (now) to an address it may not reach."""


class McpStartError(OSError):
    """A server that could not start: the run stops, and ``stayer resume`` continues it
    once the server is fixed (as after any other failure of the machine)."""


@dataclass(frozen=True, slots=True)
class ServerTool:
    """A tool as its server lists it. The hints are MCP's annotations (None: not said)."""

    name: str
    description: str
    input_schema: dict[str, Any]
    read_only_hint: bool | None = None
    destructive_hint: bool | None = None
    idempotent_hint: bool | None = None
    open_world_hint: bool | None = None


class Connection:
    """``allow_private``: an HTTP server may be on a non-public address (it is checked
    at each connection, on the one lookup the connection then uses)."""

    def __init__(
        self,
        name: str,
        server: McpServer,
        sandbox: Sandbox | None = None,
        *,
        allow_private: bool = True,
    ) -> None:
        if server.where == "sandbox" and sandbox is None:
            raise ValueError(f"mcp server {name}: runs in the sandbox, and none was given")
        self.name, self.server, self.sandbox = name, server, sandbox
        self.allow_private = allow_private
        self.tools: list[ServerTool] = []
        self.list_changed = False
        self.garbage: str | None = None  # the last thing it sent that was not JSON-RPC
        self._session: Any = None
        self._ready = asyncio.Event()
        self._closing = asyncio.Event()
        self._broken = asyncio.Event()  # set on garbage: the call in flight fails now
        self._owner: asyncio.Task[None] | None = None
        self._error: BaseException | None = None
        self._said: list[str] = []  # a sandboxed server's last stderr, when it exited

    # --- life ---------------------------------------------------------------------------

    async def start(self) -> list[ServerTool]:
        self._owner = asyncio.create_task(self._own(), name=f"mcp:{self.name}")
        try:
            async with asyncio.timeout(self.server.startup_timeout_s):
                await self._ready.wait()
        except TimeoutError:
            await self.close()
            raise McpStartError(
                f"mcp server {self.name}: no tool list within {self.server.startup_timeout_s:g} s"
            ) from None
        if self._session is None:
            await self.close()
            if isinstance(self._error, AddressRefused):
                raise McpStartError(str(self._error))
            why = self.why().removeprefix("MCPError: Connection closed").strip()
            raise McpStartError(f"mcp server {self.name} could not start {why}".strip())
        return self.tools

    async def close(self) -> None:
        self._closing.set()
        owner = self._owner
        if owner is None or owner.done():
            return
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(10):
                await asyncio.shield(owner)
                return
        owner.cancel()
        with contextlib.suppress(BaseException):
            await owner

    async def restart(self) -> None:
        """Stop what is left of the server and start it again (McpCallError if it cannot)."""
        await self.close()
        self._session, self._error, self._owner, self.garbage = None, None, None, None
        self._said.clear()
        self._ready, self._closing = asyncio.Event(), asyncio.Event()
        await self.start()

    def why(self) -> str:
        e = self._error
        while isinstance(e, BaseExceptionGroup) and e.exceptions:
            e = e.exceptions[0]
        said = f" (its stderr: {self._said[-1]})" if self._said and self._said[-1] else ""
        if e is None:
            return "it exited" + said
        return (f"{type(e).__name__}: {e}" if str(e) else type(e).__name__) + said

    @property
    def alive(self) -> bool:
        return self._owner is not None and not self._owner.done() and self._session is not None

    async def _own(self) -> None:
        try:
            from mcp import ClientSession

            gone = asyncio.Event()
            async with (
                self._transport() as (read, write),
                ClientSession(
                    _Watched(read, gone), write, message_handler=self._on_message
                ) as session,
            ):
                await session.initialize()
                self.tools = await self._list(session)
                self._session = session
                self._ready.set()
                ends = [asyncio.ensure_future(e.wait()) for e in (self._closing, gone)]
                try:
                    await asyncio.wait(ends, return_when=asyncio.FIRST_COMPLETED)
                finally:
                    for e in ends:
                        e.cancel()
                if gone.is_set() and not self._closing.is_set():
                    self._error = EOFError("the server closed its output (it exited)")
        except BaseException as e:  # noqa: BLE001  (kept for why(); the owner ends here)
            self._error = self._error or e
            if isinstance(e, asyncio.CancelledError) and self._closing.is_set():
                return
        finally:
            self._ready.set()

    async def _list(self, session: Any) -> list[ServerTool]:
        tools: list[ServerTool] = []
        cursor: str | None = None
        from mcp.types import PaginatedRequestParams

        for _ in range(100):  # a server that pages forever is cut at 100 pages
            page = await session.list_tools(
                params=PaginatedRequestParams(cursor=cursor) if cursor else None
            )
            for t in page.tools:
                a = t.annotations
                tools.append(
                    ServerTool(
                        t.name,
                        t.description or "",
                        dict(t.input_schema or {"type": "object"}),
                        a.read_only_hint if a else None,
                        a.destructive_hint if a else None,
                        a.idempotent_hint if a else None,
                        a.open_world_hint if a else None,
                    )
                )
            cursor = page.next_cursor
            if not cursor:
                break
        return tools

    async def relist(self) -> list[ServerTool]:
        """The server's tool list now (after a ``list_changed``)."""
        if not self.alive:
            raise McpCallError(f"mcp server {self.name} is not running: {self.why()}")
        tools = await self._guarded(self._list(self._session), 30.0, "tools/list")
        self.list_changed = False
        return tools

    async def _on_message(self, message: Any) -> None:
        from mcp.types import ToolListChangedNotification

        if isinstance(message, Exception):
            self.garbage = f"{type(message).__name__}: {str(message)[:200]}"
            self._broken.set()
        elif isinstance(message, ToolListChangedNotification):
            self.list_changed = True

    @contextlib.asynccontextmanager
    async def _transport(self) -> AsyncIterator[Any]:
        s = self.server
        if s.url is not None:
            from mcp.client.streamable_http import streamable_http_client

            async with (
                await self._pinned_client(s.url) as http,
                streamable_http_client(s.url, http_client=http) as streams,
            ):
                yield streams[0], streams[1]
        elif s.trust == "host":
            from mcp.client.stdio import StdioServerParameters, stdio_client

            assert s.command is not None
            params = StdioServerParameters(
                command=s.command[0], args=s.command[1:], env=dict(s.env) or None
            )
            with open(os.devnull, "w") as errlog:
                async with stdio_client(params, errlog=errlog) as streams:
                    yield streams[0], streams[1]
        else:
            from stayer.mcp.pipes import sandboxed_stdio

            assert s.command is not None and self.sandbox is not None
            async with sandboxed_stdio(self.sandbox, s.command, s.env, self._said) as streams:
                yield streams

    async def _pinned_client(self, url: str) -> Any:
        """The SDK's HTTP client for ``url``, connecting only to the addresses its host
        resolves to now, each checked (``stayer.addresses``): never looked up again."""
        import httpx2
        from mcp.shared._httpx_utils import MCP_DEFAULT_SSE_READ_TIMEOUT, MCP_DEFAULT_TIMEOUT

        addresses, problem = await asyncio.to_thread(resolve, url, allow_private=self.allow_private)
        if problem is not None:
            raise AddressRefused(f"mcp server {self.name}: url {problem}")
        # What the SDK's ``create_mcp_http_client`` makes (its timeouts, redirects left to
        # the SDK, which follows them within the origin only), over a transport that dials
        # the checked addresses; no proxy from the environment.
        return httpx2.AsyncClient(
            headers=dict(self.server.headers),
            timeout=httpx2.Timeout(MCP_DEFAULT_TIMEOUT, read=MCP_DEFAULT_SSE_READ_TIMEOUT),
            follow_redirects=False,
            trust_env=False,
            transport=cast(httpx2.AsyncBaseTransport, _Pinned(url, addresses)),
        )

    # --- calls --------------------------------------------------------------------------

    async def call(
        self, tool: str, args: dict[str, Any], timeout: float, idempotency_key: str | None = None
    ) -> Any:
        """The ``CallToolResult`` of ``tool``; McpCallError when there is none. A server
        that exited, hung or sent garbage before is started again first. The call's
        ``idempotency_key`` travels in the request's ``_meta``."""
        if not self.alive:
            try:
                await self.restart()
            except McpStartError as e:
                raise McpCallError(str(e)) from None
        coro = (
            self._session.call_tool(tool, args, meta={META_KEY: idempotency_key})
            if idempotency_key
            else self._session.call_tool(tool, args)
        )
        return await self._guarded(coro, timeout, f"{tool}")

    async def _guarded(self, coro: Any, timeout: float, what: str) -> Any:
        from mcp.shared.exceptions import MCPError
        from mcp.types import CONNECTION_CLOSED

        self._broken.clear()
        call = asyncio.ensure_future(coro)
        call.add_done_callback(lambda f: f.cancelled() or f.exception())  # always retrieved
        broken = asyncio.ensure_future(self._broken.wait())
        assert self._owner is not None
        try:
            done, _ = await asyncio.wait(
                {call, self._owner, broken}, timeout=timeout, return_when=asyncio.FIRST_COMPLETED
            )
        finally:
            broken.cancel()
        if call in done:
            try:
                return call.result()
            except MCPError as e:
                if e.error.code != CONNECTION_CLOSED:  # the server's own error answer
                    raise McpCallError(f"mcp server {self.name}: {what}: {e}") from None
                done = {self._owner}  # the connection ended under the call
            except Exception as e:  # noqa: BLE001  (the SDK's failures are the server's)
                raise McpCallError(
                    f"mcp server {self.name}: {what}: {type(e).__name__}: {e}"
                ) from None
        call.cancel()
        with contextlib.suppress(BaseException):
            await call
        if self._owner in done:
            why = f"exited during {what}"
        elif self._broken.is_set():
            why = f"sent a message that is not JSON-RPC during {what} ({self.garbage})"
        else:
            why = f"gave no answer to {what} within {timeout:g} s"
        # Whatever it was doing is abandoned: the next call starts it afresh.
        await self.close()
        raise McpCallError(
            f"mcp server {self.name} {why}; it was stopped, and the next call starts it again"
        )


class _Pinned:  # an httpx2.AsyncBaseTransport (httpx2 is imported only when one is used)
    """An httpx2 transport that sends every request for the server's host to the
    addresses checked when it connected (the first that accepts, then that one only),
    with the URL's Host header and TLS name, and refuses a request for any other host
    (a redirect elsewhere): DNS is not asked again, so it cannot answer otherwise."""

    def __init__(self, url: str, addresses: list[str]) -> None:
        import httpx2

        self.host = (urlsplit(url).hostname or "").lower()
        self.addresses = list(addresses)
        self.inner = httpx2.AsyncHTTPTransport()

    async def handle_async_request(self, request: Any) -> Any:
        import httpx2

        if request.url.host.lower() != self.host:
            raise httpx2.ConnectError(
                f"refused: {request.url.host} is not the server's host ({self.host}), "
                "whose addresses were checked",
                request=request,
            )
        failed: Exception | None = None
        for address in list(self.addresses):
            # TLS asks for and checks the URL's name, not the address dialled.
            extensions = {"sni_hostname": self.host} if request.url.scheme == "https" else {}
            pinned_request = httpx2.Request(
                request.method,
                request.url.copy_with(host=address),
                headers=request.headers,  # Host: the URL's, as the request was built
                stream=request.stream,
                extensions={**request.extensions, **extensions},
            )
            try:
                response = await self.inner.handle_async_request(pinned_request)
            except httpx2.ConnectError as e:
                failed = e
                continue
            self.addresses = [address]  # one server: every request of the session there
            return response
        assert failed is not None
        raise failed

    async def aclose(self) -> None:
        await self.inner.aclose()

    async def __aenter__(self) -> _Pinned:
        await self.inner.__aenter__()
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.inner.__aexit__(*exc)


class _Watched:
    """The transport's read stream, setting ``gone`` when it ends (the server exited or
    closed its output), so that the connection ends rather than waits for what never comes."""

    def __init__(self, inner: Any, gone: asyncio.Event) -> None:
        self.inner, self.gone = inner, gone

    @property
    def last_context(self) -> Any:
        return getattr(self.inner, "last_context", None)

    async def receive(self) -> Any:
        try:
            return await self.inner.receive()
        except Exception:
            self.gone.set()
            raise

    def __aiter__(self) -> _Watched:
        return self

    async def __anext__(self) -> Any:
        try:
            return await self.inner.__anext__()
        except StopAsyncIteration:
            self.gone.set()
            raise

    async def aclose(self) -> None:
        await self.inner.aclose()

    async def __aenter__(self) -> _Watched:
        await self.inner.__aenter__()
        return self

    async def __aexit__(self, *exc: Any) -> bool | None:
        result: bool | None = await self.inner.__aexit__(*exc)
        return result

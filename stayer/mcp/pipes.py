"""A stdio MCP server inside the run's sandbox, spoken to over two named pipes.

The sandbox runs commands, not services, so the server is one long ``exec`` of the
sandbox (every limit, the network rule and the kill of its process tree apply as to
``bash``) whose stdin, stdout and stderr are FIFOs in a private host directory (0700, made
per server start, removed after) mounted at ``/run/stayer-mcp``. The host opens its ends
before the sandbox starts, through the directory's descriptor, and never opens a name
there again: whatever the server puts in their place (a link, a file, a FIFO of its own)
is the server's alone. Its stderr is drained, the last few KiB kept and quoted when it
exits. The streams are the SDK's (``SessionMessage`` or the ``Exception`` of a line that
is not JSON-RPC), so ``mcp.ClientSession`` runs over them as over ``stdio_client``.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shlex
import shutil
import stat
import tempfile
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any

from stayer.sandbox.base import Mount, Sandbox
from stayer.sandbox.process import wait_fd

MOUNT = "/run/stayer-mcp"
_LINE_LIMIT = 32 * 1024 * 1024  # one JSON-RPC message; a longer line is garbage
_FOREVER = 10.0**7  # the server lives until closed; the sandbox needs some deadline
_TAIL = 4096  # bytes of the server's stderr kept


def server_script(argv: Sequence[str], env: Mapping[str, str]) -> str:
    cmd = shlex.join(["env", *(f"{k}={v}" for k, v in env.items()), *argv] if env else argv)
    return f"exec {cmd} <{MOUNT}/in >{MOUNT}/out 2>>{MOUNT}/err"


@contextlib.asynccontextmanager
async def sandboxed_stdio(
    sandbox: Sandbox, argv: Sequence[str], env: Mapping[str, str], said: list[str] | None = None
) -> AsyncIterator[tuple[Any, Any]]:
    """The SDK's (read, write) streams to ``argv`` in ``sandbox``; at the end of its
    output, the tail of its stderr is appended to ``said``."""
    import anyio
    from mcp.shared.message import SessionMessage

    inner = getattr(sandbox, "inner", sandbox)  # past the journal's replaying wrapper
    home = tempfile.mkdtemp(prefix="stayer-mcp-")  # 0700, in the host's private temp
    fds: list[int] = []
    tasks: list[asyncio.Future[Any]] = []
    run: asyncio.Future[Any] | None = None
    try:
        # hold: a reader of ``in`` of ours until the server has opened it, so that the
        # write end opens at once (and a write before the server reads does not fail).
        hold, write_fd, read_fd, err_fd = _open_ends(home, fds)
        tail = bytearray()

        def keep(chunk: bytes) -> None:
            tail.extend(chunk)
            del tail[:-_TAIL]

        def stderr_tail() -> str:
            _drain_now(err_fd, keep)  # what it wrote before it exited is all in the pipe
            return tail.decode(errors="replace").strip()[-300:]

        run = asyncio.ensure_future(
            inner.exec(
                server_script(argv, env),
                timeout=_FOREVER,
                mounts=(Mount(home, MOUNT, writable=True),),
                cwd="/app",
            )
        )
        read_send, read_recv = anyio.create_memory_object_stream[Any](0)
        write_send, write_recv = anyio.create_memory_object_stream[Any](0)

        async def reader() -> None:
            assert run is not None
            buf, seen = bytearray(), 0
            async with read_send:
                while chunk := await _read_some(read_fd, run):
                    if hold in fds:
                        _close(fds, hold)  # it answered: it has opened ``in``
                    buf.extend(chunk)
                    while (nl := buf.find(b"\n", seen)) >= 0:
                        line = bytes(buf[:nl])
                        del buf[: nl + 1]
                        seen = 0
                        if line.strip():
                            await read_send.send(_parse(line, SessionMessage))
                    seen = len(buf)
                    if seen > _LINE_LIMIT:
                        await read_send.send(ValueError("a line longer than 32 MiB"))
                        return
                if said is not None:
                    text = stderr_tail()
                    if not text and run.done() and not run.cancelled() and not run.exception():
                        res = run.result()
                        text = f"exit code {res.exit_code}: {res.stdout.strip()[-300:]}"
                    said.append(text)

        async def drain(fd: int) -> None:
            assert run is not None
            while chunk := await _read_some(fd, run):
                keep(chunk)

        async def writer() -> None:
            async with write_recv:
                async for message in write_recv:
                    data = message.message.model_dump_json(by_alias=True, exclude_unset=True)
                    await asyncio.to_thread(_write_all, write_fd, (data + "\n").encode())

        tasks = [
            asyncio.ensure_future(reader()),
            asyncio.ensure_future(writer()),
            asyncio.ensure_future(drain(err_fd)),
        ]
        yield read_recv, write_send
    finally:
        for t in tasks:
            t.cancel()
        for fd in list(fds):  # a write blocked on a full pipe fails once the server is gone
            _close(fds, fd)
        if run is not None:
            if not run.done():
                run.cancel()  # the sandbox kills the server's whole process tree
            with contextlib.suppress(BaseException):
                await run
        for t in tasks:
            with contextlib.suppress(BaseException):
                await t
        shutil.rmtree(home, ignore_errors=True)  # by descriptors: follows no link


def _open_ends(home: str, fds: list[int]) -> tuple[int, int, int, int]:
    """Make the FIFOs and open the host's ends, before anything else can reach ``home``:
    (a reader of ``in`` to hold, the writer of ``in``, the readers of ``out`` and ``err``),
    each added to ``fds``. Non-blocking but the writer (written from a thread)."""
    dir_fd = os.open(home, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        for name in ("in", "out", "err"):
            os.mkfifo(name, 0o600, dir_fd=dir_fd)
        ends = []
        for name, flags in (
            ("in", os.O_RDWR),
            ("in", os.O_WRONLY),
            ("out", os.O_RDONLY),
            ("err", os.O_RDONLY),
        ):
            fd = os.open(name, flags | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)
            fds.append(fd)
            if not stat.S_ISFIFO(os.fstat(fd).st_mode):
                raise OSError(f"{home}/{name} is not the FIFO made for it")
            ends.append(fd)
    finally:
        os.close(dir_fd)
    os.set_blocking(ends[1], True)
    return ends[0], ends[1], ends[2], ends[3]


async def _read_some(fd: int, run: asyncio.Future[Any]) -> bytes:
    """The next bytes of the pipe ``fd``; b"" at its end, or once the sandbox's command
    has ended and nothing is left in it (a command that never opened its end). Read only
    once it is ready: a FIFO no writer has opened yet reads as its end."""
    while True:
        if not run.done():
            ready = asyncio.ensure_future(wait_fd(fd))
            try:
                await asyncio.wait({ready, run}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                ready.cancel()
        try:
            return os.read(fd, 1 << 16)
        except BlockingIOError:
            if run.done():
                return b""


def _drain_now(fd: int, sink: Any) -> None:
    with contextlib.suppress(OSError):  # BlockingIOError: nothing more now
        while chunk := os.read(fd, 1 << 16):
            sink(chunk)


def _close(fds: list[int], fd: int) -> None:
    fds.remove(fd)
    with contextlib.suppress(OSError):
        os.close(fd)


def _parse(line: bytes, session_message: Any) -> Any:
    from mcp import types

    try:
        return session_message(types.jsonrpc_message_adapter.validate_json(line, by_name=False))
    except ValueError as e:
        return e


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]

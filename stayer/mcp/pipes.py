"""A stdio MCP server inside the run's sandbox, spoken to over two named pipes.

The sandbox runs commands, not services, so the server is one long ``exec`` of the
sandbox (every limit, the network rule and the kill of its process tree apply as to
``bash``) whose stdin and stdout are FIFOs in a host directory mounted at ``/run/stayer-mcp``.
Nothing else of the host is shared with it. Its stderr goes to ``err`` there, quoted in the
error when it exits before answering. The streams are the SDK's (``SessionMessage`` or the
``Exception`` of a line that is not JSON-RPC), so ``mcp.ClientSession`` runs over them as
over ``stdio_client``.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shlex
import shutil
import tempfile
from collections.abc import AsyncIterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from stayer.sandbox.base import Mount, Sandbox

MOUNT = "/run/stayer-mcp"
_LINE_LIMIT = 32 * 1024 * 1024  # one JSON-RPC message; a longer line is garbage
_FOREVER = 10.0**7  # the server lives until closed; the sandbox needs some deadline


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
    home = Path(tempfile.mkdtemp(prefix="stayer-mcp-"))
    os.chmod(home, 0o755)
    fifo_in, fifo_out, err = home / "in", home / "out", home / "err"
    os.mkfifo(fifo_in, 0o666)
    os.mkfifo(fifo_out, 0o666)
    err.touch()
    os.chmod(err, 0o666)
    run = asyncio.ensure_future(
        inner.exec(
            server_script(argv, env),
            timeout=_FOREVER,
            mounts=(Mount(str(home), MOUNT, writable=True),),
            cwd="/app",
        )
    )
    opened = asyncio.ensure_future(
        asyncio.gather(
            asyncio.to_thread(os.open, fifo_in, os.O_WRONLY),
            asyncio.to_thread(os.open, fifo_out, os.O_RDONLY),
        )
    )
    tasks: list[asyncio.Task[None]] = []
    fds: list[int] = []
    try:
        await asyncio.wait({run, opened}, return_when=asyncio.FIRST_COMPLETED)
        if not opened.done():
            _unblock(fifo_in, fifo_out)
            with contextlib.suppress(BaseException):
                fds.extend(await opened)
            res = run.result()
            text = err.read_text(errors="replace").strip()[-500:] or res.stdout.strip()[-500:]
            raise OSError(f"exited with code {res.exit_code} before it started: {text}")
        fds.extend(opened.result())
        write_fd, read_fd = fds
        read_send, read_recv = anyio.create_memory_object_stream[Any](0)
        write_send, write_recv = anyio.create_memory_object_stream[Any](0)

        async def reader() -> None:
            loop = asyncio.get_running_loop()
            stream = asyncio.StreamReader(limit=_LINE_LIMIT)
            transport, _ = await loop.connect_read_pipe(
                lambda: asyncio.StreamReaderProtocol(stream), os.fdopen(os.dup(read_fd), "rb", 0)
            )
            try:
                async with read_send:
                    while True:
                        try:
                            line = await stream.readline()
                        except ValueError as e:  # longer than the limit
                            await read_send.send(e)
                            return
                        if not line:
                            if said is not None:
                                said.append(err.read_text(errors="replace").strip()[-300:])
                            return
                        if line.strip():
                            await read_send.send(_parse(line, SessionMessage))
            finally:
                transport.close()

        async def writer() -> None:
            async with write_recv:
                async for message in write_recv:
                    data = message.message.model_dump_json(by_alias=True, exclude_unset=True)
                    await asyncio.to_thread(_write_all, write_fd, (data + "\n").encode())

        tasks = [asyncio.create_task(reader()), asyncio.create_task(writer())]
        yield read_recv, write_send
    finally:
        for t in tasks:
            t.cancel()
        for fd in fds:
            with contextlib.suppress(OSError):
                os.close(fd)
        if not run.done():
            run.cancel()  # the sandbox kills the server's whole process tree
        with contextlib.suppress(BaseException):
            await run
        for t in tasks:
            with contextlib.suppress(BaseException):
                await t
        if not opened.done():
            _unblock(fifo_in, fifo_out)
        with contextlib.suppress(BaseException):
            for fd in await opened:
                os.close(fd)
        shutil.rmtree(home, ignore_errors=True)


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


def _unblock(fifo_in: Path, fifo_out: Path) -> None:
    """Let this side's blocked opens return: open each FIFO's other end, and close it."""
    for path, flags in ((fifo_in, os.O_RDONLY), (fifo_out, os.O_WRONLY)):
        with contextlib.suppress(OSError):
            os.close(os.open(path, flags | os.O_NONBLOCK))

"""The built-in tools: what the model sees, and that file access cannot leave the sandbox."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from stayer.errors import ConfigError
from stayer.models.base import ToolCall, ToolSpec
from stayer.sandbox.local import LocalSandbox
from stayer.tokens import TiktokenCounter
from stayer.tools import check_args, default_tools, run_tool
from stayer.tools.base import ToolContext, ToolResult

try:
    from stayer.sandbox.bwrap import BwrapSandbox, check_bwrap

    check_bwrap()
    _NO_BWRAP = ""
except ConfigError as e:  # pragma: no cover - depends on the machine
    _NO_BWRAP = str(e)

needs_bwrap = pytest.mark.skipif(bool(_NO_BWRAP), reason=f"bwrap unavailable: {_NO_BWRAP}")

COUNTER = TiktokenCounter()
TOOLS = {t.spec.name: t for t in default_tools(COUNTER)}


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    d = tmp_path / "ws"
    d.mkdir()
    return d


@pytest.fixture
def ctx(ws: Path) -> ToolContext:
    if _NO_BWRAP:
        pytest.skip(f"bwrap unavailable: {_NO_BWRAP}")
    return ToolContext(sandbox=BwrapSandbox(ws), workspace=str(ws), command_timeout=10)


def call(ctx: ToolContext, name: str, **args) -> ToolResult:
    return asyncio.run(run_tool(TOOLS, ToolCall("c1", name, json.dumps(args)), ctx))


def raw_call(ctx: ToolContext, name: str, arguments: str) -> ToolResult:
    return asyncio.run(run_tool(TOOLS, ToolCall("c1", name, arguments), ctx))


# ----------------------------------------------------------------------------- specs


def test_default_tools_and_schemas() -> None:
    assert list(TOOLS) == ["bash", "read_file", "write_file", "edit_file", "memory", "submit"]
    for tool in TOOLS.values():
        assert isinstance(tool.spec, ToolSpec) and len(tool.spec.description) > 80
        params = tool.spec.parameters
        assert params["type"] == "object" and params["additionalProperties"] is False
        assert set(params["required"]) <= set(params["properties"])
        json.dumps(params)  # serialisable as-is for any provider


# ----------------------------------------------------------------------------- bash


def test_bash_output_and_exit_code(ctx: ToolContext) -> None:
    r = call(ctx, "bash", command="echo out; echo err >&2; echo out2; exit 3")
    assert not r.is_error  # a failing command is a result, not a tool failure
    assert r.output == "out\nerr\nout2\n[exit code: 3]"
    assert call(ctx, "bash", command="true").output == "(no output)\n[exit code: 0]"


def test_bash_timeout_is_an_error(ctx: ToolContext, ws: Path) -> None:
    """What a command printed before its time ran out is kept. Whether it got as far as
    printing is told by the file it writes next, not guessed from the clock: on a busy
    machine the sandbox may not start within the time, and the time is doubled then."""
    timeout = 0.5
    while True:
        ctx.command_timeout = timeout
        r = call(ctx, "bash", command="echo partial; : > /app/printed; sleep 100")
        assert r.is_error and f"timed out after {timeout:g} s" in r.output, r.output
        if (ws / "printed").exists():
            assert "partial" in r.output, r.output
            return
        assert timeout < 64, "the command never started within 64 s"
        timeout *= 2


def test_bash_long_output_is_cut_and_saved(ctx: ToolContext, ws: Path) -> None:
    ctx.output_token_budget = 200
    r = call(ctx, "bash", command="seq 1 20000")
    assert not r.is_error
    assert "full output saved to /app/.stayer/outputs/1.txt" in r.output
    assert r.output.startswith("1\n2\n") and r.output.endswith("20000\n[exit code: 0]")
    assert COUNTER.count(r.output) < 260
    saved = (ws / ".stayer/outputs/1.txt").read_text()
    assert saved == "\n".join(str(i) for i in range(1, 20001)) + "\n[exit code: 0]"
    r = call(ctx, "bash", command="seq 1 30000")
    assert "/app/.stayer/outputs/2.txt" in r.output  # numbering continues, nothing overwritten
    assert (ws / ".stayer/outputs/1.txt").read_text() == saved


def test_bash_save_cannot_follow_a_planted_symlink(
    ctx: ToolContext, ws: Path, tmp_path: Path
) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (ws / ".stayer").symlink_to(outside)  # the agent points .stayer at a host directory
    ctx.output_token_budget = 50
    call(ctx, "bash", command="seq 1 5000")
    assert list(outside.iterdir()) == []


# ----------------------------------------------------------------------------- files


def test_write_then_read(ctx: ToolContext, ws: Path) -> None:
    r = call(ctx, "write_file", path="/app/src/deep/a.py", content="one\ntwo\nthree\n")
    assert not r.is_error and r.output == "wrote 14 bytes (3 lines) to /app/src/deep/a.py"
    assert (ws / "src/deep/a.py").read_text() == "one\ntwo\nthree\n"
    r = call(ctx, "read_file", path="src/deep/a.py")
    assert r.output == "     1\tone\n     2\ttwo\n     3\tthree"
    r = call(ctx, "read_file", path="/app/src/deep/a.py", offset=2, limit=1)
    assert r.output == (
        "     2\ttwo\n[showing lines 2-2; the file continues: call read_file with offset=3]"
    )
    assert "fewer than 9 lines" in call(ctx, "read_file", path="src/deep/a.py", offset=9).output


def test_read_errors(ctx: ToolContext, ws: Path) -> None:
    (ws / "d").mkdir()
    (ws / "bin").write_bytes(b"\x00\x01\x02")
    r = call(ctx, "read_file", path="missing.txt")
    assert r.is_error and "No such file" in r.output
    r = call(ctx, "read_file", path="d")
    assert r.is_error and "directory" in r.output
    r = call(ctx, "read_file", path="/etc/passwd")
    assert r.is_error and "outside /app" in r.output
    r = call(ctx, "read_file", path="../etc/passwd")
    assert r.is_error and "outside /app" in r.output
    r = call(ctx, "read_file", path="bin")
    assert r.is_error and "binary" in r.output


def test_read_is_cut_to_the_budget_with_a_continuation(ctx: ToolContext, ws: Path) -> None:
    (ws / "big.txt").write_text("".join(f"line number {i}\n" for i in range(1, 5001)))
    ctx.output_token_budget = 300
    r = call(ctx, "read_file", path="big.txt")
    assert COUNTER.count(r.output) < 340
    last = r.output.rsplit("offset=", 1)[1].rstrip("]")
    assert int(last) > 10
    r2 = call(ctx, "read_file", path="big.txt", offset=int(last), limit=2)
    assert r2.output.startswith(f"{int(last):6}\tline number {last}\n")


def test_edit_file(ctx: ToolContext, ws: Path) -> None:
    (ws / "a.txt").write_text("alpha\nbeta\nbeta\ngamma\n")
    r = call(ctx, "edit_file", path="a.txt", old_string="gamma", new_string="GAMMA")
    assert not r.is_error and r.output == "edited /app/a.txt: replaced 1 occurrence at line 4"
    r = call(ctx, "edit_file", path="a.txt", old_string="beta", new_string="B")
    assert r.is_error and "occurs 2 times" in r.output
    r = call(ctx, "edit_file", path="a.txt", old_string="delta", new_string="D")
    assert r.is_error and "not found" in r.output
    r = call(ctx, "edit_file", path="a.txt", old_string="beta", new_string="B", replace_all=True)
    assert not r.is_error and "2 occurrences" in r.output
    assert (ws / "a.txt").read_text() == "alpha\nB\nB\nGAMMA\n"
    r = call(ctx, "edit_file", path="nope.txt", old_string="x", new_string="y")
    assert r.is_error and "cannot read /app/nope.txt" in r.output


def test_symlinks_cannot_escape_app(ctx: ToolContext, ws: Path, tmp_path: Path) -> None:
    host = tmp_path / "outside" / "shadow"
    host.parent.mkdir()
    host.write_text("root:secret\n")
    (ws / "link").symlink_to(host)
    (ws / "etclink").symlink_to("/etc/hostname")
    before = Path("/etc/hostname").read_bytes() if Path("/etc/hostname").exists() else None

    assert call(ctx, "write_file", path="/app/link", content="pwned\n").is_error
    assert call(ctx, "edit_file", path="link", old_string="secret", new_string="x").is_error
    assert call(ctx, "read_file", path="link").is_error  # the host file is not there to read
    assert host.read_text() == "root:secret\n"

    r = call(ctx, "write_file", path="etclink", content="pwned\n")
    assert r.is_error and "Read-only" in r.output
    if before is not None:
        assert Path("/etc/hostname").read_bytes() == before


def test_file_tools_under_the_local_backend(ws: Path) -> None:
    lctx = ToolContext(sandbox=LocalSandbox(ws), workspace=str(ws), command_timeout=10)
    assert not call(lctx, "write_file", path="/app/x/y.txt", content="hi\n").is_error
    assert (ws / "x/y.txt").read_text() == "hi\n"
    assert call(lctx, "read_file", path="x/y.txt").output == "     1\thi"
    assert not call(lctx, "edit_file", path="x/y.txt", old_string="hi", new_string="ho").is_error
    assert (ws / "x/y.txt").read_text() == "ho\n"


# ----------------------------------------------------------------------------- submit, dispatch


def test_submit(ws: Path) -> None:
    lctx = ToolContext(sandbox=LocalSandbox(ws), workspace=str(ws))
    r = raw_call(lctx, "submit", "")
    assert r.submitted and not r.is_error
    r = call(lctx, "submit", summary="fixed the bug")
    assert r.submitted and r.output == "submitted: fixed the bug"


def test_run_tool_reports_bad_calls(ws: Path) -> None:
    lctx = ToolContext(sandbox=LocalSandbox(ws), workspace=str(ws))
    r = raw_call(lctx, "bash", '{"command": "ls"')
    assert r.is_error and "not valid JSON" in r.output and "command" in r.output
    r = raw_call(lctx, "bash", "[1, 2]")
    assert r.is_error and "must be a JSON object, got array" in r.output
    r = raw_call(lctx, "bash", "{}")
    assert r.is_error and "missing required argument(s): command" in r.output
    r = raw_call(lctx, "bash", '{"command": 5}')
    assert r.is_error and "'command' must be string, got integer" in r.output
    r = raw_call(lctx, "read_file", '{"path": "a", "offset": "2"}')
    assert r.is_error and "'offset' must be integer" in r.output
    r = raw_call(lctx, "read_file", '{"path": "a", "offset": 0}')
    assert r.is_error and "at least 1" in r.output
    r = raw_call(lctx, "read_file", '{"path": "a", "lines": 3}')
    assert r.is_error and "unknown argument(s): lines" in r.output
    r = raw_call(
        lctx, "edit_file", '{"path": "a", "old_string": "x", "new_string": "y", "replace_all": 1}'
    )
    assert r.is_error and "must be boolean" in r.output
    r = raw_call(lctx, "rm_rf", "{}")
    assert r.is_error and "unknown tool 'rm_rf'" in r.output and "bash" in r.output


def test_run_tool_accepts_integral_floats_and_nulls(ws: Path) -> None:
    (ws / "a.txt").write_text("1\n2\n3\n")
    lctx = ToolContext(sandbox=LocalSandbox(ws), workspace=str(ws))
    r = raw_call(lctx, "read_file", '{"path": "a.txt", "offset": 2.0, "limit": null}')
    assert not r.is_error and r.output.startswith("     2\t2")


def test_run_tool_never_raises() -> None:
    class Broken:
        spec = ToolSpec("broken", "always fails", {"type": "object", "properties": {}})

        async def __call__(self, args, ctx):
            raise RuntimeError("boom")

    r = asyncio.run(run_tool({"broken": Broken()}, ToolCall("c", "broken", "{}"), None))  # type: ignore[arg-type]
    assert r.is_error and "RuntimeError: boom" in r.output


def test_check_args_bool_is_not_an_integer() -> None:
    schema = TOOLS["read_file"].spec.parameters
    assert (
        check_args(schema, {"path": "a", "limit": True})
        == "argument 'limit' must be integer, got boolean"
    )
    assert check_args(schema, {"path": "a", "limit": 3}) is None


def test_file_and_team_tools_read_the_model_s_arguments_into_records(ws: Path) -> None:
    from stayer.tools.files import EditArgs, ReadArgs
    from stayer.tools.messaging import (
        HandoffArgs,
        HandoffTool,
        SendMessageTool,
        WaitArgs,
        WaitForMessageTool,
    )

    asked: list[tuple[object, ...]] = []

    class Thread:
        async def send(self, to: str, content: str) -> str:
            asked.append(("send", to, content))
            return "sent"

        async def wait(self, sender: str | None, timeout: float) -> str:
            asked.append(("wait", sender, timeout))
            return "waited"

        async def handoff(self, to: str, brief: str, history: str | None) -> str:
            asked.append(("handoff", to, brief, history))
            return "handed"

    ctx = ToolContext(sandbox=LocalSandbox(ws), workspace=str(ws))
    thread, peers = Thread(), ["b"]
    tools = {
        t.spec.name: t
        for t in (
            SendMessageTool(thread, peers),
            WaitForMessageTool(thread, peers),
            HandoffTool(thread, peers),
        )
    }
    assert WaitForMessageTool.Args is WaitArgs and HandoffTool.Args is HandoffArgs
    assert TOOLS["read_file"].Args is ReadArgs and TOOLS["edit_file"].Args is EditArgs
    for name, arguments in [
        ("send_message", '{"to": "b", "content": "hi"}'),
        ("wait_for_message", '{"from": "b", "timeout": 7200}'),
        ("wait_for_message", "{}"),
        ("handoff", '{"to": "b", "brief": "do it", "history": null}'),
    ]:
        assert not asyncio.run(run_tool(tools, ToolCall("c", name, arguments), ctx)).is_error
    assert asked == [
        ("send", "b", "hi"),
        ("wait", "b", 3600.0),
        ("wait", None, 600.0),
        ("handoff", "b", "do it", None),
    ]
    bad = asyncio.run(
        run_tool(
            tools, ToolCall("c", "handoff", '{"to": "b", "brief": "x", "history": "all"}'), ctx
        )
    )
    assert bad.is_error and bad.output.startswith("handoff: ")

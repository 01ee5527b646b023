"""MCP servers' tools: real servers no one here wrote (``mcp-server-time`` from PyPI,
``@modelcontextprotocol/server-everything`` from npm, installed by ``.ci/run`` under
``~/.cache/stayer-bench/mcp-servers``; skipped, saying why, without them) over stdio and
streamable HTTP, and ``tests/mcp_servers/tiny.py`` for what must be forced: a crash
mid-call, a hang, garbage, names that collide, a sandboxed server probing the host."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from stayer.errors import ConfigError
from stayer.mcp.config import parse_servers, run_servers
from stayer.mcp.tools import McpRefused, McpTools, reserved_names
from stayer.mcp.views import McpView
from stayer.tokens import counter_for
from stayer.tools.base import ToolContext
from tests.service_helpers import free_port
from tests.test_cli_output import stayer

ROOT = Path(__file__).resolve().parent.parent
TINY = ROOT / "tests" / "mcp_servers" / "tiny.py"
CACHE = Path(os.environ.get("STAYER_MCP_SERVERS", Path.home() / ".cache/stayer-bench/mcp-servers"))
TIME_SERVER = CACHE / "venv" / "bin" / "mcp-server-time"
EVERYTHING = CACHE / "node_modules" / ".bin" / "mcp-server-everything"
COUNTER = counter_for("anthropic", "claude-sonnet-4-5")
SIM = "sim:claude-sonnet-4-5"
TINY_TOML = '[mcp.servers.t]\ncommand = ["python3", "tiny.py"]\n'

needs_time = pytest.mark.skipif(
    not TIME_SERVER.exists(), reason=f"mcp-server-time not installed in {CACHE} (.ci/run)"
)
needs_everything = pytest.mark.skipif(
    not EVERYTHING.exists() or shutil.which("node") is None,
    reason=f"@modelcontextprotocol/server-everything or node not installed ({CACHE}, .ci/run)",
)


def servers(**named: dict) -> dict:
    return parse_servers({"servers": named}, "stayer.toml")


def ctx(workspace: Path, sandbox=None, timeout: float = 20.0) -> ToolContext:
    return ToolContext(
        sandbox=sandbox, workspace=str(workspace), command_timeout=timeout, output_token_budget=200
    )


def bwrap(workspace: Path):
    from stayer.sandbox.bwrap import BwrapSandbox, check_bwrap

    try:
        check_bwrap()
    except ConfigError as e:
        pytest.skip(f"bwrap unusable here: {e}")
    return BwrapSandbox(workspace)


def make_task(root: Path, toml: str, reward: bool = True) -> Path:
    """A task whose environment holds tiny.py and whose task.toml is ``toml``."""
    task = root / "task"
    (task / "environment").mkdir(parents=True)
    (task / "tests").mkdir()
    shutil.copy(TINY, task / "environment" / "tiny.py")
    (task / "instruction.md").write_text("Use the tools.\n")
    (task / "task.toml").write_text(toml)
    test = "echo 1 > /logs/verifier/reward.txt\n" if reward else ""
    (task / "tests" / "test.sh").write_text("#!/bin/bash\n" + test)
    return task


def run_script(
    root: Path, task: Path, script: str, mode: str = "auto", *more: str
) -> subprocess.CompletedProcess:
    """``stayer run TASK --sim-policy script:… --mcp-tools MODE --json MORE`` with ``script``."""
    (root / "script.yaml").write_text(script)
    policy = f"script:{root / 'script.yaml'}"
    return stayer(
        "run", str(task), "--model", SIM, "--sim-policy", policy, "--mcp-tools", mode, "--json",
        *more, home=root / "home", columns=80,
    )  # fmt: skip


async def connected(named: dict, sandbox=None):
    tools = McpTools(named, sandbox, COUNTER, reserved_names(COUNTER))
    await tools.__aenter__()
    return tools


# --- configuration ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("data", "said"),
    [
        ({"servers": {"a": {}}}, "give either command"),
        ({"servers": {"a": {"command": ["x"], "url": "http://h/"}}}, "give either command"),
        ({"servers": {"a__b": {"command": ["x"]}}}, "server name 'a__b'"),
        (
            {"servers": {"a": {"command": ["x"], "trusted": "host"}}},
            "unknown key 'mcp.servers.a.trusted'",
        ),
        ({"servers": {"a": {"command": ["x"], "trust": "root"}}}, "mcp.servers.a.trust"),
        ({"servers": {"a": {"url": "ftp://h/"}}}, "http:// or https://"),
        ({"servers": {"a": {"url": "http://h/", "env": {"K": "v"}}}}, "env and trust"),
        ({"server": {}}, "unknown key 'mcp.server'"),
        (
            {"servers": {"a": {"url": "http://h/", "headers": {"A": "x\r\nX-Injected: 1"}}}},
            "mcp.servers.a.headers: header 'A': a value must not hold CR, LF",
        ),
        (
            {"servers": {"a": {"url": "http://h/", "headers": {"A: b\r\nC": "x"}}}},
            "mcp.servers.a.headers: header name",
        ),
    ],
)
def test_bad_config_is_one_line_naming_file_and_key(data: dict, said: str) -> None:
    with pytest.raises(ConfigError) as e:
        parse_servers(data, "stayer.toml")
    assert str(e.value).startswith("stayer.toml: ") and said in str(e.value)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize(
    ("server_toml", "said"),
    [
        (
            'command = ["sh", "-c", "id > /tmp/owned"]\ntrust = "host"\n',
            "t/task.toml: mcp.servers.s.trust: an uploaded task's MCP servers run in",
        ),
        ('url = "http://169.254.169.254/mcp"\n', "t/task.toml: mcp.servers.s.url: an uploaded"),
    ],
)
def test_an_uploaded_task_may_not_run_a_server_on_the_host(
    tmp_path: Path, server_toml: str, said: str
) -> None:
    from stayer.errors import ConfigError
    from stayer.runtime.uploads import check_task

    task = make_task(tmp_path, "[mcp.servers.s]\n" + server_toml)
    with pytest.raises(ConfigError) as e:
        check_task(task, "t")
    assert str(e.value).startswith(said) and "\n" not in str(e.value), e.value
    check_task(make_task(tmp_path / "ok", '[mcp.servers.s]\ncommand = ["x"]\n'), "t")


def test_a_server_named_twice_is_refused() -> None:
    one = servers(t={"command": ["x"]})
    with pytest.raises(ConfigError, match="also named in task.toml"):
        run_servers(one, "task.toml", one, "stayer.toml", None)
    both = run_servers(one, "task.toml", {}, None, {"u": {"url": "https://example.org/mcp"}})
    assert sorted(both) == ["t", "u"] and both["u"].where == "remote"


def test_bad_task_toml_mcp_exits_2_writing_nothing(tmp_path: Path) -> None:
    task = make_task(tmp_path, '[mcp.servers.t]\ncommand = ["x"]\nurl = "http://h/"\n')
    r = stayer("run", str(task), "--model", SIM, home=tmp_path / "home")
    assert r.returncode == 2, r.stderr
    assert "task.toml: mcp.servers.t" in r.stderr and len(r.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "home" / "runs").exists()


# --- real servers --------------------------------------------------------------------------


@needs_time
def test_mcp_server_time_over_stdio_on_the_host(tmp_path: Path) -> None:
    async def go() -> tuple[list[str], str, bool]:
        mcp = await connected(servers(time={"command": [str(TIME_SERVER)], "trust": "host"}))
        try:
            tools = {t.spec.name: t for t in mcp.tools}
            out = await tools["time__get_current_time"]({"timezone": "Europe/Paris"}, ctx(tmp_path))
            return list(tools), out.output, out.is_error
        finally:
            await mcp.close()

    names, output, is_error = asyncio.run(go())
    assert names == ["time__convert_time", "time__get_current_time"]
    assert not is_error and json.loads(output)["timezone"] == "Europe/Paris"


@needs_everything
def test_server_everything_over_stdio_and_streamable_http(tmp_path: Path) -> None:
    port = free_port()
    env = {**os.environ, "PORT": str(port)}
    http = subprocess.Popen(
        [str(EVERYTHING), "streamableHttp"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 60
        while True:
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", port)) == 0:
                    break
            assert time.monotonic() < deadline and http.poll() is None, "server did not listen"
            time.sleep(0.2)

        async def go() -> dict[str, tuple[list[str], str]]:
            seen = {}
            for name, server in (
                ("stdio", {"command": [str(EVERYTHING), "stdio"], "trust": "host"}),
                ("web", {"url": f"http://127.0.0.1:{port}/mcp"}),
            ):
                mcp = await connected(servers(**{name: server}))
                try:
                    tools = {t.spec.name: t for t in mcp.tools}
                    out = await tools[f"{name}__echo"]({"message": "hi there"}, ctx(tmp_path))
                    assert not out.is_error, out.output
                    seen[name] = (sorted(tools), out.output)
                finally:
                    await mcp.close()
            return seen

        seen = asyncio.run(go())
    finally:
        os.killpg(http.pid, 9)
        http.wait()
    for name, (names, output) in seen.items():
        assert f"{name}__echo" in names and len(names) >= 5
        assert "hi there" in output
    assert [n.split("__", 1)[1] for n in seen["stdio"][0]] == [
        n.split("__", 1)[1] for n in seen["web"][0]
    ]


# --- forced behaviours, in the sandbox ---------------------------------------------------------


def test_crash_hang_and_garbage_are_tool_errors_not_a_hung_run(tmp_path: Path) -> None:
    shutil.copy(TINY, tmp_path / "tiny.py")
    sandbox = bwrap(tmp_path)

    async def go() -> list[tuple[str, bool, str, float]]:
        mcp = await connected(servers(t={"command": ["python3", "tiny.py"]}), sandbox)
        tools = {t.spec.name: t for t in mcp.tools}
        seen = []
        try:
            for name, args, timeout in (
                ("t__echo", {"text": "hi"}, 60.0),
                ("t__big", {"n": 20000}, 60.0),
                ("t__slow", {"seconds": 3600}, 2.0),
                ("t__echo", {"text": "after the hang"}, 3600.0),
                ("t__garbage", {}, 3600.0),
                ("t__crash", {}, 3600.0),
                ("t__echo", {"text": "after the crash"}, 3600.0),
            ):
                t0 = time.monotonic()
                out = await tools[name](args, ctx(tmp_path, sandbox, timeout))
                seen.append((name, out.is_error, out.output, time.monotonic() - t0))
        finally:
            await mcp.close()
            await sandbox.close()
        return seen

    seen = asyncio.run(asyncio.wait_for(go(), 600))
    echo, big, slow, after_hang, garbage, crash, after_crash = seen
    assert echo[:3] == ("t__echo", False, "hi")
    assert not big[1] and len(big[2]) < 2000 and "x" * 50 in big[2]  # cut to the budget
    assert slow[1] and "no answer to slow within 2 s" in slow[2]
    assert garbage[1] and "not JSON-RPC" in garbage[2]
    assert crash[1] and "exited during crash" in crash[2]
    # started again after each: the server works for the next call
    assert after_hang[1:3] == (False, "after the hang")
    assert after_crash[1:3] == (False, "after the crash")
    # none waited for its time limit (an hour)
    assert max(garbage[3], crash[3], after_crash[3]) < 600


def test_a_sandboxed_server_cannot_reach_the_host(tmp_path: Path) -> None:
    shutil.copy(TINY, tmp_path / "tiny.py")
    sandbox = bwrap(tmp_path)
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    port = listener.getsockname()[1]

    async def reach(trust: str) -> str:
        command = ["python3", "tiny.py" if trust == "sandbox" else str(TINY)]
        mcp = await connected(servers(t={"command": command, "trust": trust}), sandbox)
        try:
            tools = {t.spec.name: t for t in mcp.tools}
            out = await tools["t__reach"]({"host": "127.0.0.1", "port": port}, ctx(tmp_path))
            return out.output
        finally:
            await mcp.close()

    try:
        inside = asyncio.run(reach("sandbox"))
        on_host = asyncio.run(reach("host"))
    finally:
        listener.close()
        asyncio.run(sandbox.close())
    assert on_host == "connected"  # the probe works: the host's port was listening
    assert inside.startswith("refused"), inside


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["--name-of=slow=echo"], "tool 't__echo' is listed twice"),
        (["--name-of=echo=bash;rm -rf"], "a tool name must be letters"),
        (["--name-of=echo=" + "e" * 62], "over 64"),
    ],
)
def test_colliding_or_malformed_tool_names_are_refused(args: list[str], said: str) -> None:
    async def go() -> None:
        await connected(servers(t={"command": [sys.executable, str(TINY), *args], "trust": "host"}))

    with pytest.raises(McpRefused, match=said.replace("*", r"\*")):
        asyncio.run(go())


def test_a_tool_named_like_stayers_own_is_refused() -> None:
    from stayer.mcp.tools import McpTool, refuse_collisions

    class Conn:
        name = "t"

    from stayer.mcp.client import ServerTool

    tool = McpTool(Conn(), ServerTool("echo", "d", {}), COUNTER)  # type: ignore[arg-type]
    with pytest.raises(McpRefused, match="collides with stayer's own"):
        refuse_collisions([tool], {"t__echo"})
    assert "bash" in reserved_names(COUNTER) and "tool_search" in reserved_names(COUNTER)


def test_stayer_run_calls_a_sandboxed_servers_tool(tmp_path: Path) -> None:
    bwrap(tmp_path)  # skips where bwrap cannot run
    task = make_task(tmp_path, TINY_TOML)
    r = run_script(
        tmp_path,
        task,
        "- tool: t__echo\n  input: {text: hello from the script}\n"
        "- tool: submit\n  input: {summary: done}\n",
    )
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["status"] == "succeeded"
    assert doc["ledger"][0]["tool_calls"][0]["name"] == "t__echo"
    assert not doc["ledger"][0]["tool_calls"][0]["is_error"]
    assert "mcp t: stdio, in the run's sandbox" in r.stderr
    trajectory = (tmp_path / "home" / "runs" / doc["run_id"] / "trajectory.jsonl").read_text()
    assert '"content": "hello from the script"' in trajectory


def test_doctor_has_an_mcp_line_that_is_true() -> None:
    from stayer.doctor import check_extras

    line = {c.name: c for c in check_extras()}["extra [mcp]"]
    assert line.ok and "MCP servers' tools" in line.detail


def test_tools_list_counts_every_tool_and_fits_80_columns(tmp_path: Path) -> None:
    bwrap(tmp_path)  # skips where bwrap cannot run
    task = make_task(tmp_path, TINY_TOML)
    config = tmp_path / "stayer.toml"
    config.write_text(
        f'[mcp.servers.h]\ncommand = ["{sys.executable}", "{TINY}", "--name-of=echo=say"]\n'
        'trust = "host"\n'
    )
    home = tmp_path / "home"
    base = ("tools", "list", "--task", str(task))
    r = stayer(*base, "--config", str(config), "--json", home=home, columns=80)
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    by_name = {t["name"]: t for t in doc["tools"]}
    assert by_name["bash"]["source"] == "stayer" and by_name["t__echo"]["source"] == "t"
    assert by_name["h__say"]["source"] == "h" and "h__echo" not in by_name
    assert doc["servers"] == {"h": "host", "t": "sandbox"}
    assert all(t["tokens"] > 0 for t in doc["tools"])
    assert sum(t["tokens"] for t in doc["tools"]) * 0.8 < doc["total_tokens"]
    text = stayer(*base, home=home, columns=80)
    assert text.returncode == 0, text.stderr
    assert max(len(line) for line in text.stdout.splitlines()) <= 80
    assert "t__echo" in text.stdout and "h__say" not in text.stdout  # no --config: no h
    assert doc["mcp_tools"] == "eager" and all(t["in_prompt"] for t in doc["tools"])
    lazy = json.loads(stayer(*base, "--mcp-tools", "lazy", "--json", home=home).stdout)
    shown = {t["name"] for t in lazy["tools"] if t["in_prompt"]}
    assert "tool_search" in shown and "t__echo" not in shown and "bash" in shown
    assert lazy["mcp_tools"] == "lazy" and lazy["total_tokens"] < doc["total_tokens"]
    bad = stayer(*base, "--config", str(tmp_path / "missing.toml"), home=home)
    assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1


# --- the runtime: a run's own servers ------------------------------------------------------------


@pytest.mark.parametrize(
    ("server", "said"),
    [
        ({"url": "http://127.0.0.1:9/mcp"}, "mcp_servers.x.url: resolves to a non-public"),
        ({"url": "http://169.254.169.254/mcp"}, "mcp_servers.x.url: resolves to a non-public"),
        ({"url": "http://[::1]:9/mcp"}, "mcp_servers.x.url: resolves to a non-public"),
        ({"url": "http://10.0.0.1/mcp"}, "mcp_servers.x.url: resolves to a non-public"),
        ({"command": ["sh"], "trust": "host"}, "mcp_servers.x.trust"),
        ({"command": ["sh"], "url": "https://93.184.216.34/"}, "give either command"),
    ],
)
def test_the_api_refuses_private_urls_and_host_servers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, server: dict, said: str
) -> None:
    client, _ = _api(tmp_path, monkeypatch)
    r = client.post(
        "/v1/runs",
        json={"task": "hello-file", "model": "sim:claude-sonnet-4-5", "mcp_servers": {"x": server}},
    )
    assert r.status_code == 422, r.text
    assert said in r.text


def test_the_api_keeps_a_runs_public_and_sandboxed_servers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    client, db = _api(tmp_path, monkeypatch)
    servers = {"web": {"url": "https://93.184.216.34/mcp"}, "box": {"command": ["python3", "s.py"]}}
    r = client.post(
        "/v1/runs",
        json={"task": "hello-file", "model": "sim:claude-sonnet-4-5", "mcp_servers": servers},
    )
    assert r.status_code == 201, r.text
    assert db.run(r.json()["id"]).request["mcp_servers"] == servers
    assert db.run(r.json()["id"]).request["mcp_tools"] == "auto"


def _api(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Any, Any]:
    pytest.importorskip("fastapi")
    from service_helpers import copy_tasks
    from starlette.testclient import TestClient

    from stayer.runtime.api import create_app

    monkeypatch.delenv("STAYER_DB", raising=False)
    app = create_app(tmp_path / "home", copy_tasks(tmp_path / "tasks", "hello-file"))
    db = app.state.databases.get()
    key = db.create_tenant("acme")
    client = TestClient(app, headers={"Authorization": f"Bearer {key}"})
    return client, db


# --- a tool list that changes mid-run ------------------------------------------------------------


def test_a_list_change_keeps_the_prefix_until_a_call_needs_it(tmp_path: Path) -> None:
    bwrap(tmp_path)  # skips where bwrap cannot run
    r = run_script(
        tmp_path,
        make_task(tmp_path, TINY_TOML),
        "- tool: t__change\n"  # the server says its list changed
        "- tool: bash\n  input: {command: 'true'}\n"  # not the server's: the prefix stays
        "- tool: t__echo\n  input: {text: one}\n"  # the changed server's: taken now
        "- tool: t__added\n"  # offered from here on
        "- tool: submit\n  input: {summary: done}\n",
    )
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    ledger = doc["ledger"]
    assert doc["status"] == "succeeded", doc
    reasons = [(e.get("cache_break") or {}).get("reason") for e in ledger]
    assert reasons[1] is None and reasons[2] is None  # the change did not rewrite the prefix
    assert reasons[3] == "tools_changed"  # taken when the call needed it, priced as a break
    assert ledger[3]["tool_calls"][0]["name"] == "t__added"
    assert not ledger[3]["tool_calls"][0]["is_error"]
    trajectory = (tmp_path / "home" / "runs" / doc["run_id"] / "trajectory.jsonl").read_text()
    assert '"content": "added was called"' in trajectory


def test_lazy_takes_a_list_change_only_when_a_search_or_call_needs_it(tmp_path: Path) -> None:
    """Under lazy tools the catalogue in ``tool_search``'s description is the prefix: a
    change is taken (a priced ``tools_changed`` break, the ledger saying what changed)
    when the agent searches for a new tool, not for an unchanged one; a removed tool
    called is a tool error."""
    bwrap(tmp_path)  # skips where bwrap cannot run
    toml = '[mcp.servers.t]\ncommand = ["python3", "tiny.py", "--drop-on-change=slow"]\n'
    r = run_script(
        tmp_path,
        make_task(tmp_path, toml),
        "- tool: t__change\n"  # steps 1-2 (search, call): the list changes
        "- tool: bash\n  input: {command: 'true'}\n"  # 3
        "- tool: t__big\n  input: {n: 3}\n"  # 4-5: unchanged: answered, prefix kept
        "- tool: t__slow\n  input: {seconds: 0}\n"  # 6-7: removed: a tool error
        "- tool: t__added\n"  # 8-9: new: taken at the search, priced at step 9
        "- tool: submit\n  input: {summary: done}\n",
        "lazy",
    )
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    ledger = doc["ledger"]
    assert doc["status"] == "succeeded" and doc["mcp_tools"] == "lazy", doc
    reasons = [(e.get("cache_break") or {}).get("reason") for e in ledger]
    assert reasons == [None] * 8 + ["tools_changed", None], reasons
    assert ledger[8]["tools_changed"] == {
        "when": "call",
        "added": ["t__added"],
        "removed": ["t__slow"],
        "changed": ["t__echo"],
    }
    calls = [e["tool_calls"][0] for e in ledger]
    assert [c["name"] for c in calls] == ["tool_search"] * 2 + ["bash"] + ["tool_search"] * 6 + [
        "submit"
    ]
    assert [c["is_error"] for c in calls] == [False] * 6 + [True] + [False] * 3
    trajectory = (tmp_path / "home" / "runs" / doc["run_id"] / "trajectory.jsonl").read_text()
    assert "'t__slow' was removed by its server" in trajectory
    assert '"content": "added was called"' in trajectory


def test_lazy_views_take_a_change_each_for_its_own_agent(tmp_path: Path) -> None:
    """Two agents' views of one server (a team's threads): each takes the change itself,
    a search for an unchanged tool needs nothing, and a compaction's take rewrites the
    catalogue with what changed."""

    async def go() -> None:
        mcp = await connected(
            servers(
                t={"command": [sys.executable, str(TINY), "--drop-on-change=slow"], "trust": "host"}
            )
        )
        try:
            one, two = McpView(mcp, "lazy", list), McpView(mcp, "lazy", list)
            (search,) = one.offered()
            assert "added: A tool" not in search.spec.description
            await mcp.tools[[t.spec.name for t in mcp.tools].index("t__change")]({}, ctx(tmp_path))
            for _ in range(100):  # the notification comes with the call's answer
                if one.pending:
                    break
                await asyncio.sleep(0.05)
            assert one.pending and two.pending
            assert not await one.needs("tool_search", '{"query": "t__big"}')
            assert not await one.needs("tool_search", '{"call": "t__slow"}')  # removed
            assert not await one.needs("bash", "{}")
            assert await one.needs("tool_search", '{"call": "t__added"}')
            assert await one.needs("tool_search", '{"query": "echo"}')  # changed
            out = await search({"call": "t__slow", "arguments": {}}, ctx(tmp_path))
            assert out.is_error and "removed by its server" in out.output
            tools, replaced, taken = await one.take("compaction")
            assert replaced == {"tool_search"} and "added: A tool" in tools[0].spec.description
            assert (taken.added, taken.removed, taken.changed) == (
                ["t__added"],
                ["t__slow"],
                ["t__echo"],
            )
            assert not one.pending and two.pending  # the other agent has yet to take it
            _, _, again = await two.take("call")
            assert again.added == ["t__added"]
        finally:
            await mcp.close()

    asyncio.run(go())


def test_a_server_that_cannot_start_stops_the_run_saying_why(tmp_path: Path) -> None:
    bwrap(tmp_path)  # skips where bwrap cannot run
    task = make_task(tmp_path, '[mcp.servers.t]\ncommand = ["no-such-server"]\n')
    r = stayer("run", str(task), "--model", SIM, "--sim-policy", "echo", home=tmp_path / "home")
    assert r.returncode == 2, r.stderr
    last = r.stderr.strip().splitlines()[-1]
    assert "mcp server t could not start" in last and "no-such-server: not found" in last
    assert "stayer resume" in last


def test_stayer_serve_runs_call_a_runs_own_servers(tmp_path: Path) -> None:
    """A run of `stayer serve` with mcp_servers: a stdio server in the run's sandbox and,
    where installed, server-everything over streamable HTTP (loopback: the server was
    started with --allow-private-webhooks, as the test servers are)."""
    bwrap(tmp_path)  # skips where bwrap cannot run
    pytest.importorskip("fastapi")
    from service_helpers import Env, start_server, wait_for

    tasks = tmp_path / "tasks"
    make_task(tasks, "")
    servers: dict[str, dict[str, Any]] = {"t": {"command": ["python3", "tiny.py"]}}
    script = "- tool: t__echo\n  input: {text: from serve}\n"
    http = None
    if EVERYTHING.exists() and shutil.which("node"):
        port = free_port()
        http = subprocess.Popen(
            [str(EVERYTHING), "streamableHttp"],
            env={**os.environ, "PORT": str(port)},
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        servers["web"] = {"url": f"http://127.0.0.1:{port}/mcp"}
        script += "- tool: web__echo\n  input: {message: over http}\n"
    script += "- tool: submit\n  input: {summary: done}\n"
    (tmp_path / "script.yaml").write_text(script)
    env = Env(tmp_path / "home")
    server = start_server(env, tasks)
    try:
        key = env.tenant("acme")["api_key"]
        with server.client(key) as client:
            if http is not None:  # listening before the run starts
                deadline = time.monotonic() + 60
                while socket.socket().connect_ex(("127.0.0.1", port)) != 0:
                    assert time.monotonic() < deadline
                    time.sleep(0.2)
            r = client.post(
                "/v1/runs",
                json={
                    "task": "task",
                    "model": SIM,
                    "sim_policy": f"script:{tmp_path / 'script.yaml'}",
                    "mcp_servers": servers,
                },
            )
            assert r.status_code == 201, r.text
            run = wait_for(
                client, r.json()["id"], lambda x: x["status"] not in ("queued", "running")
            )
        assert run["status"] == "succeeded", (run, server.process.output())
        home_runs = list((tmp_path / "home" / "runs").glob("*/trajectory.jsonl"))
        trajectory = home_runs[0].read_text()
        assert '"content": "from serve"' in trajectory
        if http is not None:
            assert "over http" in trajectory
    finally:
        server.process.kill()
        if http is not None:
            os.killpg(http.pid, 9)
            http.wait()


# --- lazy tools ------------------------------------------------------------------------------


def _lazy_run(tmp_path: Path, name: str, toml: str, mode: str) -> dict[str, Any]:
    root = tmp_path / name
    root.mkdir()
    r = run_script(
        root,
        make_task(root, toml),
        "- tool: t__echo\n  input: {text: hello lazy}\n- tool: submit\n  input: {summary: done}\n",
        mode,
    )
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    trajectory = (root / "home" / "runs" / doc["run_id"] / "trajectory.jsonl").read_text()
    assert '"content": "hello lazy"' in trajectory  # the call went through, either way
    return doc


def test_lazy_tools_search_then_call_with_a_smaller_prefix(tmp_path: Path) -> None:
    bwrap(tmp_path)  # skips where bwrap cannot run
    many = '[mcp.servers.t]\ncommand = ["python3", "tiny.py", "--many=100"]\n'
    eager = _lazy_run(tmp_path, "eager", many, "eager")
    lazy = _lazy_run(tmp_path, "lazy", many, "lazy")
    auto = _lazy_run(tmp_path, "auto", many, "auto")
    few = _lazy_run(tmp_path, "few", TINY_TOML, "auto")
    assert eager["mcp_tools"] == "eager" and lazy["mcp_tools"] == "lazy"
    calls = [c["name"] for e in lazy["ledger"] for c in e["tool_calls"]]
    assert calls == ["tool_search", "tool_search", "submit"]  # search, then call
    first = {d: doc["ledger"][0]["usage"]["input_tokens"] for d, doc in (("e", eager), ("l", lazy))}
    assert first["l"] < 0.3 * first["e"], first
    # auto: lazy where 107 schemas sit in every prompt, eager for a 7-tool server
    assert auto["mcp_tools"] == "lazy" and few["mcp_tools"] == "eager"
    assert float(auto["cost_usd"]) < float(eager["cost_usd"])


def test_the_catalogue_cuts_descriptions_at_a_words_end() -> None:
    from stayer.mcp.lazy import one_line

    said = "Operation 7: look up, filter and summarise records. More text."
    assert one_line(said) == "Operation 7: look up…"  # not "… look up, f…"
    assert one_line("Echo the text back.") == "Echo the text back."
    assert one_line("Short. Then more") == "Short"  # the first sentence
    assert one_line("x" * 40) == "x" * 23 + "…"  # one long word: cut inside it
    assert all(len(one_line(said, n)) <= n for n in range(2, 60))


def test_auto_picks_by_the_cost_equation() -> None:
    from decimal import Decimal

    from stayer.mcp.lazy import choose

    assert choose("auto", {"eager": Decimal(1), "lazy": Decimal(2)}) == "eager"
    assert choose("auto", {"eager": Decimal(2), "lazy": Decimal(1)}) == "lazy"
    assert choose("auto", None) == "eager"  # unpriced: nothing to weigh
    assert choose("lazy", {"eager": Decimal(1), "lazy": Decimal(2)}) == "lazy"


def test_a_bad_mcp_tools_value_exits_2(tmp_path: Path) -> None:
    r = stayer("run", str(make_task(tmp_path, TINY_TOML)), "--model", SIM, "--mcp-tools",
               "sometimes", home=tmp_path / "home")  # fmt: skip
    assert (
        r.returncode == 2 and "--mcp-tools sometimes: choose one of eager, lazy, auto" in r.stderr
    )


@pytest.mark.parametrize(
    ("config", "said"),
    [
        ("not [toml", "malformed TOML"),
        ('[mcp.servers.t]\ncommand = ["x"]\nbogus = 1\n', "unknown key 'mcp.servers.t.bogus'"),
        ("[mcp]\nservers = 3\n", "mcp.servers:"),
        ('[mcp.servers.t]\nurl = "http://h/"\nheaders = {A = "x\\r\\ny"}\n', "headers"),
    ],
)
def test_tools_list_bad_config_is_one_line_exit_2(tmp_path: Path, config: str, said: str) -> None:
    path = tmp_path / "stayer.toml"
    path.write_text(config)
    r = stayer("tools", "list", "--config", str(path), home=tmp_path / "home")
    assert r.returncode == 2, r.stderr
    assert said in r.stderr and "stayer.toml" in r.stderr and len(r.stderr.splitlines()) == 1
    assert r.stdout == ""


# --- every agent of a run: a team's threads ------------------------------------------------------

TEAM_TOML = """entry = "lead"
[agents.lead]
model = "sim:claude-sonnet-4-5"
talks_to = ["w"]
[agents.w]
model = "sim:claude-sonnet-4-5"
talks_to = ["lead"]
"""


def _succeeded(r: subprocess.CompletedProcess, mode: str) -> dict[str, Any]:
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["status"] == "succeeded" and doc["mcp_tools"] == mode, doc
    return doc


@pytest.mark.parametrize("mode", ["eager", "lazy"])
def test_a_teams_threads_call_the_runs_servers(tmp_path: Path, mode: str) -> None:
    """Both threads play the script: each calls the server's tool (the worker's sends to
    itself are refused, a tool error), so the worker, started by the lead's message, must
    see the run's MCP tools as the lead does, offered the same way."""
    bwrap(tmp_path)  # skips where bwrap cannot run
    (tmp_path / "team.toml").write_text(TEAM_TOML)
    doc = _succeeded(
        run_script(
            tmp_path,
            make_task(tmp_path, TINY_TOML),
            "- tool: t__echo\n  input: {text: hello team}\n"
            "- tool: send_message\n  input: {to: w, content: go}\n"
            "- tool: wait_for_message\n  input: {from: w, timeout: 120}\n"
            "- tool: submit\n  input: {summary: done}\n",
            mode,
            *("--team", str(tmp_path / "team.toml")),
        ),
        mode,
    )
    for agent in ("lead", "w"):
        calls = [c for e in doc["ledger"] if e["agent"] == agent for c in e["tool_calls"]]
        mcp = [c for c in calls if c["name"] in ("t__echo", "tool_search")]
        assert len(mcp) == (1 if mode == "eager" else 2), (agent, calls)  # lazy: search, call
        assert not any(c["is_error"] for c in mcp), (agent, calls)
    trajectory = (tmp_path / "home" / "runs" / doc["run_id"] / "trajectory.jsonl").read_text()
    assert trajectory.count('"content": "hello team"') == 2  # one call per thread


@pytest.mark.parametrize("mode", ["eager", "lazy"])
def test_a_sub_agent_calls_the_runs_servers(tmp_path: Path, mode: str) -> None:
    """The `subagent` tool's child plays the same script: its first step(s) call the
    server's tool, then its step limit ends it (no wrap-up), and the parent submits."""
    bwrap(tmp_path)  # skips where bwrap cannot run
    steps = 1 if mode == "eager" else 2  # lazy: a search, then the call
    (tmp_path / "stayer.toml").write_text(
        '[models]\nsubagent = "sim:claude-sonnet-4-5"\n\n'
        f"[subagents]\nmax_steps = {steps}\n\n[guard]\nwrapup_steps = 0\n"
    )
    doc = _succeeded(
        run_script(
            tmp_path,
            make_task(tmp_path, TINY_TOML),
            "- tool: t__echo\n  input: {text: hello child}\n"
            "- tool: subagent\n  input: {task: Echo hello.}\n"
            "- tool: submit\n  input: {summary: done}\n",
            mode,
            *("--config", str(tmp_path / "stayer.toml")),
        ),
        mode,
    )
    child = [c for e in doc["ledger"] if e["agent"] == "main/sub-1" for c in e["tool_calls"]]
    assert [c["name"] for c in child] == (["t__echo"] if mode == "eager" else ["tool_search"] * 2)
    assert not any(c["is_error"] for c in child), child

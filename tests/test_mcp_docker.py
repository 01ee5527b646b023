"""A stdio MCP server of a ``--sandbox docker`` run: started in the task's image (one long
command of the docker sandbox, its FIFOs bind-mounted at /run/stayer-mcp), its tool called
by the agent, the host's network out of its reach. Slow: a Docker daemon of the tests' own
and an image built from the Debian base (tests/docker_helpers.py); skipped, saying why,
where Docker cannot run."""

from __future__ import annotations

import json
import socket
import subprocess
import uuid
from pathlib import Path

import pytest
from docker_helpers import (  # noqa: F401 - fixtures
    _docker_base_image,
    _dockerd,
    base_root,
    docker_base,
    docker_host,
)

from tests.test_mcp import make_task, run_script

pytestmark = pytest.mark.slow


def test_stayer_run_calls_a_stdio_server_in_the_docker_sandbox(
    tmp_path: Path,
    docker_base: str,  # noqa: F811 - the fixture
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    temp = tmp_path / "temp"  # the run's own: where its server's FIFO directory is made
    temp.mkdir()
    monkeypatch.setenv("TMPDIR", str(temp))
    mark = f"only in the image {uuid.uuid4().hex}"
    task = make_task(tmp_path, '[mcp.servers.t]\ncommand = ["python3", "tiny.py", "--read"]\n')
    env = task / "environment"
    (env / "mark.txt").write_text(mark + "\n")
    (env / "Dockerfile").write_text(
        f"FROM {docker_base}\nWORKDIR /app\nCOPY tiny.py ./\nCOPY mark.txt /etc/stayer-mark\n"
    )
    script = "".join(
        f"- tool: t__read\n  input: {{path: {path}}}\n"
        for path in ("/etc/stayer-mark", "/etc/hostname")
    )
    listener = socket.socket()  # a port of the host's, which the server must not reach
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    port = listener.getsockname()[1]
    script += f"- tool: t__reach\n  input: {{host: 127.0.0.1, port: {port}}}\n"
    script += "- tool: submit\n  input: {summary: done}\n"
    with listener:
        r = run_script(tmp_path, task, script, "auto", "--sandbox", "docker")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["status"] == "succeeded", r.stderr
    calls = [c for step in doc["ledger"] for c in step["tool_calls"]]
    assert [c["name"] for c in calls][:3] == ["t__read", "t__read", "t__reach"]
    assert not any(c["is_error"] for c in calls), calls
    run_dir = tmp_path / "home" / "runs" / doc["run_id"]
    text = (run_dir / "trajectory.jsonl").read_text()
    # The server read the image's own file and the container's hostname: it ran in the
    # container, not on the host (which has no such file).
    assert mark in text, text[-3000:]
    assert not Path("/etc/stayer-mark").exists()
    # The server's container and its FIFO directory are gone with the run.
    left = subprocess.run(["docker", "ps", "--all", "--quiet"], capture_output=True, text=True)
    assert left.returncode == 0 and left.stdout == "", left
    assert not list(temp.glob("stayer-mcp-*"))
    assert "mcp t: stdio, in the run's sandbox" in r.stderr and "docker" in r.stderr
    assert '"content": "sandbox\\n"' in text, text[-3000:]
    assert "unreadable" not in text, text[-3000:]
    assert '"content": "refused: ' in text and "connected" not in text, text[-3000:]

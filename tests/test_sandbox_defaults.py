"""What every sandbox gives a command when nothing asks for more (issue 34): its memory
capped at a share of the host's, an in-memory /tmp never sized past a share of the host's
memory whatever the task asks, no host path on bwrap's command line; and a task with a
Dockerfile runs in its image under a plain ``stayer run``."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest
from docker_helpers import base_root, needs_slirp  # noqa: F401 - fixtures
from sandbox_helpers import needs_bwrap

import stayer.sandbox.bwrap as bwrap_module
import stayer.sandbox.process as process_module
from stayer.errors import ConfigError
from stayer.eval.task import load_task
from stayer.sandbox.bwrap import BwrapSandbox, check_bwrap
from stayer.sandbox.process import memory_cgroup_parent

ROOT = Path(__file__).resolve().parent.parent
FIXTURE = Path(__file__).parent / "fixtures" / "image-task"
DATAMASH = Path(__file__).parent / "fixtures" / "column-stats"
KINDS = ["bwrap", "bwrap-ahead", "bwrap-persistent"]
HOST_MB = 1024  # the host the tests pretend to run on: a default cap of 512 MiB, /tmp 256
# Writes into every page of 700 MiB: more than the default share of that host.
HOG = (
    "python3 -c 'b = bytearray(700 * 2**20)\n"
    "for i in range(0, len(b), 4096): b[i] = 1\n"
    'print("held")\''
)
SMALL = 'python3 -c \'b = bytearray(64 * 2**20); b[::4096] = b"x" * len(b[::4096]); print("ok")\''


@pytest.fixture
def small_host(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(process_module, "host_memory_mb", lambda: HOST_MB)
    monkeypatch.setattr(bwrap_module, "host_memory_mb", lambda: HOST_MB)


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    d = tmp_path / "ws"
    d.mkdir()
    return d


def box(ws: Path, kind: str, **limits: Any) -> BwrapSandbox:
    return BwrapSandbox(ws, persistent=kind == "bwrap-persistent", ahead=kind != "bwrap", **limits)


def second(sb: BwrapSandbox, *commands: str) -> list[str]:
    """stdout and stderr of each command, then ``exit N`` where it failed, run after a
    first one: a sandbox started ahead, or kept, is then the one that runs them."""

    async def go() -> list[str]:
        assert (await sb.exec("true", timeout=60)).exit_code == 0
        out = []
        for c in commands:
            r = await sb.exec(c, timeout=120)
            assert not r.timed_out, r
            out.append(r.stdout + r.stderr + (f"exit {r.exit_code}" if r.exit_code else ""))
        return out

    return asyncio.run(go())


# ----------------------------------------------------------------------------- memory
@needs_bwrap
@pytest.mark.parametrize("enforced_by", ["cgroup", "RLIMIT_AS"])
@pytest.mark.parametrize("kind", KINDS)
def test_the_sandboxs_defaults_cap_memory(
    small_host: None, ws: Path, kind: str, enforced_by: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    if enforced_by == "cgroup" and memory_cgroup_parent() is None:
        pytest.skip("no memory cgroup can be made here")
    if enforced_by == "RLIMIT_AS":
        monkeypatch.setattr(process_module, "memory_cgroup_parent", lambda: None)
    sb = box(ws, kind)
    hog, small, limit = second(sb, HOG, SMALL, "ulimit -v")
    assert not hog.startswith("held") and ("exit 137" in hog or "MemoryError" in hog), hog
    assert sb.limits.memory_cap_mb == HOST_MB // 2
    assert small.startswith("ok\n"), small  # what fits runs
    # The cgroup caps the whole tree and leaves the address space alone; without one,
    # each process's address space is capped.
    expected = "unlimited" if enforced_by == "cgroup" else str(HOST_MB // 2 * 1024)
    assert limit == expected + "\n", limit


@needs_bwrap
def test_an_explicit_memory_limit_replaces_the_default(small_host: None, ws: Path) -> None:
    sb = box(ws, "bwrap", memory_mb=2048)
    assert (sb.limits.memory_mb, sb.limits.memory_cap_mb) == (2048, 2048)
    [held] = second(sb, HOG)
    assert held.startswith("held\n"), held


def test_the_docker_sandbox_caps_memory_and_tmp_by_default(
    small_host: None, ws: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import stayer.sandbox.docker as docker_module

    monkeypatch.setattr(docker_module, "check_docker", lambda: "docker")
    sb = docker_module.DockerSandbox(ws, image="img", storage_mb=16777216)
    argv = sb._argv("name", "true", (), "/app", False)
    at = argv.index("--memory")
    assert argv[at + 1 : at + 4] == [f"{HOST_MB // 2}m", "--memory-swap", f"{HOST_MB // 2}m"]
    assert f"/tmp:rw,exec,nosuid,nodev,size={HOST_MB // 4}m,mode=1777" in argv
    assert argv[-2:] == ["-c", "true"]  # no address-space ulimit unless asked for


# ----------------------------------------------------------------------- /tmp (S4, sandbox)
@needs_bwrap
@pytest.mark.parametrize("kind", KINDS)
def test_a_tasks_storage_never_sizes_tmp_past_the_hosts_memory(
    small_host: None, ws: Path, kind: str
) -> None:
    """``storage_mb = 16777216`` in task.toml gave a 16 TiB tmpfs: /tmp is memory."""
    sb = box(ws, kind, storage_mb=16777216)
    [df] = second(sb, "df -m --output=size /tmp | tail -n1")
    assert int(df) <= HOST_MB // 4, df
    [df] = second(box(ws, kind, storage_mb=64), "df -m --output=size /tmp | tail -n1")
    assert int(df) == 64, df  # a smaller one is as asked


# --------------------------------------------------------------------- bwrap's argv (S11)
@needs_bwrap
@pytest.mark.parametrize("kind", KINDS)
def test_pid_1s_command_line_names_no_host_path(ws: Path, kind: str) -> None:
    [cmdline] = second(box(ws, kind), "tr '\\0' '\\n' < /proc/1/cmdline")
    assert cmdline.startswith("bwrap\n--args\n"), cmdline
    for host in {os.path.dirname(check_bwrap()), sys.prefix, str(ws)}:
        assert host not in cmdline, (host, cmdline)


# ------------------------------------------------------------- a task's Dockerfile is built
def _task_with(tmp_path: Path, dockerfile: str | None, toml: str = "") -> Path:
    task = tmp_path / "task"
    (task / "tests").mkdir(parents=True)
    (task / "environment").mkdir()
    (task / "instruction.md").write_text("Do it.\n")
    (task / "tests" / "test.sh").write_text("echo 1 > /logs/verifier/reward.txt\n")
    (task / "solution").mkdir()
    (task / "solution" / "solve.sh").write_text("true\n")
    (task / "task.toml").write_text(toml)
    if dockerfile is not None:
        (task / "environment" / "Dockerfile").write_text(dockerfile)
    return task


def test_a_task_with_a_dockerfile_runs_in_its_image_unless_told(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import stayer.sandbox.docker as docker_module

    def no_daemon() -> str:
        raise ConfigError("--sandbox docker: no Docker daemon answers")

    monkeypatch.setattr(docker_module, "check_docker", no_daemon)
    task = load_task(_task_with(tmp_path / "a", "FROM debian:bookworm\n"))
    assert (task.kind(None), task.kind_source(None)) == ("bwrap-image", "the task's Dockerfile")
    assert task.kind("bwrap") == "bwrap"  # the run's word first
    monkeypatch.setattr(docker_module, "check_docker", lambda: "docker")
    assert task.kind(None) == "docker"  # where a daemon answers
    told = load_task(
        _task_with(tmp_path / "b", "FROM debian:bookworm\n", '[environment]\nsandbox = "bwrap"\n')
    )
    assert (told.kind(None), told.kind_source(None)) == ("bwrap", "task.toml")
    plain = load_task(_task_with(tmp_path / "c", None))
    assert (plain.kind(None), plain.kind_source(None)) == ("bwrap", "default")


def _stayer_run(task: Path, home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.endswith("_API_KEY") and k != "STAYER_DB"}
    env.update(STAYER_HOME=str(home), DOCKER_HOST=f"unix://{home}/no-docker.sock")
    return subprocess.run(
        [sys.executable, "-m", "stayer.cli", "run", str(task), "--model", "sim:gpt-5", *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=1200,
    )


@needs_bwrap
def test_a_dockerfile_that_cannot_be_built_here_stops_the_run_in_one_line(
    tmp_path: Path,
) -> None:
    """Never silently on the host's system: no Docker, and no Docker-free base for it."""
    task = _task_with(tmp_path, "FROM node:20\nRUN npm i -g left-pad\n")
    r = _stayer_run(task, tmp_path / "home")
    assert r.returncode == 2, r.stderr
    [line] = r.stderr.strip().splitlines()
    assert "Dockerfile" in line and "--sandbox bwrap" in line and "no Docker daemon" in line
    assert not (tmp_path / "home" / "runs").exists()  # nothing written


@pytest.mark.slow
@needs_bwrap
@pytest.mark.parametrize("task", [FIXTURE, DATAMASH], ids=["dc", "datamash"])
def test_a_dockerfile_task_passes_plain_stayer_run_without_docker(
    tmp_path: Path,
    base_root: Path,  # noqa: F811
    task: Path,
) -> None:
    """The fixtures' tests need dc or datamash, which only their images install: plain
    ``stayer run`` (no --sandbox, no task.toml sandbox, no Docker daemon) builds the image
    without Docker and passes; on the host's system it fails (``command not found``)."""
    needs_slirp()
    r = _stayer_run(task, tmp_path / "home")
    assert r.returncode == 0, r.stderr[-3000:]
    assert "sandbox bwrap-image (the task's Dockerfile)" in r.stderr
    assert "limits: memory" in r.stderr
    on_host = _stayer_run(task, tmp_path / "home2", "--sandbox", "bwrap")
    assert on_host.returncode == 1 and "sandbox bwrap (--sandbox)" in on_host.stderr


@pytest.mark.slow
@needs_bwrap
def test_the_image_sandbox_caps_memory_and_names_no_host_path(
    small_host: None,
    ws: Path,
    base_root: Path,  # noqa: F811
) -> None:
    sb = BwrapSandbox(ws, root=base_root)
    hog, small, df, cmdline = second(
        sb,
        HOG,
        SMALL,
        "df -m --output=size /tmp | tail -n1",
        "tr '\\0' '\\n' < /proc/1/cmdline",
    )
    assert not hog.startswith("held") and small.startswith("ok\n"), (hog, small)
    assert int(df) <= HOST_MB // 4
    assert cmdline.startswith("bwrap\n") and sys.prefix not in cmdline, cmdline


# ------------------------------------------------------------ no host path inside (item 3)
PROBE = (
    "for f in /proc/self/mountinfo /proc/1/mountinfo /proc/1/cmdline /proc/self/environ "
    "/proc/1/environ; do tr '\\0' '\\n' < $f; done; env; pwd"
)


def _probe_task(tmp_path: Path, image: bool) -> Path:
    """A task whose oracle and tests write what they can see of the host to /app."""
    task = _task_with(tmp_path / f"project-{uuid.uuid4().hex}", None)
    (task / "solution" / "solve.sh").write_text(f"({PROBE}) > /app/agent-probe.txt 2>&1\n")
    (task / "tests" / "test.sh").write_text(
        f"({PROBE}) > /app/verifier-probe.txt 2>&1\necho 1 > /logs/verifier/reward.txt\n"
    )
    if image:
        (task / "environment" / "Dockerfile").write_text(
            "FROM python:3.11-slim-bookworm\nWORKDIR /app\n"
        )
    return task


def _no_host_path_inside(tmp_path: Path, kind: str) -> None:
    task = _probe_task(tmp_path, image=kind == "bwrap-image")
    launch = tmp_path / f"launch-{uuid.uuid4().hex}"
    home = tmp_path / f"state-{uuid.uuid4().hex}"
    launch.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.endswith("_API_KEY") and k != "STAYER_DB"}
    env.update(STAYER_HOME=str(home), PWD=str(launch), DOCKER_HOST="unix:///nowhere.sock")
    r = subprocess.run(
        [sys.executable, "-m", "stayer.cli", "run", str(task), "--model", "sim:gpt-5"]
        + ["--sandbox", kind, "--json"],
        capture_output=True,
        text=True,
        env=env,
        cwd=launch,
        timeout=1200,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    run_dir = Path(json.loads(r.stdout)["run_dir"])
    for seen in ("agent-probe.txt", "verifier-probe.txt"):
        out = (run_dir / "workspace" / seen).read_text()
        assert " /app " in out and "PWD=/" in out, out  # the probe read what it should
        for host in (home.name, launch.name, task.parent.name, sys.prefix, str(ROOT)):
            assert host not in out, (seen, host, out)


@needs_bwrap
@pytest.mark.parametrize("kind", ["bwrap", "bwrap-persistent"])
def test_no_host_path_is_visible_inside(tmp_path: Path, kind: str) -> None:
    """The workspace was mounted from $STAYER_HOME/runs/<id>/workspace and the tests from
    the task's directory: /proc/self/mountinfo showed both."""
    _no_host_path_inside(tmp_path, kind)


@pytest.mark.slow
@needs_bwrap
def test_no_host_path_is_visible_inside_an_image(
    tmp_path: Path,
    base_root: Path,  # noqa: F811
) -> None:
    needs_slirp()
    _no_host_path_inside(tmp_path, "bwrap-image")


def test_workspaces_live_under_a_private_neutral_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from stayer.paths import workspaces_root

    monkeypatch.delenv("STAYER_WORKSPACES")
    root = workspaces_root()
    assert root.name == f"stayer-{os.getuid()}" and str(root.parent) in ("/var/tmp", "/tmp")
    assert os.stat(root).st_mode & 0o777 == 0o700
    link = tmp_path / "elsewhere"
    link.symlink_to(tmp_path)
    monkeypatch.setenv("STAYER_WORKSPACES", str(link))
    with pytest.raises(ConfigError, match="STAYER_WORKSPACES"):
        workspaces_root()


def test_deleting_a_run_deletes_its_workspace_and_follows_no_other_link(tmp_path: Path) -> None:
    """For ``stayer runs prune``: the workspace lives outside the run directory now."""
    from stayer.run import delete_run_dir, run_workspace

    run_dir = tmp_path / "runs" / "r1"
    workspace = run_workspace(run_dir)
    (workspace / "sub").mkdir()
    (workspace / "sub" / "f").write_text("x")
    (workspace / "sub").chmod(0o500)  # left read-only by the agent
    assert (run_dir / "workspace").resolve() == workspace and run_workspace(run_dir) == workspace
    delete_run_dir(run_dir)
    assert not run_dir.exists() and not workspace.exists()
    keep = tmp_path / "keep"
    keep.mkdir()
    (keep / "f").write_text("x")
    other = tmp_path / "runs" / "r2"
    other.mkdir(parents=True)
    (other / "workspace").symlink_to(keep)  # not one of ours: removed, never followed
    delete_run_dir(other)
    assert not other.exists() and (keep / "f").read_text() == "x"


def test_deleting_a_workspace_follows_no_link_and_opens_no_special_file(tmp_path: Path) -> None:
    """What the agent left in its workspace (a link to a host file, a FIFO, a link loop) is
    removed as names: nothing is followed, opened or blocked on."""
    from stayer.run import delete_run_dir, run_workspace

    host_file = tmp_path / "host-secret"
    host_file.write_text("keep me")
    host_dir = tmp_path / "host-dir"
    host_dir.mkdir()
    (host_dir / "f").write_text("keep me too")
    run_dir = tmp_path / "runs" / "r3"
    workspace = run_workspace(run_dir)
    (workspace / "to-file").symlink_to(host_file)
    (workspace / "to-dir").symlink_to(host_dir)
    (workspace / "loop").symlink_to(workspace / "loop")
    os.mkfifo(workspace / "fifo")
    delete_run_dir(run_dir)
    assert not run_dir.exists() and not workspace.exists()
    assert host_file.read_text() == "keep me" and (host_dir / "f").read_text() == "keep me too"

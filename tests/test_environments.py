"""Tasks whose environment/Dockerfile is built and run: with Docker (``--sandbox docker``)
and without it (``--sandbox bwrap-image``, bubblewrap over a Debian root made with
mmdebstrap). Slow: the first run makes the base (minutes) and every build installs a
package from the Debian archive."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from docker_helpers import (  # noqa: F401 - fixtures
    _docker_base_image,
    _dockerd,
    base_root,
    docker_base,
    docker_host,
    needs_slirp,
    private_cache,
)
from sandbox_helpers import needs_bwrap

from stayer.environments.build import BuildError, build_root
from stayer.environments.prepare import prepare_environment
from stayer.eval.checks import check_task
from stayer.eval.task import load_task

pytestmark = [pytest.mark.slow, needs_bwrap]

FIXTURE = Path(__file__).parent / "fixtures" / "image-task"


@pytest.fixture(params=["docker", "bwrap-image"])
def kind(request: pytest.FixtureRequest) -> str:
    """Each sandbox kind that builds the task's image, with what it needs set up."""
    if request.param == "docker":
        request.getfixturevalue("docker_base")
    else:
        needs_slirp()
        request.getfixturevalue("base_root")
    return request.param


def _copy_task(tmp_path: Path) -> Path:
    task = tmp_path / "image-task"
    shutil.copytree(FIXTURE, task)
    return task


def test_a_task_needing_a_package_from_its_dockerfile_passes_its_oracle_and_fails_its_nop(
    kind: str, tmp_path: Path
) -> None:
    check = asyncio.run(check_task(load_task(_copy_task(tmp_path)), reruns=1, sandbox=kind))
    assert check.problems == [], check.problems
    assert check.rewards and set(check.rewards) == {
        1.0
    }  # the oracle, verified with dc from the image


@pytest.mark.skipif(shutil.which("dc") is not None, reason="dc is installed on this host")
def test_the_same_task_fails_on_the_hosts_system(tmp_path: Path) -> None:
    """Control: the image is what makes the oracle pass, not the host."""
    check = asyncio.run(check_task(load_task(_copy_task(tmp_path)), reruns=1, sandbox="bwrap"))
    assert any(p.kind in ("oracle_fails", "environment") for p in check.problems), check.problems


def test_a_dockerfile_that_cannot_be_built_is_an_environment_problem(
    kind: str, tmp_path: Path
) -> None:
    task = _copy_task(tmp_path)
    dockerfile = task / "environment" / "Dockerfile"
    dockerfile.write_text(dockerfile.read_text() + "RUN echo about to fail && exit 7\n")
    with pytest.raises(BuildError, match="exit 7") as e:
        prepare_environment(kind, task / "environment")
    assert str(dockerfile) in str(e.value) and "\n" not in str(e.value)
    check = asyncio.run(check_task(load_task(task), reruns=1, sandbox=kind))
    assert [p.kind for p in check.problems] == ["environment"]
    assert "cannot be built" in check.problems[0].detail


def test_layers_are_cached_by_content(base_root: Path, tmp_path: Path) -> None:  # noqa: F811
    task = _copy_task(tmp_path)
    context = task / "environment"
    cache = private_cache(base_root, tmp_path)
    first: list[str] = []
    built = build_root(context, cache=cache, log=first.append)
    again: list[str] = []
    assert build_root(context, cache=cache, log=again.append) == built
    assert again == []  # nothing ran: every layer was found
    # A changed file rebuilds the step that copies it, and only that one. (Content no
    # earlier run can have cached: the cache outlives the test.)
    numbers = f"6\n7\n{uuid.uuid4().int}\n"
    (context / "numbers.txt").write_text(numbers)
    changed: list[str] = []
    rebuilt = build_root(context, cache=cache, log=changed.append)
    assert [line.split(": ", 1)[1] for line in changed] == ["COPY numbers.txt /app/"]
    assert (rebuilt.root / "app" / "numbers.txt").read_text() == numbers
    assert (built.root / "app" / "numbers.txt").read_text() != numbers  # its parent untouched
    assert (rebuilt.root / "usr" / "bin" / "dc").is_file()
    assert rebuilt.env["DEBIAN_FRONTEND"] == "noninteractive"


def _eval(suite: Path, home: Path, *args: str) -> tuple[dict, str]:
    env = {k: v for k, v in os.environ.items() if not k.endswith("_API_KEY") and k != "STAYER_DB"}
    proc = subprocess.run(
        [sys.executable, "-m", "stayer.cli", "eval", str(suite), "--model", "sim:gpt-5", "--json"]
        + list(args),
        capture_output=True,
        text=True,
        env={**env, "STAYER_HOME": str(home)},
        timeout=1200,
    )
    # (the JSON says why a trial was infrastructure's failure; the table only counts them)
    assert proc.returncode == 0, proc.stderr + proc.stdout[-4000:]
    return json.loads(proc.stdout), proc.stderr


def test_an_eval_runs_each_task_in_its_own_image_built_once(
    kind: str,
    base_root: Path,  # noqa: F811
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``stayer eval`` follows a task's ``[environment] sandbox`` (what ``tasks import-tb
    --sandbox`` writes) as ``stayer run`` does: the image is built, once for all the
    trials and epochs, saying so on stderr; the oracle passes with dc from the image, and
    an agent that does nothing fails."""
    monkeypatch.setenv("STAYER_CACHE", str(private_cache(base_root, tmp_path)))
    task = _copy_task(tmp_path / "suite")
    with (task / "task.toml").open("a") as f:
        f.write(f'\n[environment]\nsandbox = "{kind}"\n')
    dockerfile = task / "environment" / "Dockerfile"
    # (an image of this test's own: no earlier build stands in for this one)
    dockerfile.write_text(dockerfile.read_text() + f"RUN echo {uuid.uuid4().hex}\n")
    doc, err = _eval(tmp_path / "suite", tmp_path / "home", "--epochs", "2")
    [config] = doc["configs"]
    assert (config["successes"], config["trials"]) == (2, 2), err
    building = [line for line in err.splitlines() if line.startswith(str(dockerfile))]
    # Built once for all the trials and epochs: each line said once, or once more for each
    # time Docker failed a step and the build was run again (stayer.environments.docker).
    tries = 1 + sum(line.endswith("; building again") for line in building)
    assert building and max(Counter(building).values()) <= tries, err
    assert sum(": building image " in line for line in building) <= 1, err
    assert any("RUN apt-get update" in line for line in building), err  # said as it starts
    doc, err = _eval(tmp_path / "suite", tmp_path / "home", "--sim-policy", "synthetic:steps=1")
    [config] = doc["configs"]
    assert (config["successes"], config["trials"]) == (0, 1), err
    assert not [line for line in err.splitlines() if line.startswith(str(dockerfile))]


def test_the_image_app_directory_seeds_the_workspace(kind: str, tmp_path: Path) -> None:
    task = load_task(_copy_task(tmp_path))
    workspace = tmp_path / "ws"
    (task.path / "environment" / "numbers.txt").rename(task.path / "environment" / "renamed.txt")
    dockerfile = task.path / "environment" / "Dockerfile"
    dockerfile.write_text(
        dockerfile.read_text().replace("COPY numbers.txt ./", "COPY renamed.txt numbers.txt")
    )
    (task.path / "environment" / "hint.txt").write_text("not for the agent\n")
    (task.path / "environment" / ".dockerignore").write_text("hint.txt\n")
    task.materialise(workspace, kind)
    # The image's /app, as a container of it has: numbers.txt as the Dockerfile copied it;
    # neither the build context's own files (renamed.txt) nor what it leaves out (hint.txt).
    assert sorted(p.name for p in workspace.iterdir()) == ["numbers.txt"]
    r = asyncio.run(
        task.make_sandbox(kind, workspace).exec("id -u; dc -e '2 3 * p'; cat numbers.txt")
    )
    assert r.exit_code == 0, r
    assert r.stdout.split("\n")[:2] == ["1000", "6"]


def test_docker_commands_hold_no_privilege(docker_base: str, tmp_path: Path) -> None:  # noqa: F811
    """What bwrap's identity gives, by Docker's means: no capabilities (not even in the
    bounding set), no new privileges, not root, the image read-only."""
    from stayer.sandbox.docker import DockerSandbox

    ws = tmp_path / "ws"
    ws.mkdir()
    probe = (
        "grep -E '^(CapEff|CapPrm|CapBnd|NoNewPrivs)' /proc/self/status; id -u; touch /usr/x /app/x"
    )
    r = asyncio.run(DockerSandbox(ws, image=docker_base).exec(probe))
    status = dict(line.split(":\t") for line in r.stdout.splitlines() if ":\t" in line)
    assert status == {
        "CapEff": "0000000000000000",
        "CapPrm": "0000000000000000",
        "CapBnd": "0000000000000000",
        "NoNewPrivs": "1",
    }
    assert r.stdout.splitlines()[-1] == "1000"
    assert "'/usr/x': Read-only file system" in r.stderr and (ws / "x").is_file()


def test_build_steps_cannot_write_the_hosts_sysctls(base_root: Path, tmp_path: Path) -> None:  # noqa: F811
    """A RUN step is real root (when stayer is): the kernel would let it write sysctls
    without any capability. It writes back the value already there, so that, were it
    let through, nothing would change."""
    context = tmp_path / "ctx"
    context.mkdir()
    (context / "Dockerfile").write_text(
        "FROM python:3.11-slim-bookworm\n"
        # (a marker of this run's own: a cached layer would not run the step at all)
        f"RUN echo {uuid.uuid4().hex} && cat /proc/sys/vm/swappiness > /tmp/v && cat /tmp/v > /proc/sys/vm/swappiness\n"
    )
    with pytest.raises(BuildError, match="Read-only file system"):
        build_root(context, cache=private_cache(base_root, tmp_path))


def _ignoring_context(tmp_path: Path) -> Path:
    context = tmp_path / "ctx"
    (context / "logs").mkdir(parents=True)
    (context / "Dockerfile").write_text("FROM python:3.11-slim-bookworm\nCOPY . /app/\n")
    (context / ".dockerignore").write_text("secret*\n!secret-ok.txt\nlogs\n!logs/keep.log\n")
    (context / "keep.txt").write_text("kept\n")
    (context / "secret.txt").write_text(f"s3cret {uuid.uuid4()}\n")
    (context / "secret-ok.txt").write_text("not secret\n")
    (context / "logs" / "keep.log").write_text("log\n")
    (context / "logs" / "noise.log").write_text("noise\n")
    return context


def test_what_dockerignore_leaves_out_is_not_in_the_image_nor_in_its_key(
    base_root: Path,  # noqa: F811
    tmp_path: Path,
) -> None:
    context = _ignoring_context(tmp_path)
    cache = private_cache(base_root, tmp_path)
    built = build_root(context, cache=cache)
    app = built.root / "app"
    assert sorted(p.name for p in app.iterdir()) == [
        ".dockerignore",
        "Dockerfile",
        "keep.txt",
        "logs",
        "secret-ok.txt",
    ]
    assert [p.name for p in (app / "logs").iterdir()] == ["keep.log"]
    # Editing a file it leaves out builds nothing again.
    (context / "secret.txt").write_text("another secret\n")
    (context / "logs" / "noise.log").write_text("more noise\n")
    again: list[str] = []
    assert build_root(context, cache=cache, log=again.append) == built
    assert again == []
    # A file it sends does.
    (context / "keep.txt").write_text(f"changed {uuid.uuid4()}\n")
    changed: list[str] = []
    assert build_root(context, cache=cache, log=changed.append).root != built.root
    assert [line.split(": ", 1)[1] for line in changed] == ["COPY . /app/"]
    # COPY of what it leaves out finds nothing, as in Docker.
    (context / "Dockerfile").write_text("FROM python:3.11-slim-bookworm\nCOPY secret.txt /\n")
    with pytest.raises(BuildError, match="left out by its .dockerignore"):
        build_root(context, cache=cache)


def test_docker_applies_dockerignore_and_its_tag_ignores_what_it_leaves_out(
    docker_base: str,  # noqa: F811
    tmp_path: Path,
) -> None:
    from stayer.environments.docker import build_image, image_tag

    context = _ignoring_context(tmp_path)
    tag = build_image(context)
    listing = subprocess.run(
        ["docker", "run", "--rm", "--entrypoint", "/bin/sh", tag, "-c", "cd /app && find . | sort"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    assert listing == [
        ".",
        "./.dockerignore",
        "./Dockerfile",
        "./keep.txt",
        "./logs",
        "./logs/keep.log",
        "./secret-ok.txt",
    ]
    (context / "secret.txt").write_text("another secret\n")
    assert image_tag(context) == tag
    (context / "keep.txt").write_text("changed\n")
    assert image_tag(context) != tag


def test_a_build_records_its_layers_and_holds_them_against_a_prune(
    base_root: Path,  # noqa: F811
    tmp_path: Path,
) -> None:
    context = _ignoring_context(tmp_path)
    (context / "Dockerfile").write_text(
        "FROM python:3.11-slim-bookworm\nWORKDIR /app\nCOPY keep.txt ./\n"
    )
    cache = private_cache(base_root, tmp_path)
    built = build_root(context, cache=cache)

    def images(*args: str) -> dict:
        proc = subprocess.run(
            [sys.executable, "-m", "stayer.cli", "images", *args, "--json"],
            capture_output=True,
            text=True,
            env={**os.environ, "STAYER_CACHE": str(cache)},
            timeout=120,
        )
        assert proc.returncode == 0, proc.stderr
        return json.loads(proc.stdout)

    listed = images("list")["layers"]
    by_id = {layer["id"]: layer for layer in listed}
    top = by_id[built.root.name]
    assert top["images"] == [str(context / "Dockerfile")]
    assert top["step"] == "line 3: COPY keep.txt /app/" and top["dockerfile"] == str(
        context / "Dockerfile"
    )
    workdir = by_id[top["parent"]]
    assert workdir["parent"] is None and workdir["step"] == "line 2: WORKDIR /app"
    assert top["size_bytes"] > 50_000_000  # a whole root filesystem
    # This process built them, and may run sandboxes on them: in use, never removed.
    assert all(layer["in_use"] for layer in listed)
    doc = images("prune", "--all")
    assert doc["removed"] == [] and sorted(doc["in_use"]) == sorted(by_id)
    assert (built.root / "app" / "keep.txt").read_text() == "kept\n"


def _docker_seed_with(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, codes: list[int]
) -> list[list[str]]:
    """Environment.seed for an image, with ``docker run`` answering ``codes`` in turn."""
    from stayer.environments import prepare
    from stayer.sandbox import docker

    calls: list[list[str]] = []

    def run(argv: list[str], **kwargs: Any) -> subprocess.CompletedProcess[bytes]:
        calls.append(argv)
        code = codes[min(len(calls), len(codes)) - 1]
        return subprocess.CompletedProcess(
            argv, code, b"", b"docker: Error: OCI runtime create failed\n"
        )

    monkeypatch.setattr(docker, "check_docker", lambda docker=None: "docker")
    monkeypatch.setattr(prepare.subprocess, "run", run)
    workspace = tmp_path / "ws"
    workspace.mkdir(parents=True)
    env = prepare.Environment(kind="docker", env={}, image="stayer-image:test")
    try:
        env.seed(workspace)
    finally:
        monkeypatch.undo()
    return calls


def test_the_images_app_is_seeded_or_the_failure_said_never_silently_skipped(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The seed's ``docker run`` once had its status ignored: when Docker's runtime failed to
    start the container (it does now and then on a busy machine), the workspace silently
    lacked the image's /app (CI saw numbers.txt missing)."""
    from stayer.environments.build import BuildError

    assert len(_docker_seed_with(monkeypatch, tmp_path / "a", [125, 0])) == 2  # tried again
    with pytest.raises(BuildError, match=r"exit 125\): docker: Error: OCI runtime"):
        _docker_seed_with(monkeypatch, tmp_path / "b", [125])
    with pytest.raises(BuildError, match="exit 1"):  # the copy itself failed: not retried
        _docker_seed_with(monkeypatch, tmp_path / "c", [1])


def test_a_prepared_image_is_built_again_once_it_is_gone(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """An image is built once per process, but a worker lives for days: an image removed
    from Docker (by hand, or another daemon) or a root no longer in the layer cache in use
    (pruned, or STAYER_CACHE changed) is built again, not handed out to fail every run."""
    from stayer.environments import docker, prepare

    context = tmp_path / "env"
    context.mkdir()
    (context / "Dockerfile").write_text("FROM debian:bookworm\n")
    built: list[str] = []
    images = {"present": True}

    def build(kind: str, ctx: Path, log: Any) -> prepare.Environment:
        built.append(kind)
        return prepare.Environment(kind, {}, image=f"stayer-env:{len(built)}")

    monkeypatch.setattr(prepare, "_build", build)
    monkeypatch.setattr(docker, "image_exists", lambda tag: images["present"])
    first = prepare.prepare_environment("docker", context)
    assert prepare.prepare_environment("docker", context) is first and built == ["docker"]
    images["present"] = False  # docker image rm
    assert prepare.prepare_environment("docker", context) is not first
    assert built == ["docker", "docker"]

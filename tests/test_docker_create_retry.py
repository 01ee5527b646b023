"""The docker sandbox tries again a container that the runtime failed to create (the
command never started), and nothing else.

A real runc that fails now and then cannot be had on demand, so ``docker`` here is a
stand-in on PATH: it fails its first ``run`` calls with the words of the real failure, then
runs the command as ``docker run`` would hand it to bash."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

from stayer.environments.build import BuildError
from stayer.environments.prepare import Environment
from stayer.sandbox.docker import DockerSandbox, check_docker

CREATE_FAILED = (
    "docker: Error response from daemon: failed to create shim task: OCI runtime create "
    'failed: runc create failed: unable to start container process: exec: "/bin/bash": '
    "stat /bin/bash: permission denied: unknown"
)


def _install_docker(bin_dir: Path, body: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A ``docker`` on PATH answering ``case "$1"`` with ``body``."""
    bin_dir.mkdir(exist_ok=True)
    script = bin_dir / "docker"
    script.write_text('#!/bin/sh\ncase "$1" in\n  version) echo 26.1.5 ;;\n' + body + "esac\n")
    script.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    check_docker.cache_clear()


@pytest.fixture
def fake_docker(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """``make(fails, then)``: a docker whose first ``fails`` runs fail to create the
    container, and later ones run ``then`` (by default the command, as bash would); returns
    the file counting its runs."""

    def make(fails: int, then: str = 'for last; do :; done; exec /bin/sh -c "$last"') -> Path:
        count = tmp_path / "runs"
        _install_docker(
            tmp_path / "bin",
            "  rm) ;;\n"
            f"  run) n=$(( $(cat {count} 2>/dev/null || echo 0) + 1 )); echo $n > {count}\n"
            f"       if [ $n -le {fails} ]; then echo '{CREATE_FAILED}' >&2; echo >&2;"
            " echo \"Run 'docker run --help' for more information\" >&2; exit 126; fi\n"
            f"       {then} ;;\n",
            monkeypatch,
        )
        return count

    yield make
    check_docker.cache_clear()


def _exec(tmp_path: Path, command: str):
    ws = tmp_path / "ws"
    ws.mkdir(exist_ok=True)
    return asyncio.run(DockerSandbox(ws, image="any").exec(command, timeout=60))


def test_a_container_the_runtime_failed_to_create_is_tried_again(fake_docker, tmp_path):
    runs = fake_docker(fails=1)
    r = _exec(tmp_path, "echo ran")
    assert (r.exit_code, r.stdout, runs.read_text()) == (0, "ran\n", "2\n"), r


def test_the_tries_are_bounded_and_the_last_failure_is_reported(fake_docker, tmp_path):
    runs = fake_docker(fails=10)
    r = _exec(tmp_path, "echo ran")
    assert r.exit_code == 126 and r.stderr.startswith(CREATE_FAILED), r
    assert runs.read_text() == "3\n"


def test_a_command_that_failed_itself_is_not_run_again(fake_docker, tmp_path):
    runs = fake_docker(fails=0)
    # Exit 126 and the runtime's words, but it printed: it started, and ran once.
    r = _exec(tmp_path, f"echo started; echo '{CREATE_FAILED}' >&2; exit 126")
    assert (r.exit_code, r.stdout, runs.read_text()) == (126, "started\n", "1\n"), r
    r = _exec(tmp_path, "exit 127")
    assert r.exit_code == 127 and runs.read_text() == "2\n"


def test_seeding_a_workspace_from_the_image_tries_again_too(fake_docker, tmp_path):
    """The copy of the image's /app into a fresh workspace is a container of its own (a
    loaded CI run lost a trial to it as an infrastructure failure)."""
    ws = tmp_path / "ws"
    ws.mkdir()
    runs = fake_docker(fails=2, then="exit 0")
    Environment(kind="docker", env={}, image="any").seed(ws)
    assert runs.read_text() == "3\n"


def test_seeding_says_the_runtimes_words_when_every_try_fails(fake_docker, tmp_path):
    ws = tmp_path / "ws"
    ws.mkdir()
    runs = fake_docker(fails=10)
    with pytest.raises(BuildError) as e:
        Environment(kind="docker", env={}, image="any").seed(ws)
    assert runs.read_text() == "3\n"
    assert "exit 126" in str(e.value) and "OCI runtime create failed" in str(e.value), e.value
    assert "docker run --help" not in str(e.value)


def _fake_builder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fails: int, words: str) -> Path:
    """A docker whose first ``fails`` builds fail at a RUN step saying ``words``; it has no
    image until a build succeeds. Returns the file counting its builds."""
    count, built = tmp_path / "builds", tmp_path / "built"
    _install_docker(
        tmp_path / "bin",
        f"  image) [ -e {built} ] ;;\n"
        f"  build) n=$(( $(cat {count} 2>/dev/null || echo 0) + 1 )); echo $n > {count}\n"
        "         echo 'Step 1/2 : FROM debian:bookworm'; echo 'Step 2/2 : RUN true'\n"
        f"         if [ $n -le {fails} ]; then echo '{words}'; exit 1; fi\n"
        f"         touch {built} ;;\n",
        monkeypatch,
    )
    return count


def _context(tmp_path: Path) -> Path:
    context = tmp_path / "env"
    context.mkdir()
    (context / "Dockerfile").write_text("FROM debian:bookworm\nRUN true\n")
    return context


UNPACK_FAILED = (
    "failed to copy files: failed to copy file: Error processing tar file(exit status 1): "
    "Error after fallback to chroot: no such file or directory"
)


@pytest.mark.parametrize(
    "words", [CREATE_FAILED.removeprefix("docker: "), UNPACK_FAILED], ids=["create", "unpack"]
)
def test_a_build_whose_step_docker_failed_to_start_or_fill_is_built_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, words: str
) -> None:
    from stayer.environments.docker import build_image

    builds = _fake_builder(tmp_path, monkeypatch, 1, words)
    said: list[str] = []
    try:
        build_image(_context(tmp_path), log=said.append)
    finally:
        check_docker.cache_clear()
    assert builds.read_text() == "2\n"
    assert any("failed to start or fill a step; building again" in line for line in said), said


@pytest.mark.parametrize(
    "words",
    [
        "E: Unable to locate package nosuch",
        # a COPY onto a file: unpacked by the same helper, the step's own fault
        "failed to copy files: failed to copy file: Error processing tar file(exit status 1): "
        "mkdir /app/numbers.txt: not a directory",
    ],
    ids=["run", "copy"],
)
def test_a_build_that_fails_by_itself_is_not_built_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, words: str
) -> None:
    from stayer.environments.docker import build_image

    builds = _fake_builder(tmp_path, monkeypatch, 1, words)
    try:
        with pytest.raises(BuildError, match=words.split(": ")[-1]):
            build_image(_context(tmp_path))
    finally:
        check_docker.cache_clear()
    assert builds.read_text() == "1\n"

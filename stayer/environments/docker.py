"""Build a task's image with Docker, cached by the content hash of its build context.

The context directory goes to ``docker build`` as it is: Docker reads its ``.dockerignore``
and sends the rest; the hash counts the same files (:mod:`stayer.environments.dockerignore`)."""

from __future__ import annotations

import collections
import json
import re
import subprocess
import threading
from collections.abc import Callable
from pathlib import Path

from stayer.environments import dockerignore
from stayer.environments.build import BuildError
from stayer.environments.dockerfile import parse_dockerfile
from stayer.sandbox.docker import check_docker, client_env, retry_docker_failures, runtime_failed

# An image is named by what it is built from: equal contexts share one image.
IMAGE_REPOSITORY = "stayer-env"
BUILD_TIMEOUT_S = 3600.0
_TAIL_LINES = 20
_STEP = re.compile(r"Step \d+/\d+ : |#\d+ \[(?:[\w.-]+ )?\d+/\d+\] ")
# The daemon's helper that unpacks a COPY into the step's root could not enter that root
# ("failed to copy files: failed to copy file: Error processing tar file(exit status 1):
# Error after fallback to chroot: no such file or directory"; seen in two concurrent test
# runs at a load of ~13, not on demand). The step's own failures (a source missing, a
# destination that is a file) say something else.
_UNPACK_FAILED = "Error after fallback to chroot"


def image_tag(context: Path) -> str:
    """The image's name: the content hash of what ``docker build`` is given of ``context``
    (its .dockerignore applied, as Docker applies it), so that editing a file it leaves
    out builds nothing again."""
    return f"{IMAGE_REPOSITORY}:{dockerignore.walk(context).image_digest()[:24]}"


def build_image(context: str | Path, *, log: Callable[[str], None] = lambda _: None) -> str:
    """The tag of ``context``'s image, built by Docker unless one of that content exists.
    ``RUN`` steps get the host's network, as the Docker-free builder's do (a daemon
    started without a bridge has no other). Raises BuildError naming the Dockerfile."""
    context = Path(context).resolve()
    dockerfile = parse_dockerfile(context / "Dockerfile")  # bad input fails before Docker runs
    docker = check_docker()
    tag = image_tag(context)
    if _exists(docker, tag):
        return tag
    log(f"{dockerfile.path}: building image {tag} with Docker")
    argv = [docker, "build", "--network", "host", "--tag", tag, "--file", str(dockerfile.path)]
    # A step whose container the runtime failed to create (as ``docker run`` sometimes
    # fails on a busy machine: stayer.sandbox.docker), or whose COPY the daemon failed to
    # unpack, fails the build; built again, the steps before it come from Docker's cache.
    code, tail = retry_docker_failures(
        lambda: _run_build([*argv, str(context)], lambda step: log(f"{dockerfile.path}: {step}")),
        lambda done: done[0] not in (0, None) and any(map(_docker_failed, done[1])),
        lambda: log(f"{dockerfile.path}: Docker failed to start or fill a step; building again"),
    )
    if code is None:
        raise BuildError(
            f"{dockerfile.path}: docker build did not finish in {BUILD_TIMEOUT_S:.0f} s; "
            f"its last words: {tail[-1] if tail else '(none)'}"
        )
    if code != 0:
        raise BuildError(f"{dockerfile.path}: docker build failed: {(tail[-1] if tail else code)}")
    return tag


def _docker_failed(line: str) -> bool:
    """Whether a line of ``docker build`` says Docker itself failed a step, not the step."""
    return runtime_failed(line) or _UNPACK_FAILED in line


def _run_build(argv: list[str], on_step: Callable[[str], None]) -> tuple[int | None, list[str]]:
    """Run ``docker build``: ``(exit code or None when it ran past BUILD_TIMEOUT_S, its
    last lines)``. Each step it starts is passed to ``on_step`` as it starts (the classic
    builder's ``Step 2/5 : RUN …``, BuildKit's ``#5 [2/5] RUN …``): a build takes minutes,
    and one that hangs says on which step."""
    proc = subprocess.Popen(
        argv,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        env=client_env(),
    )
    tail: collections.deque[str] = collections.deque(maxlen=_TAIL_LINES)

    def read() -> None:
        assert proc.stdout is not None
        for raw in proc.stdout:
            line = raw.decode("utf-8", "replace").rstrip()
            if line:
                tail.append(line)
            if _STEP.match(line):
                on_step(line)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        code: int | None = proc.wait(timeout=BUILD_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        code = None
    reader.join()
    return code, list(tail)


def image_env(tag: str) -> dict[str, str]:
    """The image's ENV (``Config.Env``)."""
    proc = subprocess.run(
        [check_docker(), "image", "inspect", "--format", "{{json .Config.Env}}", tag],
        capture_output=True,
        timeout=60,
        env=client_env(),
        check=True,
    )
    pairs = json.loads(proc.stdout or b"null") or []
    return dict(p.split("=", 1) for p in pairs if "=" in p)


def image_exists(tag: str) -> bool:
    """Whether the Docker that commands run in has the image ``tag``."""
    return _exists(check_docker(), tag)


def _exists(docker: str, tag: str) -> bool:
    proc = subprocess.run(
        [docker, "image", "inspect", "--format", "{{.Id}}", tag],
        capture_output=True,
        timeout=60,
        env=client_env(),
    )
    return proc.returncode == 0


__all__ = ["IMAGE_REPOSITORY", "build_image", "image_env", "image_exists", "image_tag"]

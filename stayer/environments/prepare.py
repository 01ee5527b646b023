"""A task's environment made ready to run in: its image built, and sandboxes over it.

Sandbox kinds that build the task's ``environment/Dockerfile`` (:data:`IMAGE_KINDS`):

* ``docker`` — Docker builds the image (:mod:`stayer.environments.docker`), each command
  runs in a fresh container of it (:class:`~stayer.sandbox.docker.DockerSandbox`);
* ``bwrap-image`` — no Docker: the image's filesystem is built with bubblewrap over a
  Debian base (:mod:`stayer.environments.build`), and each command runs in the bubblewrap
  sandbox with that filesystem as its system.

Either way the workspace (``/app``) is a host directory, so snapshots, the storage limit
and the verifier's mounts work as with ``bwrap``. :meth:`Environment.seed` adds what the
image itself put in ``/app`` (``COPY``, files a ``RUN`` made), which the workspace mount
would otherwise hide. Other kinds (``bwrap``, ``local``) run on the host's system and
build nothing.
"""

from __future__ import annotations

import subprocess
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from stayer.environments import dockerignore, layers
from stayer.environments.build import BuildError, BuiltRoot, build_root
from stayer.errors import ConfigError
from stayer.paths import cache_root
from stayer.sandbox import IMAGE_KINDS, Sandbox, make_sandbox
from stayer.workspace.hostfs import copy_tree

# The image's own HOME is usually /root, which the command can neither read nor write.
_FORCED_ENV = {"HOME": "/tmp"}


@dataclass(frozen=True)
class Environment:
    """A built image and how to run commands in it."""

    kind: str
    env: dict[str, str]  # the image's ENV, as the command gets it
    image: str | None = None  # docker: the image's tag
    root: BuiltRoot | None = None  # bwrap-image: the built filesystem
    notes: tuple[str, ...] = field(default=())  # approximations worth a warning

    def sandbox(self, workspace: str | Path, **limits: Any) -> Sandbox:
        env = {**self.env, **(limits.pop("env", None) or {}), **_FORCED_ENV}
        if self.kind == "docker":
            from stayer.sandbox.docker import DockerSandbox

            return DockerSandbox(workspace, image=self.image or "", env=env, **limits)
        assert self.root is not None
        from stayer.sandbox.bwrap import BwrapSandbox

        return BwrapSandbox(workspace, root=self.root.root, env=env, **limits)

    def seed(self, workspace: str | Path) -> None:
        """Copy what the image holds in ``/app`` into ``workspace`` (over what is there)."""
        if self.root is not None:
            # A build step made /app: a link there would lead the host's copy out of the
            # image (Docker's copy, made inside the image, would find nothing there).
            app = self.root.root / "app"
            if app.is_dir() and not app.is_symlink():
                copy_tree(app, workspace)
            return
        from stayer.sandbox.docker import (
            DockerSandbox,
            check_docker,
            client_env,
            client_error,
            hand_over,
            never_created,
            retry_docker_failures,
        )

        user = DockerSandbox(workspace, image=self.image or "").user
        hand_over(Path(workspace), *user)
        # Copied inside a container of the image: the host never reads the image's files.
        argv = (
            [
                check_docker(),
                "run",
                "--rm",
                "--network",
                "none",
                "--cap-drop",
                "ALL",
                "--user",
                f"{user[0]}:{user[1]}",
            ]
            + ["--mount", f"type=bind,source={Path(workspace).resolve()},target=/stayer-seed"]
            + [
                "--entrypoint",
                "/bin/sh",
                self.image or "",
                "-c",
                "[ ! -d /app ] || cp -R /app/. /stayer-seed/",
            ]
        )
        # Docker's runtime fails now and then to create a container on a busy machine: tried
        # again as the docker sandbox does; any other failure is the image's, said as it is,
        # never a workspace silently left without the image's files.
        proc = retry_docker_failures(
            lambda: subprocess.run(
                argv, capture_output=True, timeout=600, env=client_env(), check=False
            ),
            lambda p: never_created(p.returncode, p.stdout, p.stderr),
        )
        if proc.returncode != 0:
            raise BuildError(
                f"{self.image}: copying the image's /app into the workspace failed (exit "
                f"{proc.returncode}): {client_error(proc.stderr)[:300]}"
            )


# Images prepared by this process, by kind and content of their build context: an
# evaluation asks for a task's image for every trial (its workspace, the agent's sandbox,
# the verifier's), and each epoch again.
_PREPARED: dict[tuple[str, Path, str], Environment] = {}
_PREPARING: dict[tuple[str, Path, str], threading.Lock] = {}
_PREPARING_LOCK = threading.Lock()


def prepare_environment(
    kind: str, context: str | Path, *, log: Callable[[str], None] = lambda _: None
) -> Environment:
    """Build ``context``'s image for ``kind``, or find it built: both builders cache by
    content, so preparing the same environment again costs a hash of its files. One image
    is built once: callers asking for the same one at the same time (threads of this
    process) wait for the first, and later ones get what it built (other processes wait
    on the builders' own locks)."""
    context = Path(context).resolve()
    if not (context / "Dockerfile").is_file():
        raise ConfigError(
            f"--sandbox {kind}: {context}/Dockerfile: missing; this sandbox runs the task's image"
        )
    if kind not in IMAGE_KINDS:
        raise ConfigError(
            f"--sandbox {kind}: builds no image; choose one of {', '.join(IMAGE_KINDS)}"
        )
    key = (kind, context, dockerignore.walk(context).image_digest())
    with _PREPARING_LOCK:
        lock = _PREPARING.setdefault(key, threading.Lock())
    with lock:
        done = _PREPARED.get(key)
        if done is not None and _still_there(done):
            if done.root is not None and done.root.root.parent.name == "layers":
                layers.used(done.root.root.parent, done.root.root.name)  # for prune's LRU
            return done
        environment = _build(kind, context, log)
        _PREPARED[key] = environment
        return environment


def _still_there(environment: Environment) -> bool:
    """Whether what this process built is what a build now would give: the image still in
    the Docker it would run in (removed by hand, or another daemon), the root still in the
    layer cache in use (pruned, or another cache). A worker lives for days."""
    if environment.root is not None:
        root = environment.root.root
        return root.is_dir() and root.is_relative_to(cache_root())
    from stayer.environments.docker import image_exists

    return environment.image is not None and image_exists(environment.image)


def _build(kind: str, context: Path, log: Callable[[str], None]) -> Environment:
    if kind == "docker":
        from stayer.environments.docker import build_image, image_env

        tag = build_image(context, log=log)
        return Environment(kind, image_env(tag), image=tag)
    if kind == "bwrap-image":
        built = build_root(context, log=log)
        return Environment(kind, built.env, root=built, notes=built.notes)
    raise AssertionError(kind)


def image_kind() -> str:
    """The kind that runs a task's image when nothing names one: ``docker`` where a daemon
    answers, else ``bwrap-image`` (built without Docker), as Harbor always builds it."""
    from stayer.sandbox.docker import check_docker

    try:
        check_docker()
    except ConfigError:
        return "bwrap-image"
    return "docker"


def sandbox_for(
    kind: str, workspace: str | Path, environment: str | Path | None, **limits: Any
) -> Sandbox:
    """The sandbox of kind ``kind`` over ``workspace``, for a task whose environment
    directory is ``environment`` (its image built first for :data:`IMAGE_KINDS`)."""
    if kind in IMAGE_KINDS:
        if environment is None:
            raise ConfigError(
                f"--sandbox {kind}: the task has no environment/ directory with a Dockerfile"
            )
        return prepare_environment(kind, environment).sandbox(workspace, **limits)
    return make_sandbox(kind, workspace, **limits)


__all__ = ["IMAGE_KINDS", "Environment", "image_kind", "prepare_environment", "sandbox_for"]

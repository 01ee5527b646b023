"""What the tests of the docker sandbox and of image builds share: a Docker daemon of
their own, started on a private socket for the session, and the base images they build
from, made locally with mmdebstrap (no registry is needed, or reachable in CI).

Skipped, saying why, only where docker.io (or mmdebstrap, for the base) is not installed,
or where the tests cannot start a daemon (not root). Everything else that goes wrong
fails: a daemon that does not come up, a base that cannot be made.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from stayer.environments.base import base_for, build_base, mounts_under
from stayer.sandbox.docker import check_docker

# The base of the fixture task and of the escape suite's containers: Python for the probes.
BASE_IMAGE = "python:3.11-slim-bookworm"
_DAEMON_START_S = 120.0


def _needs(*commands: str, why: str) -> None:
    missing = [c for c in commands if shutil.which(c) is None]
    if missing:
        pytest.skip(f"{', '.join(missing)} not installed ({why})")


@contextlib.contextmanager
def private_dockerd() -> Iterator[str]:
    """A dockerd of our own, for as long as the context lasts: yields its ``DOCKER_HOST``.
    No bridge and no firewall rules: containers get no network or the host's, as the
    docker sandbox asks, and the host's network configuration is left alone."""
    # Short: a unix socket's path must fit in 108 bytes.
    home = Path(tempfile.mkdtemp(prefix="stayer-dockerd-", dir="/tmp"))
    host = f"unix://{home}/docker.sock"
    log = open(home / "dockerd.log", "wb")  # noqa: SIM115 - closed below
    daemon = subprocess.Popen(
        [
            "dockerd",
            "--data-root", f"{home}/data",
            "--exec-root", f"{home}/exec",
            "--pidfile", f"{home}/dockerd.pid",
            "--host", host,
            "--bridge=none", "--iptables=false", "--ip6tables=false",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + _DAEMON_START_S
        while True:  # waiting for readiness, not racing: it is ready when it answers
            probe = subprocess.run(
                ["docker", "--host", host, "version", "--format", "{{.Server.Version}}"],
                capture_output=True,
            )
            if probe.returncode == 0:
                break
            if daemon.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(
                    f"dockerd did not start: {(home / 'dockerd.log').read_text(errors='replace')[-2000:]}"
                )
            time.sleep(0.5)
        yield host
    finally:
        daemon.terminate()
        try:
            daemon.wait(timeout=60)
        except subprocess.TimeoutExpired:
            daemon.kill()
            daemon.wait()
        log.close()
        # dockerd leaves a mount or two behind (its network namespace): undo them first.
        for mount in mounts_under(home):
            subprocess.run(["umount", "--lazy", mount], check=False)
        subprocess.run(["rm", "-rf", "--one-file-system", str(home)], check=False)


@pytest.fixture(scope="session")
def _dockerd() -> Iterator[str]:
    """A daemon started for this test session (and xdist worker): its ``DOCKER_HOST``."""
    _needs("dockerd", "docker", why="apt install docker.io")
    if os.geteuid() != 0:
        pytest.skip("the tests start their own dockerd, which needs root")
    with private_dockerd() as host:
        yield host


@pytest.fixture
def docker_host(_dockerd: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """``DOCKER_HOST`` of the session's daemon, set for this test only: a test that asks
    for no daemon runs as on a machine without one, whatever ran before it."""
    monkeypatch.setenv("DOCKER_HOST", _dockerd)
    check_docker.cache_clear()  # a docker probed without the daemon
    yield _dockerd
    check_docker.cache_clear()


@pytest.fixture(scope="session")
def base_root() -> Path:
    """The root filesystem standing in for :data:`BASE_IMAGE` (made once, then cached in
    ~/.cache/stayer: minutes the first time, with the Debian archive reachable)."""
    _needs("mmdebstrap", why="apt install mmdebstrap")
    return build_base(base_for(BASE_IMAGE))


def private_cache(base_root: Path, tmp_path: Path) -> Path:
    """A layer cache of the test's own over the shared base: layers of content made up
    for one test are not left behind in ~/.cache. Skipped, saying why, where RUN steps
    cannot get their network."""
    needs_slirp()
    cache = tmp_path / "cache"
    (cache / "rootfs").mkdir(parents=True)
    (cache / "rootfs" / base_root.name).symlink_to(base_root)
    return cache


def needs_slirp() -> None:
    """Skip, saying why, where RUN steps cannot get their network (see
    stayer.environments.buildnet)."""
    _needs("slirp4netns", why="apt install slirp4netns: the network of RUN steps")


@pytest.fixture(scope="session")
def _docker_base_image(_dockerd: str, base_root: Path) -> str:
    """:data:`BASE_IMAGE` imported into the session's daemon, once."""
    return import_base(base_root, _dockerd)


@pytest.fixture
def docker_base(docker_host: str, _docker_base_image: str) -> str:
    """:data:`BASE_IMAGE` in the session's daemon, imported from :func:`base_root` (on a
    user's machine it would be pulled from the registry); ``DOCKER_HOST`` set for the test."""
    return _docker_base_image


def import_base(base_root: Path, host: str | None = None) -> str:
    """Import ``base_root`` as :data:`BASE_IMAGE` into the daemon at ``host`` (default: the
    one ``DOCKER_HOST`` names)."""
    env = {**os.environ, "DOCKER_HOST": host} if host else None
    tar = subprocess.Popen(["tar", "-C", str(base_root), "-c", "."], stdout=subprocess.PIPE)
    subprocess.run(
        ["docker", "import", "-", BASE_IMAGE],
        stdin=tar.stdout,
        check=True,
        capture_output=True,
        env=env,
    )
    assert tar.stdout is not None
    tar.stdout.close()
    assert tar.wait() == 0
    return BASE_IMAGE

"""Which Debian system stands in for a Dockerfile's base image, and when it says so."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from stayer.environments.base import base_for
from stayer.errors import ConfigError


@pytest.mark.parametrize(
    ("image", "release", "approximate"),
    [
        ("debian:bookworm", "bookworm", False),
        ("debian:bookworm-slim", "bookworm", False),
        ("debian:12.7", "bookworm", False),
        ("docker.io/library/debian:11-slim", "bullseye", False),
        ("debian", "trixie", False),
        ("python:3.11-slim-bookworm", "bookworm", False),
        ("python:3.13-slim", "trixie", False),
        ("python:3.12-slim-bookworm", "bookworm", True),
        ("python:3.9.18-slim-bullseye", "bullseye", False),
        ("ubuntu:22.04", "bookworm", True),
        ("ubuntu:noble", "trixie", True),
        ("ubuntu:25.10", "trixie", True),
    ],
)
def test_stand_ins(image: str, release: str, approximate: bool) -> None:
    base = base_for(image)
    assert base.release == release
    assert (base.approximation is not None) == approximate
    if image.startswith("python"):
        assert "python3" in base.packages


def test_same_recipe_same_key() -> None:
    assert base_for("debian:bookworm").key == base_for("debian:12-slim").key
    assert base_for("debian:bookworm").key != base_for("python:3.11-slim-bookworm").key


@pytest.mark.parametrize(
    "image",
    ["alpine:3.19", "debian:sid", "python:3.12-alpine", "ubuntu:18.04", "python:3.12-slim-buster"],
)
def test_no_stand_in(image: str) -> None:
    with pytest.raises(ConfigError, match="FROM: ") as e:
        base_for(image)
    assert "\n" not in str(e.value)


@pytest.mark.skipif(os.geteuid() != 0, reason="mounting needs root")
def test_a_base_is_never_cached_with_a_mount_inside(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As root, mmdebstrap mounts proc on the target and only warns when it cannot unmount
    it: the base it made is cached with nothing mounted inside (a proc there once made a
    later copy of the base read /proc/*/pagemap until the disk was full)."""
    from stayer.environments import base as base_module

    real_run = subprocess.run

    def fake_mmdebstrap(argv, **kw):  # noqa: ANN001, ANN202
        if argv[0] != "/fake/mmdebstrap":
            return real_run(argv, **kw)
        target = Path(argv[-1])
        for d in ("etc", "tmp", "proc"):
            (target / d).mkdir(parents=True)
        (target / "etc" / "debian_version").write_text("12\n")
        real_run(
            ["mount", "-t", "tmpfs", "-o", "size=1m", "none", str(target / "proc")], check=True
        )
        (target / "proc" / "pagemap").write_text("x")
        return subprocess.CompletedProcess(argv, 0, b"", b"umount /proc failed")

    monkeypatch.setattr(base_module.shutil, "which", lambda name: "/fake/mmdebstrap")
    monkeypatch.setattr(base_module.subprocess, "run", fake_mmdebstrap)
    try:
        done = base_module.build_base(base_for("debian:bookworm"), cache=tmp_path)
        mounts = Path("/proc/self/mountinfo").read_text()
    finally:
        base_module._unmount_under(tmp_path)  # whatever the outcome, nothing stays mounted
    assert not [line for line in mounts.splitlines() if f" {tmp_path}/" in line]
    assert (done / "etc" / "debian_version").is_file() and list((done / "proc").iterdir()) == []

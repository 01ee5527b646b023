"""Which Debian system stands in for a Dockerfile's base image, and when it says so."""

from __future__ import annotations

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

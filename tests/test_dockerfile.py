"""The Dockerfile reader: what a builder without Docker runs, and what it refuses."""

from __future__ import annotations

from pathlib import Path

import pytest

from stayer.environments.dockerfile import (
    CopyStep,
    RunStep,
    WorkdirStep,
    expand,
    parse_dockerfile,
    parse_text,
)
from stayer.errors import ConfigError


def test_steps_in_order_with_state_in_force() -> None:
    text = """\
# syntax=docker/dockerfile:1
ARG PY=3.12
FROM python:${PY}-slim AS base
ENV DEBIAN_FRONTEND=noninteractive \\
    GREETING="hello world"
# a comment inside is skipped
RUN apt-get update && \\
    # comment in a continuation
    apt-get install -y jq
WORKDIR /app
COPY --chown=1000:1000 data.txt ./data/
ARG LEVEL=2
ENV OLD value with spaces
RUN ["echo", "exec form"]
USER nobody
WORKDIR sub
CMD ["bash"]
"""
    plan = parse_text(text).plan()
    assert plan.base == "python:3.12-slim"
    run, workdir, copy, run2, workdir2 = plan.steps
    assert isinstance(run, RunStep)
    assert run.argv == ("/bin/sh", "-c", "apt-get update && apt-get install -y jq")
    assert dict(run.env) == {"DEBIAN_FRONTEND": "noninteractive", "GREETING": "hello world"}
    assert run.workdir == "/" and run.user == "root" and run.line == 7
    assert workdir == WorkdirStep("/app", "root", 10)
    assert copy == CopyStep(("data.txt",), "/app/data/", "1000:1000", None, 11)
    assert isinstance(run2, RunStep) and run2.argv == ("echo", "exec form")
    assert dict(run2.env) == {
        "DEBIAN_FRONTEND": "noninteractive",
        "GREETING": "hello world",
        "LEVEL": "2",
        "OLD": "value with spaces",
    }
    assert workdir2 == WorkdirStep("/app/sub", "nobody", 16)
    assert plan.workdir == "/app/sub" and plan.user == "nobody"
    assert dict(plan.env)["OLD"] == "value with spaces" and "LEVEL" not in dict(plan.env)
    assert plan.ignored == ("CMD (line 17)",)


def test_build_args_and_expansion() -> None:
    plan = parse_text(
        "ARG TAG=bookworm\nFROM debian:$TAG\nARG TAG\nENV T=${TAG:-none} U=${MISSING:-dflt} V=${TAG:+set}\n"
    ).plan({"TAG": "trixie"})
    assert plan.base == "debian:trixie"
    assert dict(plan.env) == {"T": "trixie", "U": "dflt", "V": "set"}
    assert expand("a\\$HOME $X", {"X": "x", "HOME": "h"}) == "a$HOME x"


def test_last_stage_is_planned() -> None:
    plan = parse_text(
        "FROM debian:bookworm AS one\nRUN true\nFROM ubuntu:22.04\nRUN false\n"
    ).plan()
    assert plan.base == "ubuntu:22.04"
    assert [s.argv[-1] for s in plan.steps if isinstance(s, RunStep)] == ["false"]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("RUN true\n", "no FROM"),
        ("FROM debian\nFROBNICATE x\n", "unknown instruction 'FROBNICATE'"),
        ("FROM debian AS b\nFROM b\n", "earlier stage"),
        ("FROM debian\nCOPY --from=builder /x /y\n", "--from"),
        ("FROM debian\nADD https://example.org/x.tgz /x\n", "fetching URLs"),
        ("FROM debian\nRUN <<EOF\necho\nEOF\n", "here-documents"),
        ("FROM debian\nRUN --mount=type=cache,target=/x true\n", "--mount"),
        ("FROM debian\nONBUILD RUN true\n", "ONBUILD"),
        ("FROM debian\nCOPY onlyone\n", "source and a destination"),
        ("FROM debian\nSHELL bash\n", "JSON form"),
        ("FROM debian\nENV =x\n", "NAME=VALUE"),
    ],
)
def test_refused_with_file_and_line(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "Dockerfile"
    path.write_text(text)
    with pytest.raises(ConfigError, match=message) as e:
        parse_dockerfile(path).plan()
    assert str(e.value).startswith(str(path))
    assert "\n" not in str(e.value)


def test_unreadable_file(tmp_path: Path) -> None:
    path = tmp_path / "Dockerfile"
    path.write_bytes(b"FROM \xff\n")
    with pytest.raises(ConfigError, match="cannot read"):
        parse_dockerfile(path)

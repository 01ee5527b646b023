"""``stayer images list`` and ``stayer images prune``: the Docker-free builder's layer
cache, listed and pruned least recently used first, never a layer in use, never through
a link. Layers here are made up (a few files and their records), as the builder leaves
them; tests/test_environments.py checks what a real build records."""

from __future__ import annotations

import fcntl
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

DAY = 86400.0


def _key(name: str) -> str:
    return (name * 24)[:24]


def _layer(
    cache: Path,
    name: str,
    *,
    parent: str | None = None,
    age: float,
    images: tuple[str, ...] = (),
    size: int = 100,
) -> Path:
    layers = cache / "layers"
    path = layers / _key(name)
    (path / "etc").mkdir(parents=True)
    (path / "etc" / "os-release").write_text(name)
    (layers / f"{_key(name)}.lock").touch()
    meta = {
        "parent": None if parent is None else _key(parent),
        "dockerfile": f"/tasks/{name}/environment/Dockerfile",
        "step": "line 2: RUN true",
        "size_bytes": size,
        "created": time.time() - age,
        "last_used": time.time() - age,
        "images": list(images),
    }
    (layers / f"{_key(name)}.json").write_text(json.dumps(meta))
    return path


@pytest.fixture
def cache(tmp_path: Path) -> Path:
    """a ← b ← c: the image of one Dockerfile, used an hour ago; d ← e: another's, ten days
    ago. 100 bytes a layer."""
    cache = tmp_path / "cache"
    _layer(cache, "a", age=3600)
    _layer(cache, "b", parent="a", age=3600)
    _layer(cache, "c", parent="b", age=3600, images=("/tasks/c/environment/Dockerfile",))
    _layer(cache, "d", age=10 * DAY)
    _layer(cache, "e", parent="d", age=10 * DAY)  # nothing built on it: an image too
    return cache


def stayer(cache: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "STAYER_CACHE": str(cache)}
    return subprocess.run(
        [sys.executable, "-m", "stayer.cli", "images", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )


def _doc(proc: subprocess.CompletedProcess[str]) -> dict:
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)  # exactly one document


def _left(cache: Path) -> list[str]:
    return sorted(p.name[0] for p in (cache / "layers").iterdir() if len(p.name) == 24)


def test_list_says_what_each_layer_is(cache: Path) -> None:
    doc = _doc(stayer(cache, "list", "--json"))
    assert doc["cache"] == str(cache)
    by = {layer["id"][0]: layer for layer in doc["layers"]}
    assert sorted(by) == ["a", "b", "c", "d", "e"]
    assert by["c"]["parent"] == _key("b")
    assert by["c"]["images"] == ["/tasks/c/environment/Dockerfile"]
    assert by["c"]["dockerfile"] == "/tasks/c/environment/Dockerfile"
    assert by["c"]["size_bytes"] == 100
    assert by["c"]["last_used"].endswith("Z") and not by["c"]["in_use"]
    assert doc["total_bytes"] == 500
    # Most recently used first.
    assert [layer["id"][0] for layer in doc["layers"]][-2:] in (["d", "e"], ["e", "d"])
    human = stayer(cache, "list")
    assert human.returncode == 0 and "5 layers" in human.stdout


def test_an_empty_or_missing_cache_lists_nothing(tmp_path: Path) -> None:
    assert _doc(stayer(tmp_path / "none", "list", "--json"))["layers"] == []
    doc = _doc(stayer(tmp_path / "none", "prune", "--all", "--json"))
    assert doc["removed"] == [] and doc["freed_bytes"] == 0


def test_prune_older_than_removes_the_images_not_used_since(cache: Path) -> None:
    doc = _doc(stayer(cache, "prune", "--older-than", "7d", "--json"))
    assert sorted(k[0] for k in doc["removed"]) == ["d", "e"]
    assert doc["freed_bytes"] == 200 and not doc["dry_run"]
    assert _left(cache) == ["a", "b", "c"]
    assert not (cache / "layers" / f"{_key('e')}.json").exists()


def test_prune_keep_bytes_keeps_the_most_recent_images_that_fit(cache: Path) -> None:
    # c needs a, b and c: 300 bytes; e needs d and e: 200 more, which do not fit.
    doc = _doc(stayer(cache, "prune", "--keep-bytes", "300", "--json"))
    assert sorted(k[0] for k in doc["removed"]) == ["d", "e"]
    assert _left(cache) == ["a", "b", "c"]
    # Below what the most recent image needs: nothing is kept (least recent first).
    doc = _doc(stayer(cache, "prune", "--keep-bytes", "250", "--json"))
    assert [k[0] for k in doc["removed"]] == ["a", "b", "c"]
    assert _left(cache) == []


def test_dry_run_removes_nothing(cache: Path) -> None:
    doc = _doc(stayer(cache, "prune", "--all", "--dry-run", "--json"))
    assert doc["dry_run"] and sorted(k[0] for k in doc["removed"]) == list("abcde")
    assert doc["freed_bytes"] == 500
    assert _left(cache) == list("abcde")
    human = stayer(cache, "prune", "--older-than", "1d", "--dry-run")
    assert human.returncode == 0 and "would remove 2 layers" in human.stdout
    assert _left(cache) == list("abcde")


def test_a_layer_in_use_is_never_removed(cache: Path) -> None:
    # As a build or a run holds it: its lock, shared, for as long as the process lives.
    with open(cache / "layers" / f"{_key('e')}.lock") as held:
        fcntl.flock(held, fcntl.LOCK_SH)
        listed = {x["id"][0]: x for x in _doc(stayer(cache, "list", "--json"))["layers"]}
        assert listed["e"]["in_use"] and not listed["d"]["in_use"]
        doc = _doc(stayer(cache, "prune", "--all", "--json"))
        assert [k[0] for k in doc["in_use"]] == ["e"]
        assert sorted(k[0] for k in doc["removed"]) == ["a", "b", "c", "d"]
        assert _left(cache) == ["e"]
        assert (cache / "layers" / _key("e") / "etc" / "os-release").read_text() == "e"
    doc = _doc(stayer(cache, "prune", "--all", "--json"))
    assert [k[0] for k in doc["removed"]] == ["e"]


def test_prune_never_follows_a_link_in_a_layer(cache: Path, tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    (outside / "dir").mkdir(parents=True)
    (outside / "dir" / "precious").write_text("keep me\n")
    layer = cache / "layers" / _key("c")
    os.symlink(outside, layer / "host")  # as a root filesystem's absolute links
    os.symlink(outside / "dir", layer / "etc" / "dir")
    os.symlink("/", layer / "root-link")
    (layer / "ro").mkdir()
    (layer / "ro" / "file").write_text("x")
    os.chmod(layer / "ro", 0o555)
    # What an interrupted build left is removed too, when its build is not running.
    (cache / "layers" / f"{_key('f')}.partial" / "usr").mkdir(parents=True)
    doc = _doc(stayer(cache, "prune", "--all", "--json"))
    assert sorted(k[0] for k in doc["removed"]) == list("abcde")
    assert doc["leftovers"] == [f"{_key('f')}.partial"]
    assert (outside / "dir" / "precious").read_text() == "keep me\n"
    assert sorted(p.name for p in (cache / "layers").iterdir()) == ["prune.lock"]


def test_a_cache_that_is_a_link_is_refused(cache: Path, tmp_path: Path) -> None:
    os.symlink(cache, tmp_path / "link")
    for args in (("list", "--json"), ("prune", "--all", "--json")):
        proc = stayer(tmp_path / "link", *args)
        assert proc.returncode == 2 and proc.stdout == ""
        assert "link" in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
    assert _left(cache) == list("abcde")


@pytest.mark.parametrize(
    ("args", "flag"),
    [
        (("--older-than", "3x"), "--older-than"),
        (("--older-than", ""), "--older-than"),
        (("--keep-bytes", "lots"), "--keep-bytes"),
        (("--keep-bytes", "-1G"), "--keep-bytes"),
        ((), "--older-than, --keep-bytes or --all"),
        (("--all", "--older-than", "1d"), "--all"),
        (("--bogus",), "--bogus"),
    ],
)
def test_bad_input_is_one_line_naming_the_flag(
    cache: Path, args: tuple[str, ...], flag: str
) -> None:
    proc = stayer(cache, "prune", *args, "--json")
    assert proc.returncode == 2, proc
    assert proc.stdout == ""
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and flag in lines[0], proc.stderr
    assert _left(cache) == list("abcde")

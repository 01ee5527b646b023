"""Two processes building the same layer of the Docker-free builder at once (two pytest
workers, two eval workers): the second waits for the first's build, then uses its layer.

What it must not wait for is the first's *use* of the layer: a process that built or reused
a layer holds it (shared) for its whole life, so that no prune removes it under its
sandboxes. A second build that waited for an exclusive hold of that same lock waited as long
as the first process lived (seen: two pytest workers, each waiting on the other, for ever).
The steps themselves are stand-ins: what is tested is the locking around them.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from stayer.environments import build, layers
from stayer.environments.dockerfile import RunStep

STEP = RunStep(argv=("/bin/sh", "-c", "true"), env=(), workdir="/", user="root", line=2)
KEY = "0123456789abcdef01234567"
_CTX = mp.get_context("fork")


def _make(store: Path, parent: Path) -> Path:
    return build._layer("bwrap", parent, KEY, STEP, None, store, Path("Dockerfile"), None, print)  # type: ignore[arg-type]


def _first(store: Path, parent: Path, started: Any, go: Any, holding: Any) -> None:
    """Builds the layer (its step waits for ``go``), then uses it until killed."""

    def step(*_args: object) -> None:
        started.set()
        go.wait()

    build._run_step = step  # this child's copy of the module
    _make(store, parent)
    layers.used(store, KEY)
    holding.set()
    threading.Event().wait()


def _second(store: Path, parent: Path) -> None:
    def step(*_args: object) -> None:
        os._exit(3)  # built again: the first's layer was not found

    build._run_step = step
    os._exit(0 if _make(store, parent) == store / KEY else 4)


def _waiting_on_a_lock(pid: int) -> bool:
    # /proc/locks lists a blocked request as "N: -> FLOCK  ADVISORY  WRITE <pid> …"
    with open("/proc/locks") as f:
        return any("->" in line and line.split()[5] == str(pid) for line in f)


def _wait_for(condition: Any, what: str, within: float = 120.0) -> None:
    deadline = time.monotonic() + within
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"not {what} after {within:.0f} s")
        time.sleep(0.01)


@pytest.mark.skipif(not os.path.exists("/proc/locks"), reason="needs Linux's /proc/locks")
def test_a_second_build_of_a_layer_waits_for_the_build_not_for_its_use(tmp_path: Path) -> None:
    store, parent = tmp_path / "layers", tmp_path / "base"
    store.mkdir(mode=0o700)
    (parent / "etc").mkdir(parents=True)
    (parent / "etc" / "debian_version").write_text("12\n")
    started, go, holding = _CTX.Event(), _CTX.Event(), _CTX.Event()
    first = _CTX.Process(target=_first, args=(store, parent, started, go, holding))
    second = _CTX.Process(target=_second, args=(store, parent))
    first.start()
    try:
        assert started.wait(120), "the first build never reached its step"
        second.start()
        assert second.pid is not None
        # The second is queued behind the first's build before that build ends, and (as on
        # a busy machine) does not run again before the first process holds the layer.
        _wait_for(lambda: _waiting_on_a_lock(second.pid), "waiting for the first build")
        os.kill(second.pid, signal.SIGSTOP)
        go.set()
        assert holding.wait(120), "the first build never finished"
        os.kill(second.pid, signal.SIGCONT)
        second.join(120)
        assert second.exitcode == 0, {None: "still waiting", 3: "built the layer again"}.get(
            second.exitcode, second.exitcode
        )
        assert (store / KEY / "etc" / "debian_version").is_file()
        # Nothing of the build is left beside the layer, and the layer is in use.
        assert sorted(p.name for p in store.iterdir()) == [KEY, f"{KEY}.json", f"{KEY}.lock"]
        assert [layer.in_use for layer in layers.list_layers(tmp_path)] == [True]
    finally:
        for proc in (first, second):
            if proc.pid is not None and proc.exitcode is None:
                os.kill(proc.pid, signal.SIGKILL)
                proc.join()


def test_a_killed_build_leaves_nothing_that_prune_keeps(tmp_path: Path) -> None:
    """A build killed while making its layer leaves its partial tree and its build lock;
    the next prune removes both (no build can be under way while a prune runs)."""
    store = tmp_path / "layers"
    store.mkdir(mode=0o700)
    (store / f"{KEY}.partial").mkdir()
    (store / f"{KEY}.partial" / "f").write_text("x")
    (store / f"{KEY}.build").write_text("")
    pruned = layers.prune(tmp_path)
    assert sorted(pruned.leftovers) == [f"{KEY}.build", f"{KEY}.partial"]
    assert list(store.iterdir()) == [store / layers.PRUNE_LOCK]

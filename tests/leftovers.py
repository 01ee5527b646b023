"""Remove what an earlier, killed test run left in the temporary directory.

    python tests/leftovers.py [DIR ...]   # default: $TMPDIR and /tmp; prints what went

A run cleans up after itself when it ends; one killed first (a CI timeout) leaves its
PostgreSQL data directories, its private dockerd's data root and its workspaces behind,
and on a machine kept between runs they add up to gigabytes. A directory goes only when
the process that made it is gone: a running server, daemon or test session keeps its own.
A stopped server's directory goes too, so run it while no other run is starting (.ci/run
does, before it starts its own).
"""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

from stayer.environments.base import mounts_under

# What the suite and .ci/run create, and the file that names the process using each.
_PG = ("stayer-ci-pg.", "stayer-pg-")  # a server's base: data/postmaster.pid while it runs
_DOCKERD = "stayer-dockerd-"  # a dockerd's home: dockerd.pid while it runs
_WORKSPACES = re.compile(r"stayer-test-workspaces-(\d+)-")  # the session's pid in the name


def _alive(pid: int) -> bool:
    return pid > 0 and Path(f"/proc/{pid}").is_dir()


def _pid_in(path: Path) -> int | None:
    """The pid on the first line of ``path``, or None when there is none."""
    try:
        first = path.read_text().split("\n", 1)[0].strip()
    except OSError:
        return None
    return int(first) if first.isdigit() else None


def _in_use(top: Path) -> bool:
    name = top.name
    if name.startswith(_PG):
        pid = _pid_in(top / "data" / "postmaster.pid")
    elif name.startswith(_DOCKERD):
        pid = _pid_in(top / "dockerd.pid")
    elif m := _WORKSPACES.match(name):
        pid = int(m.group(1))
    else:
        return True  # not ours: never touched
    return pid is not None and _alive(pid)


def sweep(where: Path) -> list[tuple[Path, int]]:
    """Remove the stale leftovers directly under ``where``: their paths and sizes."""
    removed = []
    for top in sorted(where.glob("stayer-*")):
        if top.is_symlink() or not top.is_dir() or _in_use(top):
            continue
        for mount in mounts_under(top):  # a dockerd killed with its network namespace
            subprocess.run(["umount", "--lazy", mount], check=False, capture_output=True)
        size = _size(top)
        # --one-file-system: a mount that would not go stays, with what is under it.
        subprocess.run(["rm", "-rf", "--one-file-system", str(top)], check=False)
        if not top.exists():
            removed.append((top, size))
    return removed


def _size(top: Path) -> int:
    total = 0
    for dirpath, _dirs, files in os.walk(top):
        for f in files:
            with contextlib.suppress(OSError):  # gone meanwhile
                total += os.lstat(os.path.join(dirpath, f)).st_size
    return total


def main(args: list[str]) -> None:
    places = {Path(a) for a in args} or {Path(tempfile.gettempdir()), Path("/tmp")}
    removed = [r for where in sorted(places) if where.is_dir() for r in sweep(where)]
    total = sum(size for _, size in removed)
    for path, size in removed:
        print(f"leftovers: removed {path} ({size / 1e6:,.1f} MB)")
    print(f"leftovers: {len(removed)} removed, {total / 1e6:,.1f} MB freed")


if __name__ == "__main__":
    main(sys.argv[1:])

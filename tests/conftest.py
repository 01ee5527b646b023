"""Settings every test process shares.

Snapshot stores start a watch daemon per store directory (``stayer.workspace.watchd``) that
lives on for minutes after the store's process ends; a suite making hundreds of stores in
temporary directories would leave hundreds of them. It is off for the suite (this
environment variable, inherited by the processes tests start) and on where a test asks
for it: ``FileSnapshotStore(..., shared_watch=True)`` (tests/test_snapshot_watch.py, and
test_snapshot.py's stores, which run both ways). Runs' workspaces go to a directory of the
session's own (``STAYER_WORKSPACES``).
"""

from __future__ import annotations

import os

os.environ.setdefault("STAYER_SHARED_WATCH", "0")

# Runs' workspaces live outside their run directories (stayer.paths.workspaces_root): the
# suite's go to a directory of its own, removed at its end, not to /var/tmp/stayer-<uid>.
if "STAYER_WORKSPACES" not in os.environ:
    import atexit
    import shutil
    import tempfile

    # (the pid in its name: tests/leftovers.py removes it once this process is gone)
    _workspaces = tempfile.mkdtemp(prefix=f"stayer-test-workspaces-{os.getpid()}-")
    os.environ["STAYER_WORKSPACES"] = _workspaces
    atexit.register(shutil.rmtree, _workspaces, ignore_errors=True)

"""Settings every test process shares.

Snapshot stores start a watch daemon per store directory (``stayer.sandbox.watchd``) that
lives on for minutes after the store's process ends; a suite making hundreds of stores in
temporary directories would leave hundreds of them. It is off for the suite (this
environment variable, inherited by the processes tests start) and on where a test asks
for it: ``FileSnapshotStore(..., shared_watch=True)`` (tests/test_snapshot_watch.py, and
test_snapshot.py's stores, which run both ways).
"""

from __future__ import annotations

import os

os.environ.setdefault("STAYER_SHARED_WATCH", "0")

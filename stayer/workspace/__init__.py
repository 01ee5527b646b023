"""The workspace's files, read and written on the host without following a link: the one
tree walk (:mod:`~stayer.workspace.tree`), copies and digests (:mod:`~stayer.workspace.
hostfs`), the change watch (:mod:`~stayer.workspace.watch`, shared between processes by
:mod:`~stayer.workspace.watchd`) and snapshots (:mod:`~stayer.workspace.snapshot`).
Below the sandbox, which only runs commands over a workspace."""

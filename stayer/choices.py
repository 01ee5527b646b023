"""The values that flags take, named once: the commands check against these lists and
their help texts print them, so the two cannot drift. Light to import (help is built at
start-up): names and words only.

* ``SANDBOX_KINDS``: every ``--sandbox``; ``IMAGE_KINDS`` run a task's image (built by
  ``stayer.environments``); ``HOST_KINDS`` run over a bare directory (``sandbox exec``).
* ``POLICY_FORMS``: every context policy (``--policy``), with its parameter.
* ``DEFAULT_*``: the run defaults the commands' help prints; ``stayer.settings.RunSettings``
  (pydantic, too heavy for start-up) takes them from here.
"""

from __future__ import annotations

SANDBOX_KINDS = ("bwrap", "bwrap-persistent", "docker", "bwrap-image", "local")
IMAGE_KINDS = ("docker", "bwrap-image")
HOST_KINDS = tuple(k for k in SANDBOX_KINDS if k not in IMAGE_KINDS)
KIND_HELP = {
    "bwrap": "the host's system in bubblewrap",
    "bwrap-persistent": "bwrap kept running between commands",
    "docker": "the task's Dockerfile, built and run with Docker",
    "bwrap-image": "the task's Dockerfile, built without Docker, run in bubblewrap",
    "local": "unsandboxed, only by name",
}

POLICY_FORMS = ("auto", "none", "mask[:W]", "summarize[:TOKENS]", "textbook[:TOKENS]")
POLICY_HELP = " | ".join(POLICY_FORMS)

DEFAULT_MAX_STEPS = 50  # model calls of one run
DEFAULT_COMMAND_TIMEOUT_S = 120.0  # seconds per sandboxed command
DEFAULT_POLICY = "auto"  # the context policy
DEFAULT_MCP_TOOLS = "auto"  # how MCP tools are offered (stayer.mcp.lazy.MODES)


def kinds_help(kinds: tuple[str, ...] = SANDBOX_KINDS) -> str:
    """The ``--sandbox`` choices for a help text: every kind with what it is."""
    return "; ".join(f"{k} ({KIND_HELP[k]})" for k in kinds)

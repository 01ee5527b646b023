"""Evidence in a script's output that a task cannot run on this host.

Shared by ``tasks check`` (an oracle that fails for want of the network, a command or a
module is the environment's problem, not the task's) and the verifier's classification
(a trial whose tests cannot run here says nothing about the agent).
"""

from __future__ import annotations

import re

from stayer.eval.task import Task

_NETWORK = re.compile(
    r"Could not resolve host|Temporary failure in name resolution|Name or service not known|"
    r"Network is unreachable|getaddrinfo failed|Failed to establish a new connection|"
    r"No address associated with hostname|No matching distribution found",
    re.IGNORECASE,
)
_PACKAGES = re.compile(
    r"Could not open lock file|Unable to acquire the dpkg|are you root\?|"
    r"List directory /var/lib/apt/lists/partial is missing"
)
_MISSING_COMMAND = re.compile(
    r"\b([\w.+-]+): command not found|^\S*sh: \d+: ([\w.+-]+): not found", re.MULTILINE
)
_MISSING_MODULE = re.compile(r"No module named '([\w.]+)'")
_READ_ONLY = re.compile(r"Read-only file system")
# Where a task declares what it installs; a missing module named there is the environment's.
# Dependency lists count whole; in scripts only install commands do, because a script that
# merely mentions a module (a solution writing dedupe.py) declares the agent's work, not
# the host's.
_DEPENDENCY_FILES = ("requirements*.txt", "pyproject.toml")
_SCRIPT_FILES = ("Dockerfile", "*.sh")
_INSTALL_LINE = re.compile(
    r"\b(pip3?|uv|poetry|conda|mamba|micromamba|apt-get|apt|apk)\b.*\b(install|add)\b"
)


def _first_line(pattern: re.Pattern[str], text: str) -> str | None:
    for line in text.splitlines():
        if pattern.search(line):
            return line.strip()[:160]
    return None


def _declared_installs(task: Task) -> str:
    texts = []
    for where in ("environment", "tests", "solution"):
        for pattern in _DEPENDENCY_FILES + _SCRIPT_FILES:
            for p in (task.path / where).rglob(pattern):
                if not p.is_file():
                    continue
                text = p.read_text(errors="replace")
                if pattern in _SCRIPT_FILES:
                    text = "\n".join(
                        line for line in text.splitlines() if _INSTALL_LINE.search(line)
                    )
                texts.append(text)
    return "\n".join(texts)


def environment_evidence(output: str, task: Task) -> list[str]:
    """Why the task cannot run on this host, from what its scripts printed; [] if no sign."""
    reasons = []
    if line := _first_line(_NETWORK, output):
        reasons.append(f"needs the network ({line})")
    if line := _first_line(_PACKAGES, output):
        reasons.append(f"installs system packages at run time ({line})")
    commands = sorted({a or b for a, b in _MISSING_COMMAND.findall(output)})
    if commands:
        reasons.append(f"needs commands this host lacks: {', '.join(commands)}")
    modules = sorted({m.split(".")[0] for m in _MISSING_MODULE.findall(output)})
    if modules:
        declared = _declared_installs(task)
        # A module the task's own files should have created is the oracle's fault, not ours.
        missing = [m for m in modules if re.search(rf"\b{re.escape(m)}\b", declared)]
        if missing:
            reasons.append(f"needs Python modules this host lacks: {', '.join(missing)}")
    if line := _first_line(_READ_ONLY, output):
        reasons.append(
            f"writes outside /app and /tmp, which are the only writable paths here ({line})"
        )
    return reasons

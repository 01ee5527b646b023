"""The options that several ``stayer`` commands take: one declaration each, one help text.

A command declares a parameter with one of these (``max_steps: MaxStepsOption = …``);
the flag's name, type and help are said here once, and its default where it is declared.
An option one command alone takes is declared in that command (``--json``: common.py).
tests/test_cli_options.py lists the flags that mean something else in some commands.
"""

from __future__ import annotations

from typing import Annotated, Any

import typer

from stayer.choices import POLICY_HELP, kinds_help

# One run: its bounds, its sandbox, its trace (``stayer run``; each trial or sample of
# ``stayer eval`` and ``stayer rollouts``; the command of ``stayer sandbox exec``).
MaxStepsOption = Annotated[int, typer.Option("--max-steps", help="Model calls at most per run.")]
RunMaxCostOption = Annotated[
    str | None, typer.Option("--max-cost", help="Hard cap in USD per run; never overshot.")
]
MaxContextOption = Annotated[
    int | None, typer.Option("--max-context", help="Hard limit on prompt tokens; never exceeded.")
]
TaskSandboxOption = Annotated[
    str | None,
    typer.Option(
        "--sandbox",
        help=f"{kinds_help()}. Default: task.toml's [environment] sandbox, else the task's image where it has a Dockerfile (docker where a daemon answers, else bwrap-image), else bwrap.",
    ),
]
MaxProcessesOption = Annotated[
    int | None,
    typer.Option(
        "--max-processes",
        help="Processes at once per sandboxed command (default: the agent's limit).",
    ),
]
StorageMbOption = Annotated[
    int | None,
    typer.Option(
        "--storage-mb",
        help="What /app and /tmp may hold, MiB (default: the task's, else the agent's).",
    ),
]
OtlpOption = Annotated[
    str | None,
    typer.Option(
        "--otlp",
        help="Export OpenTelemetry spans to this OTLP endpoint (default: OTEL_EXPORTER_OTLP_ENDPOINT).",
    ),
]
RunIdArgument = Annotated[str, typer.Argument(help="Id of the run (see `stayer runs`).")]

# What the agent is given (``stayer run``, ``tools list``); the policies that ``eval`` and
# ``whatif`` compare.
ConfigOption = Annotated[
    str | None,
    typer.Option(
        "--config",
        help="stayer.toml: models by role, cascade, tiers, failover, sub-agents, breakers, "
        "MCP servers.",
    ),
]
McpToolsOption = Annotated[
    str,
    typer.Option(
        "--mcp-tools",
        help="MCP schemas: eager (all in the prompt), lazy (tool_search), auto (cheaper).",
    ),
]
PoliciesOption = Annotated[
    str | None,
    typer.Option(
        "--policy", help=f"Context policy: {POLICY_HELP}; comma-separated to compare several."
    ),
]

# The simulated provider (``sim:`` models of ``run``, ``eval`` and ``rollouts``).
SimPolicyOption = Annotated[
    str | None,
    typer.Option(
        "--sim-policy",
        help="For sim: models: oracle (default) | team | "
        "synthetic:steps=N,obs_tokens=T,out_tokens=U | replay:PATH",
    ),
]
SimLatencyOption = Annotated[
    float, typer.Option("--sim-latency", help="Simulated seconds per model call.")
]

# Many runs, a suite's (``eval``, ``rollouts``, ``tasks check``).
SuiteArgument = Annotated[
    str, typer.Argument(help="Suite directory (Harbor-layout tasks), or one task.")
]
RunsAtOnceOption = Annotated[int, typer.Option("--concurrency", help="Runs at once.")]
RayOption = Annotated[
    str | None,
    typer.Option(
        "--ray",
        metavar="ADDRESS|local",
        help="Run on Ray: 'local' starts a one-machine cluster, else the address of one "
        "(with STAYER_DB).",
    ),
]


# Selecting what a listing shows or a prune removes (``runs``, ``audit``, ``images prune``).
def since_option(what: str) -> Any:
    """``--since DATE``: only ``what`` (runs, calls) from that UTC date on (``parse_since``)."""
    return typer.Option("--since", help=f"Only {what} on or after this UTC date (YYYY-MM-DD).")


def older_than_option(what: str) -> Any:
    """``--older-than DURATION``: ``what`` (say, "Runs not updated") for this long."""
    return typer.Option(
        "--older-than", metavar="DURATION", help=f"{what} for this long (30m, 12h, 7d, 1d12h)."
    )


DryRunOption = Annotated[
    bool, typer.Option("--dry-run", help="Say what would be removed; remove nothing.")
]

# The servers (``stayer serve``, ``worker``, ``gateway``, ``sim serve``): their address,
# /metrics token and webhooks, and the sandbox of runs that come with no task.toml.
HostOption = Annotated[str, typer.Option("--host", help="Address to listen on.")]
FreePortOption = Annotated[
    int, typer.Option("--port", help="Port to listen on (0: a free one).", min=0, max=65535)
]
MetricsTokenOption = Annotated[
    str | None,
    typer.Option(
        "--metrics-token",
        envvar="STAYER_METRICS_TOKEN",
        help="Bearer token of GET /metrics (Prometheus); off without one.",
    ),
]
PrivateWebhooksOption = Annotated[
    bool,
    typer.Option(
        "--allow-private-webhooks", help="Let webhooks target loopback and private addresses."
    ),
]
SandboxOption = Annotated[str, typer.Option("--sandbox", help=f"{kinds_help()}. Default: bwrap.")]

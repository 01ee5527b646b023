"""``stayer sim serve``: the offline provider simulator as an HTTP server that any client
(the official SDKs, Claude Code, Codex, LiteLLM) can point its base URL at."""

from __future__ import annotations

from typing import Annotated

import typer

from stayer.cli.common import bad_input, serve_app, sub_app
from stayer.cli.options import FreePortOption, HostOption
from stayer.errors import ConfigError

sim_app = sub_app("sim", "The offline provider simulator, as a server on the providers' wire APIs.")


@sim_app.command("serve")
def serve(
    host: HostOption = "127.0.0.1",
    port: FreePortOption = 8090,
    policy: Annotated[
        str,
        typer.Option(
            "--policy", help="What the model says: echo | script:FILE (YAML turns) | replay:PATH."
        ),
    ] = "echo",
    latency: Annotated[
        float,
        typer.Option("--latency", help="Seconds before each reply's first byte.", min=0, max=600),
    ] = 0.0,
) -> None:
    """Serve POST /v1/messages (and /count_tokens), /v1/chat/completions and /v1/responses,
    streamed or not, with the simulator's token counts, caching rules and usage fields.

    Example: stayer sim serve --port 8090 --policy script:turns.yaml"""
    try:
        from stayer.simserver.app import SimServer, create_app
    except ImportError as e:
        bad_input(f"stayer sim serve needs the serve extra: pip install 'stayer[serve]' ({e})")
    from stayer.models.sim_policies import parse_policy
    from stayer.tokens import TiktokenCounter

    if policy.partition(":")[0] not in ("echo", "script", "replay"):
        bad_input(f"--policy {policy}: use echo, script:FILE or replay:PATH")
    try:
        behaviour = parse_policy(policy, solution=None, counter=TiktokenCounter())
    except ConfigError as e:
        bad_input(str(e))
    serve_app(
        create_app(SimServer(behaviour, latency_s=latency)),
        host,
        port,
        f"sim serve · policy {policy}",
    )

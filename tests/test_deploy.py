"""deploy/: the container image of ``stayer serve`` / ``stayer worker`` and the compose file
that runs them on PostgreSQL. The image test builds deploy/Dockerfile in a Docker daemon of
its own (the base made locally, as the other image tests do; its pip reaches the package
index) and runs the compose file's own commands: an API, a worker, a task to its reward."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import time
import urllib.request
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
import yaml
from docker_helpers import (  # noqa: F401 - fixtures
    _docker_base_image,
    _dockerd,
    base_root,
    docker_base,
    docker_host,
)
from pg_server import database_fixture

ROOT = Path(__file__).resolve().parent.parent
DEPLOY = ROOT / "deploy"
pg_url = database_fixture()


def _compose() -> dict[str, Any]:
    return yaml.safe_load((DEPLOY / "compose.yaml").read_text())


def _service(name: str) -> dict[str, Any]:
    return _compose()["services"][name]


def _parses(argv: list[str]) -> None:
    """``argv`` (``stayer SUB …``) is a command line the CLI accepts: options and values."""
    import typer

    from stayer.cli import app

    group = typer.main.get_command(app)
    assert argv[0] == "stayer"
    ctx = group.make_context("stayer", [argv[1]], resilient_parsing=True)
    sub = group.get_command(ctx, argv[1])  # type: ignore[attr-defined]
    assert sub is not None, f"compose.yaml: no command stayer {argv[1]}"
    sub.make_context(argv[1], list(argv[2:]), parent=ctx)


def test_the_compose_file_runs_the_image_on_postgresql_with_valid_commands() -> None:
    compose = _compose()
    postgres, api, worker = (compose["services"][n] for n in ("postgres", "api", "worker"))
    for service in (api, worker):
        assert service["build"]["dockerfile"] == "deploy/Dockerfile"
        assert (DEPLOY.parent / service["build"]["dockerfile"]).is_file()
        _parses(service["command"])
        url = service["environment"]["STAYER_DB"]
        env = postgres["environment"]
        user, password, db = env["POSTGRES_USER"], env["POSTGRES_PASSWORD"], env["POSTGRES_DB"]
        assert url == f"postgresql://{user}:{password}@postgres:5432/{db}"
        assert service["depends_on"]["postgres"]["condition"] == "service_healthy"
    assert api["command"][1] == "serve" and "--workers" in api["command"]
    assert api["command"][api["command"].index("--workers") + 1] == "0"  # workers run the runs
    assert worker["command"][1] == "worker"
    assert set(worker["security_opt"]) >= {
        "seccomp=unconfined",
        "apparmor=unconfined",
        "systempaths=unconfined",
    }
    assert "healthcheck" in postgres


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _context(tmp_path: Path) -> Path:
    """What .dockerignore lets into the build context, copied (the repo holds a venv)."""
    ctx = tmp_path / "context"
    (ctx / "deploy").mkdir(parents=True)
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        if (ROOT / name).exists():
            shutil.copy(ROOT / name, ctx / name)
    shutil.copytree(ROOT / "stayer", ctx / "stayer", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(DEPLOY / "Dockerfile", ctx / "deploy" / "Dockerfile")
    # A proxy that re-signs TLS (as pip here is told by PIP_CERT): the Dockerfile's hook.
    if os.environ.get("PIP_CERT") and Path(os.environ["PIP_CERT"]).is_file():
        shutil.copy(os.environ["PIP_CERT"], ctx / "deploy" / "ca.crt")
    return ctx


def _http(method: str, url: str, key: str | None = None, body: Any = None) -> Any:
    req = urllib.request.Request(url, method=method)
    if key:
        req.add_header("Authorization", f"Bearer {key}")
    data = None
    if body is not None:
        req.add_header("content-type", "application/json")
        data = json.dumps(body).encode()
    with urllib.request.urlopen(req, data=data, timeout=30) as r:
        return json.loads(r.read())


def _docker(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["docker", *args], capture_output=True, text=True, check=check)


@pytest.mark.slow
def test_the_image_serves_the_api_and_its_worker_runs_a_task_on_postgresql(
    docker_base: str,  # noqa: F811 - fixture
    pg_url: str,
    tmp_path: Path,
) -> None:
    image = "stayer-deploy-test:latest"
    build = _docker(
        "build", "--network", "host", "-q", "-t", image,
        "-f", str(_context(tmp_path) / "deploy" / "Dockerfile"), str(tmp_path / "context"),
        check=False,
    )  # fmt: skip
    assert build.returncode == 0, build.stdout[-3000:] + build.stderr[-3000:]
    tasks = ROOT / "examples"
    common = ["--network", "host", "-e", f"STAYER_DB={pg_url}", "-v", f"{tasks}:/tasks:ro"]
    tenant = _docker("run", "--rm", *common, image, "stayer", "tenants", "create", "acme", "--json")
    key = json.loads(tenant.stdout)["api_key"]

    port = _free_port()
    api = list(_service("api")["command"])
    api[api.index("--host") + 1] = "127.0.0.1"  # the host's network, not a bridge's
    api[api.index("--port") + 1] = str(port)
    worker = _service("worker")
    security = [a for opt in worker["security_opt"] for a in ("--security-opt", opt)]
    names = [f"stayer-api-{port}", f"stayer-worker-{port}"]
    try:
        _docker("run", "-d", "--name", names[0], *common, image, *api)
        _docker("run", "-d", "--name", names[1], *security, *common, image, *worker["command"])
        base = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 120
        while True:  # the API answers once it is up: a condition, not a timing margin
            try:
                assert _http("GET", f"{base}/healthz")["status"] == "ok"
                break
            except OSError:
                assert time.monotonic() < deadline, _docker("logs", names[0]).stderr[-2000:]
                time.sleep(0.5)
        body = {"task": "hello-file", "model": "sim:claude-sonnet-4-5"}
        run_id = _http("POST", f"{base}/v1/runs", key, body)["id"]
        deadline = time.monotonic() + 300
        while (run := _http("GET", f"{base}/v1/runs/{run_id}", key))["status"] in (
            "queued",
            "running",
        ):
            assert time.monotonic() < deadline, _docker("logs", names[1]).stderr[-2000:]
            time.sleep(0.5)
        logs = _docker("logs", names[1]).stderr[-2000:]
        assert run["status"] == "succeeded", (run, logs)
        assert run["reward"] == 1.0 and run["steps"] >= 1
        ledger = _http("GET", f"{base}/v1/runs/{run_id}/ledger", key)["ledger"]
        assert len(ledger) == run["steps"]
        assert sum(Decimal(e["cost_usd"]) for e in ledger) == Decimal(run["cost_usd"]) > 0
    finally:
        _docker("rm", "-f", *names, check=False)
        _docker("rmi", "-f", image, check=False)

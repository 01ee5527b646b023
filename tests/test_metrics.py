"""Prometheus metrics of a live server against its runs' ledgers; a real Prometheus scraping
it and evaluating the shipped alert rules; promtool's checks and unit tests of the rules."""

from __future__ import annotations

import shutil
import subprocess
import time
import uuid
from collections import defaultdict
from decimal import Decimal
from pathlib import Path

import httpx
import pytest
from service_helpers import HANG_S, Env, copy_tasks, finished, free_port, start_server, wait_for

from stayer.telemetry.metrics import token_counts

parser = pytest.importorskip(
    "prometheus_client.parser", reason="prometheus-client is not installed (dev extra)"
)

ROOT = Path(__file__).resolve().parent.parent
RULES = ROOT / "deploy" / "prometheus"
SIM = "sim:claude-sonnet-4-5"
TOKEN = "metrics-" + uuid.uuid4().hex


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory):  # noqa: ANN201
    """A server with metrics on, and what two tenants' runs put on their ledgers."""
    tasks = copy_tasks(tmp_path_factory.mktemp("tasks"), "hello-file", "fix-median")
    env = Env(tmp_path_factory.mktemp("metrics") / "home")
    server = start_server(env, tasks, "--workers", "2", "--metrics-token", TOKEN)
    runs: list[dict] = []
    for tenant, tasks_run, cap in (
        ("alpha", ["hello-file", "fix-median"], "5"),
        ("beta", ["hello-file"], None),
    ):
        key = env.tenant(tenant, *(["--max-cost", cap] if cap else []))["api_key"]
        with server.client(key) as c:
            ids = [
                c.post("/v1/runs", json={"task": t, "model": SIM}).json()["id"] for t in tasks_run
            ]
            for run_id in ids:
                run = wait_for(c, run_id, finished)
                run["ledger"] = c.get(f"/v1/runs/{run_id}/ledger").json()["ledger"]
                runs.append(run)
    yield server, runs
    server.process.kill()


def scrape(server) -> dict[str, list]:  # noqa: ANN001
    r = httpx.get(server.url + "/metrics", headers={"Authorization": f"Bearer {TOKEN}"}, timeout=60)
    assert r.status_code == 200, r.text
    out: dict[str, list] = defaultdict(list)
    for family in parser.text_string_to_metric_families(r.text):
        for sample in family.samples:
            out[sample.name].append(sample)
    return out


def test_metrics_add_up_to_the_ledgers(served) -> None:
    server, runs = served
    m = scrape(server)
    cost: dict[str, Decimal] = defaultdict(Decimal)
    tokens: dict[tuple[str, str], int] = defaultdict(int)
    for run in runs:
        for e in run["ledger"]:
            cost[run["tenant"]] += Decimal(e["cost_usd"])
            for kind, n in token_counts(e["usage"]).items():
                tokens[(run["tenant"], kind)] += n
    got_cost: dict[str, float] = defaultdict(float)
    for s in m["stayer_cost_usd_total"]:
        got_cost[s.labels["tenant"]] += s.value
        assert set(s.labels) == {"tenant", "model", "task"}  # no run ids on counters
    assert set(got_cost) == set(cost)
    for tenant, total in cost.items():
        assert abs(got_cost[tenant] - float(total)) < 1e-9
    got_tokens: dict[tuple[str, str], float] = defaultdict(float)
    for s in m["stayer_tokens_total"]:
        got_tokens[(s.labels["tenant"], s.labels["kind"])] += s.value
    assert {k: int(v) for k, v in got_tokens.items()} == dict(tokens)
    for s in m["stayer_cache_hit_ratio"]:
        t = s.labels["tenant"]
        prompt = sum(tokens[(t, k)] for k in ("cache_read", "cache_write", "input_uncached"))
        assert (
            abs(s.value - tokens[(t, "cache_read")] / prompt) < 1e-12
        )  # one model per tenant here
    assert {s.labels["tenant"] for s in m["stayer_cache_hit_ratio"]} == set(cost)
    statuses = {(s.labels["tenant"], s.labels["status"]): s.value for s in m["stayer_runs"]}
    assert statuses == {("alpha", "succeeded"): 2, ("beta", "succeeded"): 1}
    budget = {s.labels["tenant"]: s.value for s in m["stayer_tenant_budget_usd"]}
    assert budget == {"alpha": 5.0}  # beta has no cap: no gauge rather than a fake number
    spent = {s.labels["tenant"]: s.value for s in m["stayer_tenant_spent_usd"]}
    assert abs(spent["alpha"] - float(cost["alpha"])) < 1e-9
    left = {s.labels["tenant"]: s.value for s in m["stayer_tenant_budget_remaining_usd"]}
    assert abs(left["alpha"] - (5.0 - float(cost["alpha"]))) < 1e-9
    steps = sum(len(r["ledger"]) for r in runs)
    assert sum(s.value for s in m["stayer_step_cost_usd_count"]) == steps
    assert sum(s.value for s in m["stayer_step_latency_seconds_count"]) == steps


def test_metrics_take_their_own_token(served, tmp_path: Path) -> None:
    server, _ = served
    alpha_key = server.env.tenant("gamma" + uuid.uuid4().hex[:6])["api_key"]
    for headers in (
        {},
        {"Authorization": f"Bearer {alpha_key}"},
        {"Authorization": f"Bearer {TOKEN}x"},
        {"Authorization": TOKEN},
    ):
        assert httpx.get(server.url + "/metrics", headers=headers).status_code == 401
    off = start_server(
        Env(tmp_path / "home"), copy_tasks(tmp_path / "tasks", "hello-file"), "--workers", "0"
    )
    try:
        assert (
            httpx.get(
                off.url + "/metrics", headers={"Authorization": f"Bearer {TOKEN}"}
            ).status_code
            == 404
        )
    finally:
        off.process.kill()


PROMTOOL = shutil.which("promtool")
PROMETHEUS = shutil.which("prometheus")


@pytest.mark.skipif(
    PROMTOOL is None, reason="promtool is not installed (.ci/run installs Debian's prometheus)"
)
def test_alert_rules_check_and_pass_their_unit_tests() -> None:
    assert PROMTOOL is not None
    for args in (["check", "rules", "alerts.yml"], ["test", "rules", "alerts_test.yml"]):
        r = subprocess.run(
            [PROMTOOL, *args], cwd=RULES, capture_output=True, text=True, timeout=120
        )
        assert r.returncode == 0, r.stdout + r.stderr


@pytest.mark.skipif(
    PROMETHEUS is None, reason="prometheus is not installed (.ci/run installs Debian's)"
)
def test_a_real_prometheus_scrapes_the_server_and_evaluates_the_rules(
    served, tmp_path: Path
) -> None:
    assert PROMETHEUS is not None
    server, runs = served
    port = free_port()
    target = server.url.removeprefix("http://")
    shutil.copy(RULES / "alerts.yml", tmp_path / "alerts.yml")
    (tmp_path / "token").write_text(TOKEN)
    (tmp_path / "prometheus.yml").write_text(
        "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
        "rule_files:\n  - alerts.yml\n"
        "scrape_configs:\n  - job_name: stayer\n"
        f"    authorization:\n      credentials_file: {tmp_path / 'token'}\n"
        f"    static_configs:\n      - targets: ['{target}']\n"
    )
    proc = subprocess.Popen(
        [
            PROMETHEUS,
            f"--config.file={tmp_path / 'prometheus.yml'}",
            f"--storage.tsdb.path={tmp_path / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
        ],
        stdout=subprocess.DEVNULL,
        stderr=(tmp_path / "prometheus.log").open("wb"),
    )
    api = f"http://127.0.0.1:{port}/api/v1"
    try:
        deadline = time.monotonic() + HANG_S
        result: list = []
        while not result:
            assert proc.poll() is None, (tmp_path / "prometheus.log").read_text()[-2000:]
            assert time.monotonic() < deadline, "prometheus never scraped the server"
            try:
                r = httpx.get(
                    f"{api}/query",
                    params={"query": "sum by (tenant) (stayer_cost_usd_total)"},
                    timeout=10,
                )
                result = r.json()["data"]["result"] if r.status_code == 200 else []
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        got = {x["metric"]["tenant"]: float(x["value"][1]) for x in result}
        want: dict[str, float] = defaultdict(float)
        for run in runs:
            want[run["tenant"]] += float(run["cost_usd"])
        assert got.keys() == want.keys() and all(abs(got[t] - want[t]) < 1e-9 for t in want)
        # The shipped rules load, and an alert expression evaluates against live data.
        rules = httpx.get(f"{api}/rules", timeout=10).json()["data"]["groups"][0]["rules"]
        assert {r["name"] for r in rules} == {
            "StayerTenantBudgetExhaustedWithinAnHour",
            "StayerCacheHitRatioDrop",
            "StayerStepCostAnomaly",
            "StayerRunWaitingForAPerson",
            "StayerWorkerLeaseLost",
        }
        assert all(r["health"] == "ok" for r in rules)
        budget_rule = next(
            r for r in rules if r["name"] == "StayerTenantBudgetExhaustedWithinAnHour"
        )
        r = httpx.get(f"{api}/query", params={"query": budget_rule["query"]}, timeout=10).json()
        assert (
            r["status"] == "success" and r["data"]["result"] == []
        )  # nothing burns: the runs are done
        remaining = "stayer_tenant_budget_usd - on (tenant) sum by (tenant) (stayer_cost_usd_total)"  # its left side
        r = httpx.get(f"{api}/query", params={"query": remaining}, timeout=10).json()
        left = {x["metric"]["tenant"]: float(x["value"][1]) for x in r["data"]["result"]}
        assert left.keys() == {"alpha"} and abs(left["alpha"] - (5 - want["alpha"])) < 1e-9
    finally:
        proc.terminate()
        proc.wait(timeout=60)


def test_avoidable_cost_prices_only_unchosen_misses() -> None:
    from types import SimpleNamespace

    from stayer.context.forensics import CacheBreak
    from stayer.pricing import PriceBook
    from stayer.telemetry.metrics import MTOK, WorkerMetrics, avoidable_cost
    from stayer.usage import Usage

    prices = PriceBook.load()
    cost = prices.cost(Usage(input_tokens=10), "claude-sonnet-4-5", "anthropic", None)
    previous = SimpleNamespace(context_tokens=50_000)

    def step(reason: str | None, read: int) -> SimpleNamespace:
        return SimpleNamespace(
            model="sim:claude-sonnet-4-5",
            latency_s=0.1,
            compaction=None,
            context_tokens=52_000,
            cache_break=None
            if reason is None
            else CacheBreak(position_tokens=0, reason=reason, detail=""),
            cost=cost,
            usage=Usage(input_tokens=52_000, cache_read_tokens=read),
        )

    rates = prices.rates("claude-sonnet-4-5", "anthropic", None, 52_000)
    assert rates is not None
    want = Decimal(50_000 - 20_000) * (rates.cache_write_5m - rates.cache_read) / MTOK
    assert avoidable_cost(step("ttl_expired", 20_000), previous, prices) == want > 0
    assert avoidable_cost(step("prefix_edit", 20_000), previous, prices) == want
    for chosen in ("compaction", "model_switch", "below_minimum", None):
        assert avoidable_cost(step(chosen, 20_000), previous, prices) is None
    assert avoidable_cost(step("ttl_expired", 20_000), None, prices) is None
    metrics = WorkerMetrics()
    metrics.on_step(step("ttl_expired", 20_000), previous, prices)
    metrics.on_step(step("compaction", 0), previous, prices)
    got = metrics.registry.get_sample_value(
        "stayer_avoidable_cost_usd_total", {"reason": "ttl_expired"}
    )
    assert got is not None and abs(got - float(want)) < 1e-12
    assert (
        metrics.registry.get_sample_value(
            "stayer_avoidable_cost_usd_total", {"reason": "compaction"}
        )
        is None
    )


def test_the_cost_anomaly_alert_uses_the_in_process_breakers_factor() -> None:
    """One definition: the alert's factor is the breaker's default (``anomaly_factor``)."""
    import re

    import yaml

    from stayer.guard.breakers import GuardConfig

    rules = yaml.safe_load((ROOT / "deploy" / "prometheus" / "alerts.yml").read_text())
    [rule] = [
        r for g in rules["groups"] for r in g["rules"] if r.get("alert") == "StayerStepCostAnomaly"
    ]
    factor = re.search(r">\s*([\d.]+)\s*\*\s*histogram_quantile\(0\.5", rule["expr"])
    assert factor is not None, rule["expr"]
    assert float(factor.group(1)) == GuardConfig().anomaly_factor

"""``stayer gateway`` beside LiteLLM proxy, both in front of one ``stayer sim serve``.

    python bench/gateway.py [--quick] [--latency 0.05] [--json]

One simulator (``--latency`` seconds before each reply's first byte) on loopback; three
setups call it, interleaved round by round so that the machine's noise hits all alike:
``direct`` (the sim itself), ``stayer`` (``stayer gateway``, a tenant key, a session per
phase) and ``litellm`` (LiteLLM proxy 1.110.2, model ``claude-sonnet-4-5`` with
``api_base`` = the sim; it is not a stayer dependency: install it yourself, see
docs/gateway-bench.md). All calls are Anthropic ``POST /v1/messages``. Figures:

* added latency p50/p99 over direct (non-streamed), first-body-byte overhead (streamed);
* requests/s at 1, 4, 16, 64 concurrent clients; the proxy process's CPU s per request
  (``/proc/PID/stat``, the process and its children);
* overshoot over a $ cap with 100 concurrent calls (stayer: ``x-stayer-max-cost``;
  LiteLLM: its budget, see ``litellm_budget``), priced exactly from the usage the sim
  reported in each answered call;
* cost error on cached streamed calls (a ``cache_control`` system prompt over 1,024
  tokens, several turns): each side's recorded cost (stayer's session ledger, LiteLLM's
  logged ``response_cost``) against ``stayer.pricing.PriceBook`` on the sim's usage.

With ``--json`` stdout is one JSON document; progress goes to stderr. Every process the
bench starts is stopped at its end.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from decimal import Decimal
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from _stdout import json_only  # noqa: E402  (bench/: --json prints one document)

from stayer.metering.usage import StreamReader, read_body  # noqa: E402
from stayer.pricing import PriceBook  # noqa: E402
from stayer.usage import Usage  # noqa: E402

MODEL = "claude-sonnet-4-5"
SYSTEM = "Answer exactly and briefly; cite the line you rely on. " * 200  # ~2,200 tokens
LEVELS = (1, 4, 16, 64)
TICK = 1.0 / os.sysconf("SC_CLK_TCK")  # utime + stime are in clock ticks
LITELLM_CALLBACK = '''
import json, os
from litellm.integrations.custom_logger import CustomLogger

class Recorder(CustomLogger):
    """Writes the cost LiteLLM records for each call (what its spend log would hold)."""

    async def async_log_success_event(self, kwargs, response_obj, start_time, end_time):
        slo = kwargs.get("standard_logging_object") or {}
        with open(os.environ["BENCH_LITELLM_LOG"], "a") as f:
            f.write(json.dumps({"id": slo.get("id"), "cost": slo.get("response_cost")}) + "\\n")

recorder = Recorder()
'''


def say(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def ms(x: float | None) -> float | None:
    return None if x is None else round(x * 1000, 3)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def cpu_s(pid: int) -> float:
    """utime + stime of ``pid`` and its live descendants, in seconds."""
    parents: dict[int, int] = {}
    times: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        parents[int(entry)] = int(fields[1])
        times[int(entry)] = int(fields[11]) + int(fields[12])
    mine, todo = set(), [pid]
    while todo:
        p = todo.pop()
        mine.add(p)
        todo += [c for c, pp in parents.items() if pp == p and c not in mine]
    return sum(times.get(p, 0) for p in mine) * TICK


class Procs:
    """The processes the bench starts; each one stopped (its process group) at the end."""

    def __init__(self, work: Path, env: dict[str, str]) -> None:
        self.work, self.env, self.procs = work, env, []  # type: list[subprocess.Popen[Any]]

    def stayer(self, name: str, *argv: str, env: dict[str, str] | None = None) -> tuple[int, str]:
        proc = subprocess.Popen(
            [sys.executable, "-m", "stayer.cli", *argv],
            stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True,
            env={**(env or self.env), "COLUMNS": "300"}, start_new_session=True,
        )  # fmt: skip
        self.procs.append(proc)
        assert proc.stderr is not None
        line = proc.stderr.readline()
        if " on http://" not in line:
            raise SystemExit(f"{name} did not start: {line}{proc.stderr.read()}")
        log = (self.work / f"{name}.log").open("w")
        threading.Thread(target=lambda: shutil.copyfileobj(proc.stderr, log), daemon=True).start()  # type: ignore[arg-type]
        return proc.pid, line.split(" on ", 1)[1].split()[0]

    def litellm(self, name: str, sim: str, budget: Decimal | None) -> tuple[int, str]:
        exe = shutil.which("litellm", path=str(Path(sys.executable).parent))
        if exe is None:
            raise FileNotFoundError("litellm")
        where = self.work / name
        where.mkdir()
        (where / "bench_litellm_cb.py").write_text(LITELLM_CALLBACK)
        settings: dict[str, Any] = {"callbacks": "bench_litellm_cb.recorder"}
        params = {"model": f"anthropic/{MODEL}", "api_base": sim, "api_key": "sk-dummy"}
        if budget is not None:  # both budgets that need no database: proxy-wide, deployment
            settings["max_budget"] = float(budget)
            params |= {"max_budget": float(budget), "budget_duration": "1d"}
        config = {
            "model_list": [{"model_name": MODEL, "litellm_params": params}],
            "litellm_settings": settings,
        }
        (where / "config.yaml").write_text(json.dumps(config))  # JSON is YAML
        port = free_port()
        env = {
            **self.env,
            "LITELLM_MASTER_KEY": "sk-bench-master",
            "LITELLM_LOCAL_MODEL_COST_MAP": "True",
            "LITELLM_TELEMETRY": "False",
            "BENCH_LITELLM_LOG": str(where / "costs.jsonl"),
            "PYTHONPATH": str(where),
        }
        env.pop("DATABASE_URL", None)
        log = (where / "litellm.log").open("w")
        proc = subprocess.Popen(
            [exe, "--config", str(where / "config.yaml"), "--host", "127.0.0.1",
             "--port", str(port), "--num_workers", "1"],
            cwd=where, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
        self.procs.append(proc)
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 180
        while True:
            try:
                if httpx.get(url + "/health/liveliness", timeout=2).status_code == 200:
                    return proc.pid, url
            except httpx.HTTPError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                tail = (where / "litellm.log").read_text(errors="replace")[-2000:]
                raise SystemExit(
                    f"{name} did not start (LiteLLM proxy 1.110.2 installed as "
                    f"docs/gateway-bench.md says?):\n{tail}"
                )
            time.sleep(0.5)

    def stop(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in self.procs:
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


class Setup:
    def __init__(self, name: str, url: str, headers: dict[str, str], pid: int | None) -> None:
        self.name, self.url, self.headers, self.pid = name, url + "/v1/messages", headers, pid

    def with_session(self, session: str) -> dict[str, str]:
        return (
            dict(self.headers, **{"x-stayer-session": session})
            if self.name == "stayer"
            else self.headers
        )


def body(text: str, *, stream: bool = False, max_tokens: int = 64) -> dict[str, Any]:
    return {
        "model": MODEL, "max_tokens": max_tokens, "stream": stream,
        "messages": [{"role": "user", "content": text}],
    }  # fmt: skip


def latency_phase(setups: list[Setup], rounds: int, n: int) -> dict[str, dict[str, Any]]:
    """Per round and setup (order rotated each round), ``n`` sequential non-streamed calls
    (whole response) and ``n`` streamed (first body byte), on one kept-alive connection."""
    plain: dict[str, list[list[float]]] = {s.name: [] for s in setups}
    first: dict[str, list[list[float]]] = {s.name: [] for s in setups}
    clients = {s.name: httpx.Client(timeout=60) for s in setups}
    try:
        for r in range(rounds):
            order = setups[r % len(setups) :] + setups[: r % len(setups)]
            for s in order:
                c, h = clients[s.name], s.with_session(f"bench-latency-{r}")
                got_plain, got_first = [], []
                for i in range(n):
                    t0 = time.perf_counter()
                    resp = c.post(s.url, json=body(f"r{r} {i} plain"), headers=h)
                    got_plain.append(time.perf_counter() - t0)
                    assert resp.status_code == 200, (s.name, resp.text)
                    t0 = time.perf_counter()
                    with c.stream(
                        "POST", s.url, json=body(f"r{r} {i} stream", stream=True), headers=h
                    ) as resp:
                        assert resp.status_code == 200, (s.name, resp.read())
                        chunks = resp.iter_raw()
                        next(chunks)
                        got_first.append(time.perf_counter() - t0)
                        for _ in chunks:
                            pass
                plain[s.name].append(got_plain)
                first[s.name].append(got_first)
            say(f"latency round {r + 1}/{rounds} done")
    finally:
        for c in clients.values():
            c.close()
    out: dict[str, dict[str, Any]] = {}
    flat = {k: [x for rnd in v for x in rnd] for k, v in plain.items()}
    flat_first = {k: [x for rnd in v for x in rnd] for k, v in first.items()}
    for s in setups:
        row: dict[str, Any] = {
            "p50_ms": ms(pct(flat[s.name], 0.5)),
            "p99_ms": ms(pct(flat[s.name], 0.99)),
            "ttfb_p50_ms": ms(pct(flat_first[s.name], 0.5)),
        }
        if s.name != "direct":
            # paired per round: this round's p50 minus direct's p50 in the same round
            added = [
                statistics.median(a) - statistics.median(d)
                for a, d in zip(plain[s.name], plain["direct"], strict=True)
            ]
            ttfb = [
                statistics.median(a) - statistics.median(d)
                for a, d in zip(first[s.name], first["direct"], strict=True)
            ]
            row |= {
                "added_p50_ms": ms(pct(flat[s.name], 0.5) - pct(flat["direct"], 0.5)),
                "added_p99_ms": ms(pct(flat[s.name], 0.99) - pct(flat["direct"], 0.99)),
                "added_p50_per_round_ms": {"min": ms(min(added)), "median": ms(statistics.median(added))},
                "ttfb_overhead_p50_ms": ms(
                    pct(flat_first[s.name], 0.5) - pct(flat_first["direct"], 0.5)
                ),
                "ttfb_overhead_per_round_ms": {"min": ms(min(ttfb)), "median": ms(statistics.median(ttfb))},
            }  # fmt: skip
        out[s.name] = row
    return out


async def _burst(s: Setup, concurrency: int, seconds: float, tag: str) -> int:
    done = 0
    stop = time.perf_counter() + seconds
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(timeout=60, limits=limits) as client:

        async def worker(w: int) -> None:
            nonlocal done
            i = 0
            while time.perf_counter() < stop:
                resp = await client.post(
                    s.url, json=body(f"{tag} {w} {i}"), headers=s.with_session(f"bench-{tag}")
                )
                assert resp.status_code == 200, (s.name, resp.text)
                done += 1
                i += 1

        await asyncio.gather(*(worker(w) for w in range(concurrency)))
    return done


def throughput_phase(
    setups: list[Setup], rounds: int, seconds: float
) -> tuple[dict[str, dict[str, Any]], dict[str, float | None]]:
    rps: dict[str, dict[int, list[float]]] = {s.name: {c: [] for c in LEVELS} for s in setups}
    cpu = {s.name: 0.0 for s in setups}
    calls = {s.name: 0 for s in setups}
    for r in range(rounds):
        for c in LEVELS:
            order = setups[(r + c) % len(setups) :] + setups[: (r + c) % len(setups)]
            for s in order:
                before = cpu_s(s.pid) if s.pid else 0.0
                t0 = time.perf_counter()
                n = asyncio.run(_burst(s, c, seconds, f"tp-{r}-{c}"))
                elapsed = time.perf_counter() - t0
                if s.pid:
                    cpu[s.name] += cpu_s(s.pid) - before
                calls[s.name] += n
                rps[s.name][c].append(n / elapsed)
            say(f"throughput round {r + 1}/{rounds}, {c} clients done")
    table = {
        s.name: {
            str(c): {"median": round(statistics.median(v), 1), "max": round(max(v), 1)}
            for c, v in rps[s.name].items()
        }
        for s in setups
    }
    per_call = {s.name: (ms(cpu[s.name] / calls[s.name]) if s.pid else None) for s in setups}
    return table, per_call


def price(book: PriceBook, usage: Usage | None) -> Decimal:
    assert usage is not None
    cost = book.cost(usage, MODEL, "anthropic")
    assert cost.total is not None
    return cost.total


async def _hundred(s: Setup, headers: dict[str, str], tag: str) -> list[httpx.Response]:
    limits = httpx.Limits(max_connections=100, max_keepalive_connections=100)
    async with httpx.AsyncClient(timeout=120, limits=limits) as client:
        return await asyncio.gather(
            *(
                client.post(
                    s.url,
                    json={
                        **body(f"{tag} call {i} " + "word " * 400, max_tokens=300),
                        "system": SYSTEM,
                    },
                    headers=headers,
                )
                for i in range(100)
            )
        )


def overshoot(s: Setup, cap: Decimal, book: PriceBook) -> dict[str, Any]:
    headers = dict(s.headers)
    if s.name == "stayer":
        headers |= {"x-stayer-session": "bench-cap", "x-stayer-max-cost": str(cap)}
    responses = asyncio.run(_hundred(s, headers, s.name))
    answered = [r for r in responses if r.status_code == 200]
    statuses: dict[str, int] = {}
    for r in responses:
        statuses[str(r.status_code)] = statuses.get(str(r.status_code), 0) + 1
    spent = sum((price(book, read_body("anthropic", r.json()).usage) for r in answered), Decimal(0))
    return {
        "cap_usd": str(cap),
        "statuses": statuses,
        "spent_usd": str(spent),
        "overshoot_usd": str(max(Decimal(0), spent - cap)),
    }


def cached_turns(s: Setup, turns: int, nonce: str) -> list[tuple[str, Usage]]:
    """A conversation of streamed turns on a cached system prompt: (message id, usage)."""
    system = [
        {"type": "text", "text": f"[{nonce}] " + SYSTEM, "cache_control": {"type": "ephemeral"}}
    ]
    messages: list[dict[str, Any]] = []
    out = []
    headers = s.with_session(f"bench-cache-{nonce}")
    with httpx.Client(timeout=60) as client:
        for t in range(turns):
            messages.append({"role": "user", "content": f"turn {t}: go on"})
            req = {**body("", stream=True, max_tokens=200), "system": system, "messages": messages}
            reader = StreamReader("anthropic")
            raw = b""
            with client.stream("POST", s.url, json=req, headers=headers) as resp:
                assert resp.status_code == 200, (s.name, resp.read())
                for chunk in resp.iter_raw():
                    reader.feed(chunk)
                    raw += chunk
            reading = reader.close()
            events = [json.loads(x[5:]) for x in raw.splitlines() if x.startswith(b"data:")]
            starts = [e["message"]["id"] for e in events if e.get("type") == "message_start"]
            if not starts or reading.usage is None:
                raise SystemExit(f"{s.name}: turn {t} streamed no message: {raw[:600]!r}")
            rid = starts[0]
            text = "".join(
                e["delta"].get("text", "") for e in events if e.get("type") == "content_block_delta"
            )
            messages.append({"role": "assistant", "content": text or "ok"})
            out.append((rid, reading.usage))
    return out


def recorded_costs(
    s: Setup, env: dict[str, str], work: Path, nonce: str, ids: list[str]
) -> list[Decimal | None]:
    deadline = time.monotonic() + 60
    while True:
        if s.name == "stayer":
            done = subprocess.run(
                [sys.executable, "-m", "stayer.cli", "report", f"bench-cache-{nonce}", "--json"],
                capture_output=True, text=True, env=env, timeout=120,
            )  # fmt: skip
            if done.returncode == 0:
                ledger = json.loads(done.stdout)["ledger"]
                if len(ledger) >= len(ids):
                    return [Decimal(e["cost_usd"]) if e["cost_usd"] else None for e in ledger]
        else:
            log = work / "litellm" / "costs.jsonl"
            rows = [json.loads(x) for x in log.read_text().splitlines()] if log.exists() else []
            by_id = {r["id"]: r["cost"] for r in rows}
            if all(i in by_id for i in ids):
                return [None if by_id[i] is None else Decimal(repr(by_id[i])) for i in ids]
        if time.monotonic() > deadline:
            raise SystemExit(f"{s.name}: its recorded costs did not appear")
        time.sleep(0.3)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="fewer rounds (about 2 minutes)")
    ap.add_argument("--latency", type=float, default=0.05, help="the sim's seconds per reply")
    ap.add_argument("--cap", default="0.05", help="the $ cap of the overshoot test")
    ap.add_argument("--no-litellm", action="store_true", help="leave LiteLLM out")
    ap.add_argument(
        "--workdir", default=None, help="where STAYER_HOME and logs go (default: the temp dir)"
    )
    ap.add_argument(
        "--postgres", default="", help="stayer's journal in this empty PostgreSQL database"
    )
    ap.add_argument("--json", action="store_true", help="print one JSON document on stdout")
    args = ap.parse_args()
    emit = json_only(args.json)
    rounds, n, tp_rounds, tp_s, turns = (3, 12, 1, 1.0, 3) if args.quick else (8, 25, 3, 3.0, 5)

    work = Path(tempfile.mkdtemp(prefix="stayer-bench-gateway-", dir=args.workdir))
    env = {k: v for k, v in os.environ.items() if not k.endswith("_API_KEY") and k != "STAYER_DB"}
    env |= {"STAYER_HOME": str(work / "home"), "PYTHONPATH": str(ROOT)}
    if args.postgres:
        env["STAYER_DB"] = args.postgres
    procs = Procs(work, env)
    book = PriceBook.load()
    result: dict[str, Any] = {
        "sim_latency_s": args.latency,
        "stayer_journal": "postgresql" if args.postgres else "sqlite",
        "load_before": list(os.getloadavg()),
        "cpus": os.cpu_count(),
    }
    try:
        made = subprocess.run(
            [sys.executable, "-m", "stayer.cli", "tenants", "create", "bench", "--max-cost",
             "100000", "--json"],
            capture_output=True, text=True, env=env, check=True,
        )  # fmt: skip
        key = json.loads(made.stdout)["api_key"]
        sim_pid, sim = procs.stayer(
            "sim", "sim", "serve", "--port", "0", "--latency", str(args.latency)
        )
        gw_pid, gw = procs.stayer(
            "gateway", "gateway", "--port", "0", "--upstream", f"anthropic={sim}",
            env={**env, "ANTHROPIC_API_KEY": "sk-upstream-dummy"},
        )  # fmt: skip
        anthropic_headers = {"anthropic-version": "2023-06-01"}
        setups = [
            Setup("direct", sim, anthropic_headers | {"x-api-key": "sk-dummy"}, None),
            Setup("stayer", gw, anthropic_headers | {"x-api-key": key}, gw_pid),
        ]
        litellm_note = (
            "no database: litellm_settings.max_budget (proxy-wide; LiteLLM warns it is not "
            "enforced without one) and the deployment's litellm_params max_budget + "
            "budget_duration (the router's in-memory budget limiter, which does refuse). "
            "LiteLLM's PostgreSQL layer needs `prisma generate`, which downloads engines "
            "from binaries.prisma.sh: not possible offline, so the per-key/user/team budgets "
            "of virtual keys (which need the database) could not run"
        )
        if not args.no_litellm:
            try:
                ll_pid, ll = procs.litellm("litellm", sim, Decimal("1000000"))
                setups.append(
                    Setup("litellm", ll, anthropic_headers | {"authorization": "Bearer sk-bench-master"}, ll_pid)
                )  # fmt: skip
                result["litellm_version"] = _version("litellm")
                result["litellm_budget"] = litellm_note
            except FileNotFoundError:
                say("litellm is not installed; see docs/gateway-bench.md (left out)")
                result["litellm"] = "not installed (left out)"
        say(f"up: sim {sim}, " + ", ".join(f"{s.name} {s.url}" for s in setups[1:]))
        for s in setups:  # warm-up: connections, imports, first-call paths
            with httpx.Client(timeout=60) as c:
                for i in range(5):
                    c.post(s.url, json=body(f"warm {i}"), headers=s.with_session("bench-warm"))

        lat = latency_phase(setups, rounds, n)
        tp, cpu = throughput_phase(setups, tp_rounds, tp_s)
        say("overshoot: 100 concurrent calls against a cap")
        cap = Decimal(args.cap)
        over = {s.name: overshoot(s, cap, book) for s in setups if s.name == "stayer"}
        if any(s.name == "litellm" for s in setups):
            capped_pid, capped = procs.litellm("litellm-capped", sim, cap)
            capped_setup = Setup("litellm", capped, setups[-1].headers, capped_pid)
            over["litellm"] = overshoot(capped_setup, cap, book)
        say("cost error: cached streamed turns")
        costs: dict[str, Any] = {}
        for s in setups:
            if s.name == "direct":
                continue
            nonce = f"{s.name}-{time.time_ns()}"
            calls = cached_turns(s, turns, nonce)
            exact = [price(book, u) for _, u in calls]
            got = recorded_costs(s, env, work, nonce, [i for i, _ in calls])
            errors = [None if g is None else g - e for g, e in zip(got, exact, strict=True)]
            costs[s.name] = {
                "turns": len(calls),
                "cache_read_tokens": sum(u.cache_read_tokens for _, u in calls),
                "cache_write_tokens": sum(u.cache_write_tokens for _, u in calls),
                "exact_usd": str(sum(exact, Decimal(0))),
                "recorded_usd": None if None in got else str(sum(got, Decimal(0))),  # type: ignore[arg-type]
                "abs_error_usd": None
                if None in errors
                else str(sum((abs(e) for e in errors), Decimal(0))),  # type: ignore[arg-type]
                "per_turn_error_usd": [None if e is None else str(e) for e in errors],
            }
        result["load_after"] = list(os.getloadavg())
        result["setups"] = {
            s.name: {
                **lat[s.name],
                "rps": tp[s.name],
                "proxy_cpu_ms_per_request": cpu[s.name],
                **({"overshoot": over[s.name]} if s.name in over else {}),
                **({"cost": costs[s.name]} if s.name in costs else {}),
            }
            for s in setups
        }
    finally:
        procs.stop()
        shutil.rmtree(work, ignore_errors=True)
    if args.json:
        emit(result)
    else:
        for name, row in result["setups"].items():
            print(name, json.dumps(row))


def _version(dist: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(dist)
    except PackageNotFoundError:
        return None


if __name__ == "__main__":
    main()

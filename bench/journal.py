"""Journal size and per-step journaling time, beside LangGraph's SqliteSaver.

    python bench/journal.py [--steps 200] [--obs-tokens 20000] [--repeat 3] [--store URL]
                            [--langgraph-python PATH] [--json]

One workload, recorded twice in one run: ``--steps`` agent steps, each an assistant reply
(~200 tokens, one tool call) and a tool observation of ``--obs-tokens`` tokens of
log-like text, every observation different.

* stayer: the real agent loop (``stayer.agent.Agent``, context policy ``none`` so the
  whole history stays in context) with a model and a tool that answer at once, journaled
  by ``RunJournal`` into the default SQLite store (WAL, synchronous=FULL, blob files
  fsynced) with a workspace snapshot per step. Journaling time is what ``RunJournal``
  spends itself (hashing, encoding, writing, snapshots), measured inside it; the wall-time
  difference against the same loop unjournaled is printed beside it. ``--store`` puts it
  in a PostgreSQL database instead (``bench/serve.py`` uses this to time the journal
  while workers share that database).
* LangGraph: a ``StateGraph(MessagesState)`` with one node that appends the same step's two
  messages, checkpointed by ``SqliteSaver`` (WAL, SQLite's default synchronous=FULL) in a
  separate virtual environment (created on first use with ``langgraph`` and
  ``langgraph-checkpoint-sqlite``). One checkpoint per step is the least LangGraph writes
  for this history (a ReAct graph with separate model and tool nodes writes two), so the
  ratios are conservative. Journaling time is the time spent inside the saver's ``put`` and
  ``put_writes`` (serialisation included).

Sizes are the files on disk after a WAL checkpoint (database + blob and snapshot files).
Each side runs ``--repeat`` times and its fastest run counts (other processes on the
machine only ever add time). Target (issue 5): at least 10× smaller and 10× faster per
step than SqliteSaver.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _stdout import json_only  # bench/: --json prints one document on stdout

ROOT = Path(__file__).resolve().parent.parent
_VOCAB = [
    "INFO",
    "DEBUG",
    "WARN",
    "ok",
    "retry",
    "queued",
    "done",
    "cache",
    "miss",
    "hit",
    "shard",
    "flush",
]


# --- the workload (stayer's environment: needs tiktoken) ---------------------------------


def observation(step: int, tokens: int, count) -> str:  # noqa: ANN001
    """About ``tokens`` tokens of log lines with ids, timings and counters: text that
    compresses like real tool output rather than like repeated filler."""
    rng = random.Random(step)
    lines, total = [], 0
    while total < tokens:
        line = (
            f"2025-06-{1 + step % 28:02d}T{rng.randrange(24):02d}:{rng.randrange(60):02d}:{rng.randrange(60):02d}."
            f"{rng.randrange(1000):03d}Z worker-{rng.randrange(64):02d} {rng.choice(_VOCAB)} job={rng.getrandbits(40):010x} "
            f"step={step} records={rng.randrange(100_000)} took={rng.random() * 900:.1f}ms {rng.choice(_VOCAB)}"
        )
        lines.append(line)
        total += count(line + "\n")
    return "\n".join(lines)


def workload(steps: int, obs_tokens: int) -> list[dict]:
    from stayer.tokens import TiktokenCounter

    counter = TiktokenCounter()
    out = []
    for step in range(1, steps + 1):
        rng = random.Random(-step)
        reply = " ".join(
            rng.choice(_VOCAB + ["the", "log", "shows", "next", "check"]) for _ in range(190)
        )
        out.append(
            {
                "assistant": f"Step {step}: {reply}",
                "call_id": f"call_{step}",
                "args": {"step": step},
                "observation": observation(step, obs_tokens, counter.count),
            }
        )
    return out


# --- stayer -----------------------------------------------------------------------------


def measure_stayer(data: list[dict], where: Path, store_url: str = "") -> dict:
    """stayer's journal over ``data``: in SQLite under ``where``, or in the store
    ``store_url`` names (PostgreSQL: ``bytes`` is then None, the database is shared)."""
    import asyncio
    import uuid

    from stayer.agent import Agent, AgentSettings, Limits
    from stayer.context.policies import make_policy
    from stayer.guard.breakers import TreeFingerprint
    from stayer.journal import (
        JournaledModel,
        JournaledProbe,
        JournaledTool,
        ReplayingSandbox,
        RunJournal,
        open_store,
    )
    from stayer.models.base import Message, ModelRequest, ModelResponse, ToolCall, ToolSpec
    from stayer.pricing import PriceBook
    from stayer.run import Journaling
    from stayer.sandbox.base import ExecResult
    from stayer.tokens import MessageCounter, TiktokenCounter
    from stayer.tools.base import ToolContext, ToolResult
    from stayer.tools.submit import SubmitTool
    from stayer.usage import Usage

    class ScriptedModel:
        spec, provider, model_id = "bench:claude-sonnet-4-5", "anthropic", "claude-sonnet-4-5"

        async def complete(self, request: ModelRequest) -> ModelResponse:
            step = sum(1 for m in request.messages if m.role == "assistant")
            if step == len(data):  # the work is done
                msg = Message(
                    "assistant",
                    "Done.",
                    (ToolCall("end", "submit", json.dumps({"summary": "done"})),),
                )
                return ModelResponse(
                    msg,
                    Usage(input_tokens=20_000 * (step + 1), output_tokens=10),
                    {},
                    self.model_id,
                    0.0,
                )
            d = data[step]
            msg = Message(
                "assistant",
                d["assistant"],
                (ToolCall(d["call_id"], "observe", json.dumps(d["args"])),),
            )
            usage = Usage(
                input_tokens=20_000 * (step + 1), cache_read_tokens=20_000 * step, output_tokens=200
            )
            return ModelResponse(msg, usage, {}, self.model_id, 0.0)

    class ScriptedTool:
        spec = ToolSpec(
            "observe",
            "Return an observation.",
            {
                "type": "object",
                "properties": {"step": {"type": "integer"}},
                "required": ["step"],
            },
        )

        async def __call__(self, args: dict, ctx: ToolContext) -> ToolResult:
            # The work changes the workspace a little every step, so snapshots have work.
            with open(Path(ctx.workspace) / "work.log", "a") as f:
                f.write(f"step {args['step']} observed\n")
            return ToolResult(data[args["step"] - 1]["observation"])

    class NoSandbox:
        async def exec(self, command: str, **kw: object) -> ExecResult:
            return ExecResult(0, "", "")

    prices = PriceBook.load()
    steps = len(data)

    async def run(journaled: bool) -> tuple[float, object]:
        counter = MessageCounter(TiktokenCounter())
        home = where / ("journaled" if journaled else "plain")
        workspace = home / "workspace"
        workspace.mkdir(parents=True)
        (workspace / "README.md").write_text("bench workspace\n")
        model, tools, sandbox = ScriptedModel(), [ScriptedTool(), SubmitTool()], NoSandbox()
        journal = probe = None
        if journaled:
            store = open_store(home, store_url)
            assert store is not None
            header = {"task": "bench", "model": model.spec, "config": {}}
            run_id = f"bench-{uuid.uuid4().hex[:12]}"  # a shared store holds many
            journal = RunJournal.create(store, run_id, header, workspace, prices)
            journal.take_snapshot(0)
            model, tools = (
                JournaledModel(model, journal),
                [JournaledTool(t, journal) for t in tools],
            )
            sandbox = ReplayingSandbox(sandbox, journal)
            probe = JournaledProbe(TreeFingerprint(workspace), journal)
        agent = Agent(
            model,
            tools,
            ToolContext(sandbox=sandbox, workspace=str(workspace)),
            AgentSettings(
                prices,
                counter,  # type: ignore[arg-type]
                Limits(max_steps=2 * steps),
                policy=make_policy("none"),
                probe=probe,
            ),
            [] if journal is None else [Journaling(journal)],
        )
        t0 = time.perf_counter()
        result = await agent.run("Benchmark task.", "bench")
        if result.steps != steps + 1:
            raise SystemExit(
                f"the loop stopped after {result.steps} steps: {result.stop_reason} {result.error or ''}"
            )
        if journal is not None:
            journal.finish(
                {"status": "failed", "steps": result.steps, "cost_usd": str(result.cost_usd)}
            )
        return time.perf_counter() - t0, journal

    plain_s, _ = asyncio.run(run(False))
    journaled_s, journal = asyncio.run(run(True))
    assert journal is not None
    store = journal.store
    on_disk = None
    if not store_url:
        store.conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")  # type: ignore[attr-defined]
        home = where / "journaled"
        files = [
            home / "stayer.db",
            home / "stayer.db-wal",
            *(home / "blobs").rglob("*"),
            *(home / "snapshots").rglob("*"),
        ]
        on_disk = sum(p.stat().st_size for p in files if p.is_file())
    store.close()
    return {
        "bytes": on_disk,
        "journal_s_per_step": journal.stats.seconds / steps,
        "ab_s_per_step": (journaled_s - plain_s) / steps,
        "events": journal.stats.events,
        "writes": journal.stats.writes,
        "wall_s": journaled_s,
    }


# --- LangGraph (its own environment: no stayer imports) -----------------------------------


def langgraph_worker(data_path: str, db_path: str, out_path: str) -> None:
    import sqlite3
    from importlib.metadata import version

    from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
    from langgraph.checkpoint.sqlite import SqliteSaver
    from langgraph.graph import END, START, MessagesState, StateGraph

    data = json.loads(Path(data_path).read_text())
    spent = {"put": 0.0, "put_writes": 0.0, "checkpoints": 0}

    def timed(name, method):  # noqa: ANN001, ANN202
        def wrapper(self, *a, **kw):  # noqa: ANN001, ANN002, ANN003, ANN202
            t = time.perf_counter()
            try:
                return method(self, *a, **kw)
            finally:
                spent[name] += time.perf_counter() - t
                spent["checkpoints"] += name == "put"

        return wrapper

    # Everything a checkpoint costs the graph happens in these two (serialising included).
    TimedSaver = type(
        "TimedSaver",
        (SqliteSaver,),
        {  # noqa: N806
            "put": timed("put", SqliteSaver.put),
            "put_writes": timed("put_writes", SqliteSaver.put_writes),
        },
    )

    # No annotations: LangGraph reads them at runtime, and this module's are strings.
    def step(state):  # noqa: ANN001, ANN202
        i = sum(1 for m in state["messages"] if isinstance(m, AIMessage))
        d = data[i]
        call = {"id": d["call_id"], "name": "observe", "args": d["args"]}
        return {
            "messages": [
                AIMessage(content=d["assistant"], tool_calls=[call]),
                ToolMessage(content=d["observation"], tool_call_id=d["call_id"]),
            ]
        }

    def route(state):  # noqa: ANN001, ANN202
        return (
            END
            if sum(1 for m in state["messages"] if isinstance(m, AIMessage)) >= len(data)
            else "step"
        )

    conn = sqlite3.connect(db_path, check_same_thread=False)
    saver = TimedSaver(conn)
    graph = StateGraph(MessagesState).add_node("step", step).add_edge(START, "step")
    graph = graph.add_conditional_edges("step", route).compile(checkpointer=saver)
    t0 = time.perf_counter()
    graph.invoke(
        {"messages": [HumanMessage("Benchmark task.")]},
        {"configurable": {"thread_id": "bench"}, "recursion_limit": len(data) + 10},
    )
    wall = time.perf_counter() - t0
    synchronous = conn.execute("PRAGMA synchronous").fetchone()[0]
    journal_mode = conn.execute("PRAGMA journal_mode").fetchone()[0]
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    conn.close()
    size = sum(os.path.getsize(p) for p in (db_path, db_path + "-wal") if os.path.exists(p))
    Path(out_path).write_text(
        json.dumps(
            {
                "bytes": size,
                "journal_s_per_step": (spent["put"] + spent["put_writes"]) / len(data),
                "checkpoints": spent["checkpoints"],
                "wall_s": wall,
                "synchronous": synchronous,
                "journal_mode": journal_mode,
                "versions": {
                    p: version(p)
                    for p in ("langgraph", "langgraph-checkpoint-sqlite", "langgraph-checkpoint")
                },
            }
        )
    )


def langgraph_python(explicit: str | None) -> tuple[str | None, str]:
    """A Python with LangGraph, creating the benchmark's own venv if needed; (None, why)."""
    if explicit:
        return explicit, ""
    venv = Path(
        os.environ.get("STAYER_BENCH_VENV") or Path.home() / ".cache" / "stayer-bench" / "langgraph"
    )
    python = venv / "bin" / "python"
    check = [str(python), "-c", "import langgraph.checkpoint.sqlite, langgraph.graph"]
    if python.exists() and subprocess.run(check, capture_output=True).returncode == 0:
        return str(python), ""
    print(f"creating {venv} with langgraph and langgraph-checkpoint-sqlite …", file=sys.stderr)
    try:
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, capture_output=True)
        subprocess.run(
            [str(python), "-m", "pip", "install", "-q", "langgraph", "langgraph-checkpoint-sqlite"],
            check=True,
            capture_output=True,
            timeout=900,
        )
    except (subprocess.SubprocessError, OSError) as e:
        return None, f"could not install LangGraph in {venv}: {e}"
    return str(python), ""


def measure_langgraph(
    python: str, data: list[dict], where: Path, name: str
) -> tuple[dict | None, str]:
    """One SqliteSaver run over ``data`` in LangGraph's own Python: (figures, "") or
    (None, why it failed)."""
    data_file, out, db = (
        where / f"{name}.data.json",
        where / f"{name}.json",
        where / f"{name}.sqlite",
    )
    if not data_file.exists():
        data_file.write_text(json.dumps(data))
    try:
        r = subprocess.run(
            [python, __file__, "--langgraph-worker", str(data_file), str(db), str(out)],
            capture_output=True,
            text=True,
        )
    finally:
        for p in (db, Path(f"{db}-wal"), Path(f"{db}-shm")):
            p.unlink(missing_ok=True)  # ~1 GB each at the defaults
    if r.returncode != 0:
        return None, str(r.stderr.strip().splitlines()[-1:])
    return json.loads(out.read_text()), ""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--obs-tokens", type=int, default=20_000)
    ap.add_argument("--repeat", type=int, default=3, help="runs per side; the fastest counts")
    ap.add_argument(
        "--langgraph-python", help="a Python with langgraph and langgraph-checkpoint-sqlite"
    )
    ap.add_argument(
        "--store",
        default="",
        help="stayer's journal in this postgresql://… database (default: SQLite in a temporary directory)",
    )
    ap.add_argument("--no-langgraph", action="store_true", help="Time stayer's journal only.")
    ap.add_argument(
        "--langgraph-worker", nargs=3, metavar=("DATA", "DB", "OUT"), help=argparse.SUPPRESS
    )
    ap.add_argument("--json", action="store_true", help="Print one JSON document of the figures.")
    args = ap.parse_args()
    emit = json_only(args.json)
    say = functools.partial(print, file=sys.stderr if args.json else sys.stdout)
    if args.langgraph_worker:
        langgraph_worker(*args.langgraph_worker)
        return
    sys.path.insert(0, str(ROOT))
    where = Path(tempfile.mkdtemp(prefix="stayer-bench-journal-"))
    try:
        data = workload(args.steps, args.obs_tokens)
        raw = sum(len(d["assistant"].encode()) + len(d["observation"].encode()) for d in data)
        say(
            f"workload: {args.steps} steps, {args.obs_tokens:,}-token observations; {raw / 1e6:.1f} MB of unique message text"
        )
        ours = min(
            (measure_stayer(data, where / f"stayer{i}", args.store) for i in range(args.repeat)),
            key=lambda r: r["journal_s_per_step"],
        )
        python, why = (
            (None, "--no-langgraph")
            if args.no_langgraph
            else langgraph_python(args.langgraph_python)
        )
        theirs = None
        if python is None:
            say(f"LangGraph baseline skipped: {why}")
        else:
            for i in range(args.repeat):
                run, failed = measure_langgraph(python, data, where, f"langgraph{i}")
                if run is None:
                    say(f"LangGraph baseline failed: {failed}")
                    break
                if theirs is None or run["journal_s_per_step"] < theirs["journal_s_per_step"]:
                    theirs = run
        say(f"{'':28} {'bytes on disk':>15} {'journaling ms/step':>19}")
        label = "stayer journal (PostgreSQL)" if args.store else "stayer journal (SQLite)"
        size = "" if ours["bytes"] is None else f"{ours['bytes']:,}"
        say(f"{label:28} {size:>15} {ours['journal_s_per_step'] * 1000:>19.3f}")
        say(f"{'  (A/B wall difference)':28} {'':>15} {ours['ab_s_per_step'] * 1000:>19.3f}")
        if theirs is not None:
            say(
                f"{'LangGraph SqliteSaver':28} {theirs['bytes']:>15,} {theirs['journal_s_per_step'] * 1000:>19.3f}"
            )
            time_x = theirs["journal_s_per_step"] / ours["journal_s_per_step"]
            if ours["bytes"] is not None:
                size_x = theirs["bytes"] / ours["bytes"]
                say(
                    f"stayer is {size_x:.1f}× smaller and {time_x:.1f}× faster per step (target: ≥10× each)"
                )
            else:
                say(f"stayer is {time_x:.1f}× faster per step (target: ≥10×)")
            say(
                f"LangGraph: {theirs['checkpoints']} checkpoints, journal_mode={theirs['journal_mode']}, "
                f"synchronous={theirs['synchronous']}, {theirs['versions']}"
            )
        say(f"stayer: {ours['events']} events in {ours['writes']} durable writes")
        if ours["bytes"] is not None:
            say(f"stored/unique text = {ours['bytes'] / raw:.2f} (blobs are zlib-compressed)")
        if args.json:
            emit(
                {
                    "bench": "journal",
                    "steps": args.steps,
                    "obs_tokens": args.obs_tokens,
                    "unique_text_bytes": raw,
                    "store": "postgres" if args.store else "sqlite",
                    "stayer": ours,
                    "langgraph": theirs,
                }
            )
    finally:
        shutil.rmtree(where, ignore_errors=True)


if __name__ == "__main__":
    main()

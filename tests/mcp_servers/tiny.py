"""A small MCP server (stdio, standard library only, so that it runs in a sandbox) whose
tools force what real servers do rarely: a slow call, a crash mid-call, garbage on stdout,
a tool list that changes, a big result, a probe of the network. ``--name-of TOOL=NAME``
renames a tool (to test refused names); ``--drop-on-change=TOOL`` makes the change remove
TOOL as well. ``--read`` adds ``read``, which answers with the text of a file (where the
server runs: tests/test_mcp_docker.py). ``--count-dir=DIR`` adds two tools with a side
effect outside the workspace (tests/test_mcp_effects.py): ``count_once`` (not idempotent)
and ``count_idem`` (idempotent: a call whose ``_meta`` idempotency key was counted before
is not counted again) append ``LABEL KEY`` to DIR/counter; every call is logged to
DIR/received. Where DIR/plan says ``LABEL before`` or ``LABEL after``, a call stops there
(before or after counting), says so in DIR/reached (pid, label, phase) and waits to be
killed."""

import json
import os
import socket
import sys
import time
from pathlib import Path

TOOLS = {
    "echo": ("Echo the text back.", {"text": {"type": "string"}}, {"readOnlyHint": True}),
    "slow": ("Sleep for seconds.", {"seconds": {"type": "number"}}, {}),
    "crash": ("Exit in the middle of the call.", {}, {}),
    "garbage": ("Answer with a line that is not JSON-RPC.", {}, {}),
    "big": ("Answer with n characters.", {"n": {"type": "integer"}}, {}),
    "reach": (
        "Try a TCP connection to host:port.",
        {"host": {"type": "string"}, "port": {"type": "integer"}},
        {"destructiveHint": False, "idempotentHint": True},
    ),
    "change": ("Add the tool `added` and say that the list changed.", {}, {}),
}
META_KEY = "io.stayer/idempotency-key"
renamed = {}
count_dir = None
dropped = None
for arg in sys.argv[1:]:
    if arg.startswith("--count-dir="):
        count_dir = Path(arg.removeprefix("--count-dir="))
        props = {"label": {"type": "string"}}
        TOOLS["count_once"] = (
            "Count one call under a label.",
            props,
            {"readOnlyHint": False, "destructiveHint": False, "idempotentHint": False},
        )
        TOOLS["count_idem"] = (
            "Count a label once per idempotency key.",
            props,
            {"readOnlyHint": False, "destructiveHint": False, "idempotentHint": True},
        )
    if arg == "--read":
        TOOLS["read"] = (
            "The text of a file.",
            {"path": {"type": "string"}},
            {"readOnlyHint": True},
        )
    if arg.startswith("--name-of="):
        old, new = arg.removeprefix("--name-of=").split("=", 1)
        renamed[old] = new
    if arg.startswith("--drop-on-change="):  # the change also removes this tool
        dropped = arg.removeprefix("--drop-on-change=")
    if arg.startswith("--many="):  # N more tools with schemas of a usual size (a bench)
        for n in range(int(arg.removeprefix("--many="))):
            TOOLS[f"op_{n:03d}"] = (
                f"Operation {n}: look up, filter and summarise records of kind {n} in the "
                "service's store; returns a JSON list of matching records with their ids.",
                {
                    "query": {"type": "string", "description": "Words that must match."},
                    "limit": {"type": "integer", "description": "At most this many records."},
                    "since": {"type": "string", "description": "ISO date; older are skipped."},
                    "fields": {"type": "array", "items": {"type": "string"}},
                },
                {"readOnlyHint": True},
            )
changed = False


def send(msg):
    sys.stdout.write(json.dumps(msg) + "\n")
    sys.stdout.flush()


def listing():
    tools = []
    for name, (desc, props, hints) in TOOLS.items():
        if name == "added" and not changed:
            continue
        tool = {
            "name": renamed.get(name, name),
            "description": desc,
            "inputSchema": {"type": "object", "properties": props},
        }
        if hints:
            tool["annotations"] = hints
        tools.append(tool)
    return tools


def append(name, line):
    with open(count_dir / name, "a") as f:
        f.write(line + "\n")
        f.flush()
        os.fsync(f.fileno())


def stop_here(label, phase):
    plan_file = count_dir / "plan"
    if (plan_file.read_text().split() if plan_file.exists() else []) == [label, phase]:
        (count_dir / "reached.tmp").write_text(f"{os.getpid()} {label} {phase}\n")
        os.rename(count_dir / "reached.tmp", count_dir / "reached")
        while True:
            time.sleep(3600)


def count(name, label, key):
    append("received", f"{label} {key}")
    stop_here(label, "before")
    counter = count_dir / "counter"
    seen = counter.read_text().split() if counter.exists() else []
    if name == "count_idem" and key != "-" and key in seen:
        said = f"{label}: already counted under {key}"
    else:
        append("counter", f"{label} {key}")
        said = f"{label}: counted"
    stop_here(label, "after")
    return said


def call(name, args, meta=None):
    global changed
    name = {v: k for k, v in renamed.items()}.get(name, name)
    if changed and name == dropped:
        raise KeyError(name)
    if name in ("count_once", "count_idem"):
        return count(name, args["label"], (meta or {}).get(META_KEY, "-"))
    if name == "echo":
        return args.get("text", "")
    if name == "slow":
        time.sleep(float(args.get("seconds", 1)))
        return "slept"
    if name == "crash":
        os._exit(3)
    if name == "garbage":
        sys.stdout.write("this is not JSON-RPC\n")
        sys.stdout.flush()
        return None
    if name == "read":
        try:
            return Path(args["path"]).read_text()
        except OSError as e:
            return f"unreadable: {e}"
    if name == "big":
        return "x" * int(args.get("n", 10))
    if name == "reach":
        try:
            socket.create_connection((args["host"], int(args["port"])), timeout=3).close()
            return "connected"
        except OSError as e:
            return f"refused: {e}"
    if name == "change":
        changed = True
        TOOLS["added"] = ("A tool added mid-run.", {}, {})
        TOOLS["echo"] = ("Echo the text back (second version).", *TOOLS["echo"][1:])
        TOOLS.pop(dropped, None)
        send({"jsonrpc": "2.0", "method": "notifications/tools/list_changed"})
        return "changed"
    if name == "added":
        return "added was called"
    if name.startswith("op_"):
        return "[]"
    raise KeyError(name)


for line in sys.stdin:
    if not line.strip():
        continue
    req = json.loads(line)
    rid, method = req.get("id"), req.get("method")
    if rid is None:
        continue  # a notification
    if method == "initialize":
        result = {
            "protocolVersion": req["params"].get("protocolVersion", "2025-06-18"),
            "capabilities": {"tools": {"listChanged": True}},
            "serverInfo": {"name": "tiny", "version": "1"},
        }
    elif method == "tools/list":
        result = {"tools": listing()}
    elif method == "tools/call":
        try:
            params = req["params"]
            text = call(params["name"], params.get("arguments") or {}, params.get("_meta"))
        except KeyError as e:
            send(
                {"jsonrpc": "2.0", "id": rid, "error": {"code": -32602, "message": f"no tool {e}"}}
            )
            continue
        if text is None:
            continue
        result = {"content": [{"type": "text", "text": text}], "isError": False}
    elif method == "ping":
        result = {}
    else:
        send({"jsonrpc": "2.0", "id": rid, "error": {"code": -32601, "message": method}})
        continue
    send({"jsonrpc": "2.0", "id": rid, "result": result})

"""An MCP server (stdio, standard library only) whose tools have a side effect outside the
workspace: they append ``LABEL KEY`` to DIR/counter. Usage: counting.py DIR.

``count_once`` says it is not idempotent (annotations: ``destructiveHint`` false,
``idempotentHint`` false): every call counts. ``count_idem`` says it is idempotent and
honours the idempotency key stayer sends in the request's ``_meta``
(``io.stayer/idempotency-key``): a key already counted is not counted again. Every call
received is logged to DIR/received (``LABEL KEY``, ``-`` without a key). Where DIR/plan
says ``LABEL before`` or ``LABEL after``, a call stops there (before or after counting),
says so in DIR/reached (its pid, the label and the phase) and waits to be killed.
"""

import json
import os
import sys
import time
from pathlib import Path

META_KEY = "io.stayer/idempotency-key"
WHERE = Path(sys.argv[1])
LABEL = {"label": {"type": "string"}}
TOOLS = {
    "count_once": (
        "Count one call under a label.",
        {"readOnlyHint": False, "destructiveHint": False, "idempotentHint": False},
    ),
    "count_idem": (
        "Count a label once per idempotency key.",
        {"readOnlyHint": False, "destructiveHint": False, "idempotentHint": True},
    ),
}


def send(msg):
    sys.stdout.write(json.dumps(msg) + "\n")
    sys.stdout.flush()


def append(name, line):
    with open(WHERE / name, "a") as f:
        f.write(line + "\n")
        f.flush()
        os.fsync(f.fileno())


def stop_here(label, phase):
    plan_file = WHERE / "plan"
    plan = plan_file.read_text().split() if plan_file.exists() else []
    if plan == [label, phase]:
        tmp = WHERE / "reached.tmp"
        tmp.write_text(f"{os.getpid()} {label} {phase}\n")
        os.rename(tmp, WHERE / "reached")
        while True:
            time.sleep(3600)


def call(name, args, meta):
    label, key = args["label"], (meta or {}).get(META_KEY, "-")
    append("received", f"{label} {key}")
    stop_here(label, "before")
    counter = WHERE / "counter"
    seen = counter.read_text().split() if counter.exists() else []
    if name == "count_idem" and key != "-" and key in seen:
        said = f"{label}: already counted under {key}"
    else:
        append("counter", f"{label} {key}")
        said = f"{label}: counted"
    stop_here(label, "after")
    return said


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
            "capabilities": {"tools": {}},
            "serverInfo": {"name": "counting", "version": "1"},
        }
    elif method == "tools/list":
        result = {
            "tools": [
                {
                    "name": name,
                    "description": desc,
                    "inputSchema": {"type": "object", "properties": LABEL, "required": ["label"]},
                    "annotations": hints,
                }
                for name, (desc, hints) in TOOLS.items()
            ]
        }
    elif method == "tools/call":
        params = req["params"]
        text = call(params["name"], params.get("arguments") or {}, params.get("_meta"))
        result = {"content": [{"type": "text", "text": text}], "isError": False}
    elif method == "ping":
        result = {}
    else:
        send({"jsonrpc": "2.0", "id": rid, "error": {"code": -32601, "message": method}})
        continue
    send({"jsonrpc": "2.0", "id": rid, "result": result})

"""Rollout records (``scale.rollouts``) in the shapes trainers read.

* ``jsonl`` — one sample per line, stayer's own shape (every field below, plus the steps).
* ``atif`` — one ATIF v1.7 trajectory per sample (Harbor RFC 0001), ``atif/<sample>.json``.
* ``verl`` — veRL ``AgentLoopOutput`` fields, one per line (``verl.jsonl``).
* ``skyrl`` — one SkyRL ``GeneratorOutput`` (``skyrl.json``): parallel lists.
* ``verifiers`` — verifiers' processed outputs (``verifiers.json``): parallel lists.

Details and rationale: docs/notes.md, ``stayer/scale/exports.py``.
"""

from __future__ import annotations

import json
import statistics
from collections import defaultdict
from collections.abc import Iterable, Sequence
from decimal import Decimal
from pathlib import Path
from typing import Any

from stayer._version import __version__
from stayer.eval.runner import write_atomic

FORMATS = ("jsonl", "atif", "verl", "skyrl", "verifiers")
ATIF_VERSION = "ATIF-v1.7"


def raw_reward(record: dict[str, Any]) -> float:
    r = record.get("reward")
    return float(r) if isinstance(r, int | float) else 0.0


def normalised_rewards(records: Sequence[dict[str, Any]]) -> dict[str, float]:
    """Sample key → its reward's z-score within its group (module docstring)."""
    groups: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for r in records:
        groups[r["group"]].append(r)
    out: dict[str, float] = {}
    for members in groups.values():
        rewards = [raw_reward(r) for r in members]
        mean = statistics.fmean(rewards)
        sd = statistics.pstdev(rewards)
        for r, x in zip(members, rewards, strict=True):
            out[r["key"]] = 0.0 if sd == 0 else (x - mean) / sd
    return out


def segments(trace: Sequence[dict[str, Any]]) -> list[dict[str, Any]] | None:
    """The sample's token sequences (module docstring), or None without token ids."""
    if not trace or any(s.get("prompt_ids") is None for s in trace):
        return None
    out: list[dict[str, Any]] = []
    current: dict[str, Any] | None = None
    seen: list[int] = []  # the current segment's prompt and response so far
    for step in trace:
        prompt, completion = step["prompt_ids"], step["completion_ids"]
        if current is not None and prompt[: len(seen)] == seen:
            added = prompt[len(seen) :]
            current["response_ids"] += added
            current["response_mask"] += [0] * len(added)
        else:
            current = {
                "prompt_ids": list(prompt),
                "response_ids": [],
                "response_mask": [],
                "steps": [],
            }
            out.append(current)
        current["response_ids"] += completion
        current["response_mask"] += [1] * len(completion)
        current["steps"].append(step["step"])
        current["stop_reason"] = step.get("stop_reason") or ""
        seen = current["prompt_ids"] + current["response_ids"]
    return out


def sample_doc(record: dict[str, Any], normalised: float) -> dict[str, Any]:
    """The ``jsonl`` shape of one sample."""
    return {
        "sample_id": record["key"],
        "domain": record["domain"],
        "task": record["task"],
        "group": record["group"],
        "epoch": record["epoch"],
        "round": record.get("round"),
        "run_id": record.get("run_id"),
        "model": record["model"],
        "status": record["status"],
        "reward": record.get("reward"),
        "reward_normalised": normalised,
        "weight": record.get("weight", 1.0),
        "cost_usd": record.get("cost_usd"),
        "trace_complete": record.get("trace_complete", False),
        "steps": record.get("trace", []),
    }


def _arguments(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return {"raw": text}  # arguments the model wrote that are not JSON, kept as written


def atif(record: dict[str, Any], normalised: float) -> dict[str, Any]:
    """One sample as an ATIF v1.7 trajectory."""
    trace = record.get("trace", [])
    head = trace[0] if trace else {}
    steps: list[dict[str, Any]] = []

    def add(source: str, message: str, **extra: Any) -> dict[str, Any]:
        step = {"step_id": len(steps) + 1, "source": source, "message": message, **extra}
        steps.append(step)
        return step

    if head.get("system"):
        add("system", head["system"])
    last_agent: dict[str, Any] | None = None
    for s in trace:
        for m in s["messages"]:
            copied = {"is_copied_context": True} if m.get("copied") else {}
            if m.get("kind") == "summary":  # a compaction wrote it (ATIF: context management)
                add(
                    "system",
                    m["content"],
                    extra={"context_management": "summary", "role": m["role"]},
                    **copied,
                )
            elif m["role"] == "tool":
                if last_agent is not None and not m.get("copied"):
                    results = last_agent.setdefault("observation", {"results": []})["results"]
                    results.append(
                        {"source_call_id": m.get("tool_call_id"), "content": m["content"]}
                    )
                else:
                    add(
                        "system",
                        m["content"],
                        extra={"role": "tool", "tool_call_id": m.get("tool_call_id")},
                        **copied,
                    )
            elif m["role"] == "assistant":
                add("agent", m["content"], **copied)
            else:
                add("user", m["content"], **copied)
        reply, usage = s["reply"], s["usage"]
        metrics: dict[str, Any] = {
            "prompt_tokens": usage["input_tokens"],  # includes cached
            "completion_tokens": usage["output_tokens"],
            "cached_tokens": usage["cache_read_tokens"],
            "cost_usd": None if s["cost_usd"] == "unknown" else float(s["cost_usd"]),
            "prompt_token_ids": s.get("prompt_ids"),
            "completion_token_ids": s.get("completion_ids"),
            "logprobs": None,
            "extra": {
                "cost_usd_exact": s["cost_usd"],
                "cost_parts_usd": s.get("cost_parts"),
                "usage": usage,
            },
        }
        last_agent = add(
            "agent",
            reply.get("content", ""),
            model_name=s["model"],
            tool_calls=[
                {
                    "tool_call_id": c["id"],
                    "function_name": c["name"],
                    "arguments": _arguments(c["arguments"]),
                }
                for c in reply.get("tool_calls", [])
            ],
            metrics=metrics,
            extra={"stayer_step": s["step"], "stop_reason": s.get("stop_reason")},
        )
    usage_total = [s["usage"] for s in trace]
    cost = record.get("cost_usd")
    return {
        "schema_version": ATIF_VERSION,
        "session_id": record.get("run_id") or record["key"],
        "trajectory_id": record["key"],
        "agent": {
            "name": "stayer",
            "version": __version__,
            "model_name": record["model"],
            "tool_definitions": [
                {"type": "function", "function": t} for t in head.get("tools", [])
            ],
        },
        "steps": steps,
        "final_metrics": {
            "total_prompt_tokens": sum(u["input_tokens"] for u in usage_total),
            "total_completion_tokens": sum(u["output_tokens"] for u in usage_total),
            "total_cached_tokens": sum(u["cache_read_tokens"] for u in usage_total),
            "total_cost_usd": None if cost in (None, "unknown") else float(cost),
            "total_steps": len(steps),
            "extra": {
                "reward": record.get("reward"),
                "reward_normalised": normalised,
                "cost_usd_exact": cost,
            },
        },
        "subagent_trajectories": [],
    }


def export(records: Iterable[dict[str, Any]], out: Path, fmt: str) -> dict[str, Any]:
    """Write ``records`` in format ``fmt`` under ``out``; what was written and skipped."""
    if fmt not in FORMATS:
        raise ValueError(f"--format {fmt}: expected one of {', '.join(FORMATS)}")
    records = sorted(records, key=lambda r: r["key"])
    norm = normalised_rewards(records)
    if fmt == "jsonl":
        path = out / "rollouts.jsonl"
        write_atomic(
            path, "".join(json.dumps(sample_doc(r, norm[r["key"]])) + "\n" for r in records)
        )
        return {"format": fmt, "path": str(path), "samples": len(records), "skipped": []}
    if fmt == "atif":
        for r in records:
            write_atomic(
                out / "atif" / f"{_file_name(r['key'])}.json",
                json.dumps(atif(r, norm[r["key"]]), indent=1),
            )
        return {"format": fmt, "path": str(out / "atif"), "samples": len(records), "skipped": []}
    rows, skipped = [], []
    for r in records:
        segs = segments(r.get("trace", [])) if r.get("trace_complete") else None
        if segs is None:
            skipped.append(r["key"])
            continue
        for i, seg in enumerate(segs):
            rows.append((r, i, seg))
    path = out / {"verl": "verl.jsonl", "skyrl": "skyrl.json", "verifiers": "verifiers.json"}[fmt]
    if fmt == "verl":
        text = "".join(json.dumps(_verl(r, i, seg, norm[r["key"]])) + "\n" for r, i, seg in rows)
    elif fmt == "skyrl":
        text = json.dumps(_skyrl(rows, norm))
    else:
        text = json.dumps(_verifiers(rows, norm))
    write_atomic(path, text)
    return {
        "format": fmt,
        "path": str(path),
        "samples": len(records) - len(skipped),
        "sequences": len(rows),
        "skipped": skipped,
    }


def _file_name(key: str) -> str:
    return key.replace("/", "__")


def _verl(r: dict[str, Any], i: int, seg: dict[str, Any], normalised: float) -> dict[str, Any]:
    return {
        "prompt_ids": seg["prompt_ids"],
        "response_ids": seg["response_ids"],
        "response_mask": seg["response_mask"],
        "response_logprobs": None,
        "reward_score": normalised,
        "num_turns": len(seg["steps"]),
        "extra_fields": {
            "sample_id": r["key"],
            "segment": i,
            "domain": r["domain"],
            "group": r["group"],
            "reward_raw": r.get("reward"),
            "cost_usd": r.get("cost_usd"),
            "steps": seg["steps"],
        },
    }


def _skyrl(
    rows: Sequence[tuple[dict[str, Any], int, dict[str, Any]]], norm: dict[str, float]
) -> dict[str, Any]:
    return {
        "prompt_token_ids": [seg["prompt_ids"] for _, _, seg in rows],
        "response_ids": [seg["response_ids"] for _, _, seg in rows],
        "rewards": [norm[r["key"]] for r, _, _ in rows],
        "loss_masks": [seg["response_mask"] for _, _, seg in rows],
        "stop_reasons": [seg["stop_reason"] for _, _, seg in rows],
        "rollout_logprobs": None,
        "trajectory_ids": [
            {"instance_id": r["group"], "repetition_id": r["epoch"]} for r, _, _ in rows
        ],
        "rollout_metrics": {
            "cost_usd": [r.get("cost_usd") for r, _, _ in rows],
            "reward_raw": [r.get("reward") for r, _, _ in rows],
        },
    }


def _verifiers(
    rows: Sequence[tuple[dict[str, Any], int, dict[str, Any]]], norm: dict[str, float]
) -> dict[str, Any]:
    return {
        "prompt_ids": [seg["prompt_ids"] for _, _, seg in rows],
        "prompt_mask": [[0] * len(seg["prompt_ids"]) for _, _, seg in rows],
        "completion_ids": [seg["response_ids"] for _, _, seg in rows],
        "completion_mask": [seg["response_mask"] for _, _, seg in rows],
        "completion_logprobs": [[0.0] * len(seg["response_ids"]) for _, _, seg in rows],
        "rewards": [norm[r["key"]] for r, _, _ in rows],
    }


def total_cost(records: Iterable[dict[str, Any]]) -> Decimal:
    return sum(
        (Decimal(r["cost_usd"]) for r in records if r.get("cost_usd") not in (None, "unknown")),
        Decimal(0),
    )

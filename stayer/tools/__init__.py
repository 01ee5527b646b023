"""The agent's tools, and the one place tool calls from a model are checked and dispatched."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from stayer.messages import ToolCall
from stayer.tokens import TokenCounter
from stayer.tools.base import Tool, ToolContext, ToolResult
from stayer.tools.bash import BashTool
from stayer.tools.files import EditFileTool, ReadFileTool, WriteFileTool
from stayer.tools.memory import MemoryTool
from stayer.tools.submit import SubmitTool

_JSON_TYPES: dict[str, tuple[type, ...]] = {
    "string": (str,),
    "integer": (int,),
    "number": (int, float),
    "boolean": (bool,),
    "object": (dict,),
    "array": (list,),
}


def default_tools(counter: TokenCounter) -> list[Tool]:
    """bash, read_file, write_file, edit_file, memory, submit — in a fixed order, because the
    tool schemas are part of the cached prompt prefix and must be byte-identical every call."""
    return [
        BashTool(counter),
        ReadFileTool(counter),
        WriteFileTool(),
        EditFileTool(),
        MemoryTool(),
        SubmitTool(),
    ]


def check_args(schema: Mapping[str, Any], args: Any) -> str | None:
    """Why ``args`` does not fit the (flat, object-typed) tool ``schema``; None if it does.

    Covers what the built-in tools' schemas use — required, property types, minimum,
    additionalProperties — so that a tool body can trust its arguments. Not a general
    JSON-schema validator.
    """
    if not isinstance(args, dict):
        return f"the arguments must be a JSON object, got {_json_type(args)}"
    props: Mapping[str, Any] = schema.get("properties", {})
    missing = [k for k in schema.get("required", []) if k not in args]
    if missing:
        return "missing required argument(s): " + ", ".join(missing)
    if schema.get("additionalProperties") is False:
        extra = [k for k in args if k not in props]
        if extra:
            allowed = ", ".join(props) or "none"
            return f"unknown argument(s): {', '.join(extra)} (allowed: {allowed})"
    for key, value in args.items():
        prop = props.get(key, {})
        want = prop.get("type")
        if want in _JSON_TYPES:
            ok = isinstance(value, _JSON_TYPES[want])
            if want in ("integer", "number") and isinstance(value, bool):
                ok = False  # JSON true is not a number, though Python's bool is an int
            if not ok:
                return f"argument {key!r} must be {want}, got {_json_type(value)}"
        if "minimum" in prop and isinstance(value, int | float) and value < prop["minimum"]:
            return f"argument {key!r} must be at least {prop['minimum']}, got {value}"
    return None


def _json_type(value: Any) -> str:
    for name, types in _JSON_TYPES.items():
        if isinstance(value, types) and not (name != "boolean" and isinstance(value, bool)):
            return name
    return "null" if value is None else type(value).__name__


def _normalise(schema: Mapping[str, Any], args: dict[str, Any]) -> dict[str, Any]:
    """Integral floats (``5.0``) for integer arguments become ints; explicit nulls for
    optional arguments are dropped (some models send them for 'not given')."""
    props = schema.get("properties", {})
    out = {}
    for key, value in args.items():
        if value is None:
            continue
        if (
            props.get(key, {}).get("type") == "integer"
            and isinstance(value, float)
            and value.is_integer()
        ):
            value = int(value)
        out[key] = value
    return out


async def run_tool(
    tools_by_name: Mapping[str, Tool], call: ToolCall, ctx: ToolContext
) -> ToolResult:
    """Execute ``call``. Never raises: every problem — an unknown tool, malformed JSON,
    wrong arguments, a tool that crashed — comes back as an error result the model can read
    and correct, because one bad call must not end a long run."""
    tool = tools_by_name.get(call.name)
    if tool is None:
        known = ", ".join(sorted(tools_by_name)) or "none"
        return ToolResult(f"unknown tool {call.name!r}; available tools: {known}", is_error=True)
    schema = tool.spec.parameters
    text = call.arguments or ""
    try:
        args = json.loads(text) if text.strip() else {}
    except json.JSONDecodeError as e:
        return ToolResult(
            f"{call.name}: the arguments are not valid JSON ({e.msg} at line {e.lineno} column "
            f"{e.colno}); send one JSON object with the fields {', '.join(schema.get('properties', {}))}",
            is_error=True,
        )
    if isinstance(args, dict):
        args = _normalise(schema, args)
    problem = check_args(schema, args)
    if problem is not None:
        return ToolResult(f"{call.name}: {problem}", is_error=True)
    try:
        return await tool(args, ctx)
    except Exception as e:  # noqa: BLE001  (reported to the model, see docstring)
        return ToolResult(f"{call.name}: internal error: {type(e).__name__}: {e}", is_error=True)


__all__ = [
    "BashTool",
    "EditFileTool",
    "ReadFileTool",
    "SubmitTool",
    "Tool",
    "ToolContext",
    "ToolResult",
    "WriteFileTool",
    "check_args",
    "default_tools",
    "run_tool",
]

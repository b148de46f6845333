"""Validation of tool-call arguments against a tool's JSON schema (pure).

Only what a model commonly gets wrong is checked: the arguments must be a JSON object, required
properties must be present, and top-level property types must match. Problems become error
results the model can react to, never exceptions.
"""

from __future__ import annotations

from typing import Any

import orjson

_TYPES: dict[str, tuple[type, ...]] = {
    "string": (str,), "integer": (int,), "number": (int, float), "boolean": (bool,),
    "array": (list,), "object": (dict,),
}


def _type_ok(value: Any, expected: str | list[str]) -> bool:
    names = expected if isinstance(expected, list) else [expected]
    for name in names:
        if name == "null" and value is None:
            return True
        types = _TYPES.get(name)
        if types is None:
            return True  # a type we do not check
        if isinstance(value, bool) and name in ("integer", "number"):
            continue
        if isinstance(value, types):
            return True
    return False


def parse_arguments(raw: str, schema: dict[str, Any]) -> tuple[dict[str, Any] | None, str | None]:
    """Return (arguments, None) when valid, else (None, message for the model)."""
    text = raw.strip() if isinstance(raw, str) else raw
    if text in ("", None):
        args: Any = {}
    else:
        try:
            args = orjson.loads(text)
        except orjson.JSONDecodeError as e:
            return None, f"invalid JSON in tool arguments: {e}; send the arguments as one JSON object"
    if not isinstance(args, dict):
        return None, f"tool arguments must be a JSON object, got {type(args).__name__}"
    props: dict[str, Any] = schema.get("properties", {})
    missing = [name for name in schema.get("required", []) if name not in args]
    if missing:
        return None, f"missing required argument(s): {', '.join(missing)}"
    for name, value in args.items():
        spec = props.get(name)
        if spec is None:
            if schema.get("additionalProperties") is False:
                return None, f"unknown argument {name!r} (allowed: {', '.join(props)})"
            continue
        if "type" in spec and not _type_ok(value, spec["type"]):
            return None, f"argument {name!r} must be of type {spec['type']}, got {type(value).__name__}"
        if "enum" in spec and value not in spec["enum"]:
            return None, f"argument {name!r} must be one of {spec['enum']}, got {value!r}"
    return args, None

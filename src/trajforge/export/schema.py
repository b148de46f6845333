"""The fixed Arrow schema of the `parquet` and `hf` exports, and one record -> one row.

One row per trajectory. `messages` holds the OpenAI-style conversation (export.convert) as nested
Arrow types; run figures are typed columns. Values whose shape is open-ended are JSON text in a
string column: `tools` (JSON Schemas of the offered tools), `row` (the dataset row's extra
fields), `verification.detail` when it is not text, and `extra` (any other record field), so the
schema never changes with the data and a record loses nothing but what `DROPS` lists.
docs/exports.md documents the same columns.
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa

from trajforge.agent.segments import MISSING_CALLS, TOKENS, TOKENS_MISSING
from trajforge.export.filters import record_task_type, verification_of
from trajforge.jsonio import dumps_str

_CALL = pa.struct([("id", pa.string()), ("type", pa.string()),
                   ("function", pa.struct([("name", pa.string()), ("arguments", pa.string())]))])
MESSAGE = pa.struct([
    ("role", pa.string()),  # system | user | assistant | tool
    ("content", pa.string()),
    ("reasoning_content", pa.string()),  # assistant reasoning (null: none, or not exported)
    ("tool_calls", pa.list_(_CALL)),  # assistant: calls, arguments as a JSON string
    ("tool_call_id", pa.string()),  # tool: the id of the call it answers
    ("name", pa.string()),  # tool: the tool's name
])
_I = pa.int64()
SCHEMA = pa.schema([
    ("prompt_index", _I), ("sample_id", pa.string()), ("rollout", _I), ("dataset_line", _I), ("split", pa.string()),
    ("model", pa.string()), ("batch_num", _I), ("timestamp", pa.string()), ("task_type", pa.string()),
    ("completed", pa.bool_()), ("partial", pa.bool_()), ("end_reason", pa.string()), ("api_calls", _I),
    ("toolsets_used", pa.list_(pa.string())),
    ("messages", pa.list_(MESSAGE)),
    ("tools", pa.string()),
    ("tool_stats", pa.list_(pa.struct([("name", pa.string()), ("count", _I), ("success", _I), ("failure", _I)]))),
    ("reasoning", pa.struct([("total_assistant_turns", _I), ("turns_with_reasoning", _I),
                             ("turns_without_reasoning", _I), ("has_any_reasoning", pa.bool_())])),
    ("usage", pa.struct([("prompt_tokens", _I), ("completion_tokens", _I), ("reasoning_tokens", _I),
                         ("cost", pa.float64())])),
    ("verification", pa.struct([("passed", pa.bool_()), ("score", pa.float64()), ("method", pa.string()),
                                ("detail", pa.string()), ("error", pa.string())])),
    ("timing", pa.struct([("working_s", pa.float64()), ("wall_s", pa.float64())])),
    ("row", pa.string()),
    ("extra", pa.string()),
])
DROPS = ["tool_error_counts (the same numbers as tool_stats failures)",
         "tool_stats entries of tools never called (all zero)",
         f"captured token ids ({TOKENS}, {TOKENS_MISSING}: --format tokens exports them)"]
_COLUMNS = frozenset(SCHEMA.names) | {"tool_error_counts", "metadata", TOKENS, TOKENS_MISSING, MISSING_CALLS}
_MESSAGE_KEYS = tuple(MESSAGE.names)


def _int(v: Any) -> int | None:
    return int(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def _float(v: Any) -> float | None:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def _json_or_none(v: Any) -> str | None:
    return None if v is None else v if isinstance(v, str) else dumps_str(v)


def _struct(v: Any, fields: dict[str, Any]) -> dict[str, Any] | None:
    if not isinstance(v, dict):
        return None
    return {name: conv(v.get(name)) for name, conv in fields.items()}


def row_of(item: dict[str, Any], record: dict[str, Any], split: str | None) -> dict[str, Any]:
    """One row of SCHEMA from an OpenAI export item (convert.to_openai) and its record."""
    meta = item["metadata"]
    stats = record.get("tool_stats") if isinstance(record.get("tool_stats"), dict) else {}
    extra = {k: v for k, v in record.items() if k not in _COLUMNS and k != "conversations"}
    nested = record.get("metadata") if isinstance(record.get("metadata"), dict) else {}
    extra.update({f"metadata.{k}": v for k, v in nested.items() if k not in ("model", "batch_num", "timestamp")})
    for col in ("reasoning", "usage", "verification", "timing"):  # fields the typed struct has no place for
        sub = record.get(col)
        if isinstance(sub, dict):
            names = SCHEMA.field(col).type.names
            extra.update({f"{col}.{k}": v for k, v in sub.items() if k not in names})
    if "sharegpt" in meta:
        extra["sharegpt"] = meta["sharegpt"]
    verification = verification_of(record)
    return {
        "prompt_index": _int(record.get("prompt_index")), "sample_id": record.get("sample_id"),
        "rollout": _int(record.get("rollout")),
        "dataset_line": _int(record.get("dataset_line")), "split": split,
        "model": nested.get("model"), "batch_num": _int(nested.get("batch_num")),
        "timestamp": nested.get("timestamp"), "task_type": record_task_type(record),
        "completed": record.get("completed"), "partial": record.get("partial"),
        "end_reason": record.get("end_reason") if isinstance(record.get("end_reason"), str) else None,
        "api_calls": _int(record.get("api_calls")), "toolsets_used": record.get("toolsets_used"),
        "messages": [{k: m.get(k) for k in _MESSAGE_KEYS} for m in item["messages"]],
        "tools": dumps_str(item["tools"]),
        "tool_stats": [{"name": n, "count": s.get("count", 0), "success": s.get("success", 0),
                        "failure": s.get("failure", 0)} for n, s in stats.items() if s.get("count")],
        "reasoning": _struct(record.get("reasoning"), {"total_assistant_turns": _int, "turns_with_reasoning": _int,
                                                       "turns_without_reasoning": _int,
                                                       "has_any_reasoning": lambda v: v}),
        "usage": _struct(record.get("usage"), {"prompt_tokens": _int, "completion_tokens": _int,
                                               "reasoning_tokens": _int, "cost": lambda v: v}),
        "verification": _struct(verification, {"passed": lambda v: v, "score": lambda v: v,
                                               "method": lambda v: v, "detail": _json_or_none,
                                               "error": _json_or_none}),
        "timing": _struct(record.get("timing"), {"working_s": _float, "wall_s": _float}),
        "row": _json_or_none(record.get("row")),
        "extra": dumps_str(extra) if extra else None,
    }


# Column -> meaning, for the dataset card and docs/exports.md.
DOC = {
    "prompt_index": "index of the sample among the dataset's valid rows",
    "sample_id": "stable sample identity (content hash and occurrence; `#k` for rollout k > 0)",
    "rollout": "which rollout of its prompt the sample is (null in runs without rollouts)",
    "dataset_line": "1-based line of the row in the dataset file (null in runs that did not record it)",
    "split": "the split the row was assigned to (null without --split)",
    "model, batch_num, timestamp": "the record's metadata",
    "task_type": "the row's task type when the record carries one",
    "completed, partial, end_reason, api_calls, toolsets_used": "as in trajectories.jsonl",
    "messages": "list of {role, content, reasoning_content, tool_calls [{id, type, function {name, arguments}}], "
                "tool_call_id, name}; unused fields are null",
    "tools": "JSON text: the OpenAI `tools` list offered to the sample",
    "tool_stats": "list of {name, count, success, failure} of the tools that were called",
    "reasoning": "{total_assistant_turns, turns_with_reasoning, turns_without_reasoning, has_any_reasoning}",
    "usage": "{prompt_tokens, completion_tokens, reasoning_tokens, cost}",
    "verification": "{passed, score, method, detail (JSON text), error} when the run verified the sample, "
                    "else null",
    "timing": "{working_s, wall_s}: seconds the sample's --timeout counted, and its wall-clock seconds "
              "(null in runs that did not record them)",
    "row": "JSON text: the dataset row's extra fields, when recorded",
    "extra": "JSON text: any other record field (null when none)",
}


def doc_table() -> str:
    return "\n".join(["| column | content |", "| --- | --- |", *(f"| `{k}` | {v} |" for k, v in DOC.items())])

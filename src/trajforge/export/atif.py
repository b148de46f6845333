"""`--format atif`: one Agent Trajectory Interchange Format document (v1.7) per line.

Harbor's trajectory format (agent.atif builds it): a task run's records export to the documents
its tools read, and so does any run's. Each record goes through export.convert's OpenAI messages,
so reasoning, tool calls and their observations are paired by call id exactly as there; saved
records carry no per-step usage, so steps have no metrics, and `final_metrics` holds the record's
tokens and cost. An oracle record's steps say no model made them (llm_call_count 0). The record's
task, verification (reward) and identity travel in the document's `extra`.
"""

from __future__ import annotations

from typing import Any

from trajforge.agent.atif import document
from trajforge.export.exporter import Item, JsonlExporter
from trajforge.export.convert import to_openai
from trajforge.jsonio import dumps

_EXTRA_KEYS = ("sample_id", "prompt_index", "rollout", "end_reason", "task", "verification", "row")


def to_atif(record: dict[str, Any]) -> dict[str, Any]:
    converted = to_openai(record, "field")
    model = str((record.get("metadata") or {}).get("model") or "")
    extra = {k: record[k] for k in _EXTRA_KEYS if k in record}
    return document(converted["messages"], converted["tools"], session_id=str(record.get("sample_id", "")),
                    model=model, total_usage=record.get("usage"), llm_calls=model != "oracle", extra=extra)


class ATIFExporter(JsonlExporter):
    def line(self, item: Item) -> bytes:
        return dumps(to_atif(item.record)) + b"\n"

    def drops(self) -> list[str]:
        return [*super().drops(), "tool_stats, reasoning counts and other record fields outside extra"]

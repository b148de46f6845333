"""ShareGPT trajectory record <-> OpenAI chat `messages` (pure functions, both directions).

A saved record holds Hermes-style text turns (agent.sharegpt). Trainers want structured OpenAI
messages: `tool_calls` with ids and JSON-string arguments, `tool` messages with `tool_call_id`
and `name`, reasoning as `reasoning_content`, and the offered tools as a `tools` list.

The conversion is lossless for records trajforge writes: `to_record(to_openai(rec))` rebuilds the
record byte for byte once JSON-encoded. The reverse renders turns with agent.sharegpt's own
functions, so there is one definition of the saved format. Where a record cannot be expressed
exactly (a system turn that is not the standard tool preamble, tool call ids that repeat within
a conversation), `metadata.sharegpt` keeps what the reverse needs.

The system message is the runtime system prompt the model saw (agent.prompts), without the
ephemeral prompt, which is never saved; the tools travel in `tools`, where chat templates expect
them, instead of as text inside the system turn.
"""

from __future__ import annotations

from typing import Any, Literal

from trajforge.agent.loop import ToolResult, Turn
from trajforge.agent.prompts import RUNTIME_SYSTEM_PROMPT, sharegpt_system_text
from trajforge.agent.sharegpt import gpt_value, tool_value
from trajforge.export.turns import (THINK_CLOSE, THINK_OPEN, ConversionError, arguments_text, content_text,
                                    split_gpt, split_tool, system_info)
from trajforge.model.types import ToolCall

__all__ = ["ConversionError", "Reasoning", "to_openai", "to_record"]

Reasoning = Literal["field", "inline", "drop"]

# Keys of a record's own `metadata` object; they are flattened into the OpenAI `metadata`.
RECORD_METADATA_KEYS = ("batch_num", "timestamp", "model")
# Keys that lead a record, before `conversations` (resume reads the identity from a line's start).
_LEADING = ("prompt_index", "sample_id", "dataset_line")


def _assistant(reasoning: str | None, text: str, mode: Reasoning) -> dict[str, Any]:
    msg: dict[str, Any] = {"role": "assistant", "content": text}
    if reasoning is not None and mode == "field":
        msg["reasoning_content"] = reasoning
    elif reasoning is not None and mode == "inline":
        msg["content"] = f"{THINK_OPEN}{reasoning}{THINK_CLOSE}" + (f"\n{text}" if text else "")
    return msg


def _metadata(record: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    meta: dict[str, Any] = {}
    nested: list[str] = []
    for key, value in record.items():
        if key == "conversations":
            continue
        if key == "metadata" and isinstance(value, dict) and not any(k in record for k in value):
            meta.update(value)  # flattened: metadata.model, not metadata.metadata.model
            nested = list(value)
        else:
            meta[key] = value
    if tuple(nested) != RECORD_METADATA_KEYS:
        extra["metadata_keys"] = nested  # which keys the reverse nests again
    if extra:
        meta["sharegpt"] = extra
    return meta


def to_openai(record: dict[str, Any], reasoning: Reasoning = "field") -> dict[str, Any]:
    """One saved record -> {"messages", "tools", "metadata"}. Raises ConversionError."""
    conv = record.get("conversations")
    if not isinstance(conv, list) or not conv:
        raise ConversionError("conversations: missing or empty")
    extra: dict[str, Any] = {}
    tools: list[dict[str, Any]] = []
    messages: list[dict[str, Any]] = []
    renamed: dict[str, str] = {}
    used: set[str] = set()
    pending: list[dict[str, Any]] = []  # tool_calls of the last assistant turn, not yet answered
    for i, turn in enumerate(conv):
        where = f"conversations[{i}]"
        if not (isinstance(turn, dict) and isinstance(turn.get("from"), str) and isinstance(turn.get("value"), str)):
            raise ConversionError(f"{where}: not a {{from, value}} turn")
        role, value = turn["from"], turn["value"]
        if role == "system":
            if i != 0:
                raise ConversionError(f"{where}: a system turn after the first turn")
            tools, standard = system_info(value)
            tools = list(tools)  # the cached entries are shared: callers must not mutate them
            if not standard:
                extra["system"] = value  # not the standard preamble: keep it for the reverse
            messages.append({"role": "system", "content": RUNTIME_SYSTEM_PROMPT})
        elif role == "human":
            messages.append({"role": "user", "content": value})
        elif role == "gpt":
            think, text, calls = split_gpt(value)
            msg = _assistant(think, text, reasoning)
            pending = [{"id": "", "type": "function", "function": {"name": n, "arguments": arguments_text(a)}}
                       for n, a in calls]
            if pending:
                msg["tool_calls"] = pending
            messages.append(msg)
        elif role == "tool":
            responses = split_tool(value, where)
            k = 0
            for call in pending:  # responses come in call order; a call may lack one
                if k < len(responses) and call["function"]["name"] == responses[k][1]:
                    call_id, _, content = responses[k]
                    if not call_id or call_id in used:  # ids must be unique within a conversation
                        new = _fresh_id(i, k, used)
                        renamed[new] = call_id
                        call_id = new
                    call["id"] = call_id
                    used.add(call_id)
                    messages.append({"role": "tool", "tool_call_id": call_id, "name": responses[k][1],
                                     "content": content_text(content)})
                    k += 1
            if k < len(responses):
                raise ConversionError(f"{where}: a response of tool {responses[k][1]!r} answers no call "
                                      "of the preceding gpt turn")
            pending = []
        else:
            raise ConversionError(f"{where}: unknown role {role!r} (expected system, human, gpt or tool)")
    for msg in messages:  # calls never answered (a response cut off by the length limit)
        for j, call in enumerate(msg.get("tool_calls", ())):
            if not call["id"]:
                call["id"] = _fresh_id(-1, j, used)
                used.add(call["id"])
    if renamed:  # a list, not a dict keyed by id, so every line has the same shape for datasets
        extra["renamed_tool_calls"] = [{"id": new, "original": old} for new, old in renamed.items()]
    return {"messages": messages, "tools": tools, "metadata": _metadata(record, extra)}


def _fresh_id(turn: int, k: int, used: set[str]) -> str:
    base = f"call_t{turn}_{k}" if turn >= 0 else f"call_unanswered_{k}"
    n, new = 0, base
    while new in used:
        n += 1
        new = f"{base}_{n}"
    return new


def _record_from(meta: dict[str, Any], conversations: list[dict[str, str]],
                 nested_keys: tuple[str, ...] | list[str]) -> dict[str, Any]:
    rec: dict[str, Any] = {}
    nested = {k: meta[k] for k in nested_keys if k in meta}
    for key, value in meta.items():
        if key not in _LEADING and "conversations" not in rec:
            rec["conversations"] = conversations
        if key in nested:
            rec.setdefault("metadata", nested)
        else:
            rec[key] = value
    rec.setdefault("conversations", conversations)
    return rec


def _tool_turn(turn: Turn) -> dict[str, str]:
    """The saved `tool` turn of an assistant turn's results, one block per answered call, in call
    order. Rendered call by call: saved ids may repeat within a turn, so they cannot pair here."""
    position = {id(c): j for j, c in enumerate(turn.tool_calls)}
    results = sorted(turn.results, key=lambda r: position[id(r.call)])
    blocks = [tool_value(Turn("", None, [r.call], [r])) for r in results]
    return {"from": "tool", "value": "\n".join(blocks)}


def to_record(item: dict[str, Any]) -> dict[str, Any]:
    """One OpenAI export line -> the saved ShareGPT record it came from. Raises ConversionError."""
    messages, tools = item.get("messages"), item.get("tools") or []
    if not isinstance(messages, list) or not messages:
        raise ConversionError("messages: missing or empty")
    meta = dict(item.get("metadata") or {})
    extra = meta.pop("sharegpt", None) or {}
    original_id = {r["id"]: r["original"] for r in extra.get("renamed_tool_calls", ())}
    conv: list[dict[str, str]] = []
    turn: Turn | None = None  # the assistant turn whose tool results are being collected
    order: dict[str, int] = {}  # export call id -> position among that turn's calls
    for i, msg in enumerate(messages):
        role = msg.get("role") if isinstance(msg, dict) else None
        if role != "tool" and turn is not None:
            if turn.results:
                conv.append(_tool_turn(turn))
            turn = None
        if role == "system":
            system = extra["system"] if "system" in extra else sharegpt_system_text(tools)
            conv.append({"from": "system", "value": system})
        elif role == "user":
            conv.append({"from": "human", "value": msg.get("content") or ""})
        elif role == "assistant":
            raw = msg.get("tool_calls") or []
            calls = [ToolCall(original_id.get(c["id"], c["id"]), c["function"]["name"], c["function"]["arguments"])
                     for c in raw]
            order = {c["id"]: j for j, c in enumerate(raw)}
            turn = Turn(msg.get("content") or "", msg.get("reasoning_content"), calls)
            conv.append({"from": "gpt", "value": gpt_value(turn)})
        elif role == "tool":
            j = order.get(msg.get("tool_call_id", ""))
            if turn is None or j is None:
                raise ConversionError(f"messages[{i}]: tool_call_id {msg.get('tool_call_id')!r} matches no call "
                                      "of the preceding assistant message")
            turn.results.append(ToolResult(turn.tool_calls[j], msg.get("content") or "", False))
        else:
            raise ConversionError(f"messages[{i}]: unknown role {role!r}")
    if turn is not None and turn.results:
        conv.append(_tool_turn(turn))
    return _record_from(meta, conv, extra.get("metadata_keys", RECORD_METADATA_KEYS))

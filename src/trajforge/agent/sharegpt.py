"""Conversion of a finished session to the saved ShareGPT trajectory (pure functions).

Format (docs/user-guide.md, "Output"): a system turn listing the offered tools inside <tools>, the human
prompt, `gpt` turns with <think> reasoning, text and <tool_call> JSON blocks, and one `tool`
turn per step holding a <tool_response> block per call, paired to its call by tool_call_id.
"""

from __future__ import annotations

from typing import Any

import orjson

from trajforge.agent.loop import SessionResult, Turn
from trajforge.agent.prompts import sharegpt_system_text
from trajforge.jsonio import dumps_str


def _arguments_value(raw: str) -> Any:
    try:
        return orjson.loads(raw) if raw.strip() else {}
    except orjson.JSONDecodeError:
        return raw  # keep what the model wrote; the error result explains it


def gpt_value(turn: Turn) -> str:
    parts: list[str] = []
    if turn.reasoning and turn.reasoning.strip():
        parts.append(f"<think>\n{turn.reasoning.strip()}\n</think>")
    if turn.content and turn.content.strip():
        parts.append(turn.content.strip())
    for call in turn.tool_calls:
        body = dumps_str({"name": call.name, "arguments": _arguments_value(call.arguments)})
        parts.append(f"<tool_call>\n{body}\n</tool_call>")
    return "\n".join(parts)


def _content_value(result: str) -> Any:
    text = result.strip()
    if text[:1] in ("{", "["):
        try:
            return orjson.loads(text)
        except orjson.JSONDecodeError:
            pass
    return result


def tool_value(turn: Turn) -> str:
    by_id = {r.call.id: r for r in turn.results}
    blocks = []
    for call in turn.tool_calls:
        res = by_id.get(call.id)
        if res is None:
            continue
        body = dumps_str({"tool_call_id": call.id, "name": call.name, "content": _content_value(res.result)})
        blocks.append(f"<tool_response>\n{body}\n</tool_response>")
    return "\n".join(blocks)


def conversations(session: SessionResult) -> list[dict[str, str]]:
    conv = [
        {"from": "system", "value": sharegpt_system_text(session.tools)},
        {"from": "human", "value": session.prompt},
    ]
    for turn in session.turns:
        conv.append({"from": "gpt", "value": gpt_value(turn)})
        if turn.results:
            conv.append({"from": "tool", "value": tool_value(turn)})
    return conv

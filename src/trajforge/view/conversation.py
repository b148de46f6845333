"""A saved ShareGPT conversation turned into display turns (pure functions).

The saved format (agent/sharegpt.py) packs structure into text: the system turn lists the
offered tools inside <tools>, a `gpt` turn holds <think> reasoning, text and <tool_call> blocks
(name and arguments, no call id), and the following `tool` turn holds one <tool_response> per
call (with the call id and name, in call order, a call without a result skipped). Here each result
is put beside the call it answers: by id when the call carries one (other generators write it),
otherwise in order, matching names, so parallel calls of one turn pair correctly even when one of
them got no result. Everything returned is plain text or JSON values; the page inserts it as text.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

import orjson

_THINK = re.compile(r"<think>\s*(.*?)\s*</think>", re.DOTALL)
_CALL = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.DOTALL)
_RESPONSE = re.compile(r"<tool_response>\s*(.*?)\s*</tool_response>", re.DOTALL)
_TOOLS = re.compile(r"<tools>\s*(.*?)\s*</tools>", re.DOTALL)
_ROLES = {"user": "human", "assistant": "gpt", "function": "tool", "ipython": "tool", "observation": "tool"}


def pretty(value: Any) -> str:
    if isinstance(value, str):
        return value
    try:
        return orjson.dumps(value, option=orjson.OPT_INDENT_2 | orjson.OPT_NON_STR_KEYS).decode()
    except TypeError:
        return repr(value)


def _json(text: str) -> Any:
    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError:
        return None


def is_error(content: Any) -> bool:
    """The failure rule of tool results (tools/base.result_failed) applied to a decoded result."""
    if isinstance(content, dict):
        return content.get("error") is not None or content.get("success") is False
    text = str(content).strip()
    return not text or text.lower().startswith("error:")


def result_view(block: Any) -> dict[str, Any]:
    """One tool result for display: `fields` (key, text) for an object result so multi-line
    outputs keep their line breaks instead of JSON escapes, else `text`."""
    content = block.get("content") if isinstance(block, dict) else block
    out: dict[str, Any] = {"id": block.get("tool_call_id") if isinstance(block, dict) else None,
                           "name": block.get("name") if isinstance(block, dict) else None,
                           "error": is_error(content)}
    if isinstance(content, dict):
        out["fields"] = [[str(k), pretty(v)] for k, v in content.items()]
    else:
        out["text"] = pretty(content)
    return out


@dataclass
class Call:
    name: str
    arguments: str
    id: str | None = None
    bad: bool = False  # the block was not the JSON object the format asks for
    result: dict[str, Any] | None = None

    def as_dict(self) -> dict[str, Any]:
        return {"name": self.name, "arguments": self.arguments, "id": self.id, "bad": self.bad,
                "result": self.result}


@dataclass
class GptTurn:
    text: str
    reasoning: list[str]
    calls: list[Call] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)


def parse_call(body: str) -> Call:
    obj = _json(body)
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return Call(name="?", arguments=body, bad=True)
    return Call(name=obj["name"], arguments=pretty(obj.get("arguments", {})), id=obj.get("id"))


def parse_gpt(value: str) -> GptTurn:
    reasoning = [m.strip() for m in _THINK.findall(value)]
    calls = [parse_call(m) for m in _CALL.findall(value)]
    text = _CALL.sub("", _THINK.sub("", value)).strip()
    return GptTurn(text, reasoning, calls)


def parse_results(value: str) -> list[dict[str, Any]]:
    blocks = _RESPONSE.findall(value)
    if not blocks:  # a tool turn in another format: the whole value is the result
        return [result_view(value)]
    return [result_view(obj if isinstance(obj := _json(b), dict) else b) for b in blocks]


def pair(calls: list[Call], results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Attach each result to its call; return the results that answer no call."""
    orphans: list[dict[str, Any]] = []
    by_id = {c.id: c for c in calls if c.id}
    pos = 0
    for res in results:
        call = by_id.get(res["id"]) if res["id"] else None
        if call is None or call.result is not None:
            call = None
            for j in range(pos, len(calls)):  # in order: the next unanswered call of that name
                c = calls[j]
                if c.result is None and (res["name"] is None or c.name == res["name"]):
                    call, pos = c, j + 1
                    break
        if call is None:
            orphans.append(res)
        else:
            call.result = res
    return orphans


def parse_system(value: str) -> dict[str, Any]:
    tools: list[dict[str, Any]] = []
    # The preamble itself mentions "<tools> </tools>": take the block that holds the JSON list.
    listed = next((x for m in _TOOLS.finditer(value) if isinstance(x := _json(m.group(1)), list)), None)
    if isinstance(listed, list):
        for t in listed:
            fn = t.get("function", t) if isinstance(t, dict) else {}
            if isinstance(fn, dict):
                tools.append({"name": str(fn.get("name", "?")), "description": str(fn.get("description", "")),
                              "parameters": pretty(fn.get("parameters", {}))})
    return {"kind": "system", "text": value, "tools": tools}


def _turn_extra(turn: dict[str, Any]) -> dict[str, Any]:
    """Per-turn figures some writers add (tokens, usage): shown when present."""
    return {k: turn[k] for k in ("tokens", "usage", "token_count") if k in turn}


def display_turns(conversation: Any) -> list[dict[str, Any]]:
    """The conversation as display turns: system, human, gpt (with calls and their results), tool
    (only results that answer no call), other."""
    out: list[dict[str, Any]] = []
    last_gpt: dict[str, Any] | None = None
    pending: list[Call] = []
    for raw in conversation if isinstance(conversation, list) else []:
        if not isinstance(raw, dict):
            continue
        role = str(raw.get("from", raw.get("role", "?")))
        role = _ROLES.get(role, role)
        value = raw.get("value", raw.get("content", ""))
        value = value if isinstance(value, str) else pretty(value)
        extra = _turn_extra(raw)
        if role == "system":
            out.append({**parse_system(value), **extra})
        elif role == "gpt":
            g = parse_gpt(value)
            pending = g.calls
            last_gpt = {"kind": "gpt", "text": g.text, "reasoning": g.reasoning, "calls": g.calls, **extra}
            out.append(last_gpt)
        elif role == "tool":
            orphans = pair(pending, parse_results(value))
            if orphans or last_gpt is None:
                out.append({"kind": "tool", "results": orphans, **extra})
        else:
            out.append({"kind": "human" if role == "human" else "other", "role": role, "text": value, **extra})
    for t in out:
        if t["kind"] == "gpt":
            t["calls"] = [c.as_dict() for c in t["calls"]]
    return out

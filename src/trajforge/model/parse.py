"""Pure text logic that normalises what models write: reasoning and Hermes-style tool calls.

Providers hand back reasoning in several shapes (a `reasoning` / `reasoning_content` string,
a `reasoning_details` list, or `<think>` / `<REASONING_SCRATCHPAD>` blocks inside the content),
and models served without native function calling write `<tool_call>{json}</tool_call>` blocks
as plain text. This module turns all of those into one visible content string, one reasoning
string and a list of ToolCall objects. No I/O and no event loop, so it is unit-tested directly.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from typing import Any

from trajforge.model.types import ToolCall

INVALID_TOOL_NAME = "invalid_tool_call"

_REASONING_TAGS = ("think", "REASONING_SCRATCHPAD")
_BLOCK = re.compile(r"<(think|REASONING_SCRATCHPAD)>(.*?)</\1>", re.DOTALL)
# A block whose closing tag never came (the response hit max_tokens mid-thought).
_UNCLOSED = re.compile(r"<(think|REASONING_SCRATCHPAD)>(.*)\Z", re.DOTALL)
# Hermes calls; the last block may lack its closing tag when the model stops right after the JSON.
_TOOL_CALL = re.compile(r"<tool_call>(.*?)(?:</tool_call>|\Z)", re.DOTALL)
_NAME = re.compile(r'"name"\s*:\s*"([^"\\]+)"')


def join_reasoning(parts: Iterable[str | None]) -> str | None:
    """Non-empty reasoning pieces joined by blank lines, duplicates dropped; None when nothing is left."""
    kept: list[str] = []
    for part in parts:
        text = (part or "").strip()
        if text and text not in kept:  # providers often repeat one text in two fields
            kept.append(text)
    return "\n\n".join(kept) if kept else None


def split_reasoning(content: str | None) -> tuple[str, str | None]:
    """Remove reasoning blocks from `content`; return (visible content, reasoning or None)."""
    if not content:
        return "", None
    parts: list[str] = []
    # Templates that put the opening <think> in the prompt leave only the closing tag in the output.
    for tag in _REASONING_TAGS:
        close = f"</{tag}>"
        head, sep, rest = content.partition(close)
        if sep and f"<{tag}>" not in head:
            parts.append(head)
            content = rest
    parts.extend(m.group(2) for m in _BLOCK.finditer(content))
    content = _BLOCK.sub("", content)
    unclosed = _UNCLOSED.search(content)
    if unclosed:
        parts.append(unclosed.group(2))
        content = content[: unclosed.start()]
    return content.strip(), join_reasoning(parts)


def _details_text(details: Any) -> list[str]:
    texts: list[str] = []
    if not isinstance(details, list):
        return texts
    for item in details:
        if isinstance(item, Mapping):
            # reasoning.text carries `text`, reasoning.summary carries `summary`; encrypted carries neither.
            for key in ("text", "summary"):
                value = item.get(key)
                if isinstance(value, str):
                    texts.append(value)
        elif isinstance(item, str):
            texts.append(item)
    return texts


def reasoning_from_message(extra: Mapping[str, Any]) -> str | None:
    """Reasoning text from a message's provider-specific fields, or None when there is none."""
    parts: list[str | None] = []
    for key in ("reasoning", "reasoning_content"):
        value = extra.get(key)
        if isinstance(value, str):
            parts.append(value)
    parts.extend(_details_text(extra.get("reasoning_details")))
    return join_reasoning(parts)


def arguments_text(arguments: Any) -> str:
    """Tool-call arguments as JSON text, whether the model sent a string, an object or nothing."""
    if arguments is None:
        return "{}"
    if isinstance(arguments, str):
        return arguments  # already JSON text (some models double-encode); the agent validates it
    return json.dumps(arguments, ensure_ascii=False)


def _calls_from_block(raw: str) -> list[tuple[str, str]]:
    """(name, arguments) pairs from one block's text; a malformed block still yields one pair."""
    try:
        data = json.loads(raw)
    except ValueError:
        data = None
    items = data if isinstance(data, list) else [data]
    pairs: list[tuple[str, str]] = []
    for item in items:
        if isinstance(item, dict) and isinstance(item.get("name"), str) and item["name"]:
            args = item.get("arguments", item.get("parameters"))
            pairs.append((item["name"], arguments_text(args)))
        else:
            # Keep the call so the agent can tell the model what was wrong instead of dropping it.
            found = _NAME.search(raw)
            return [(found.group(1) if found else INVALID_TOOL_NAME, raw)]
    return pairs


def extract_hermes_tool_calls(content: str | None, start: int = 1) -> tuple[str, list[ToolCall]]:
    """Turn `<tool_call>{...}</tool_call>` blocks into ToolCalls (ids call_<start>, call_<start+1>, ...).

    Returns the content with the blocks removed, and the calls in the order written.
    """
    if not content or "<tool_call>" not in content:
        return (content or "").strip(), []
    calls: list[ToolCall] = []
    for match in _TOOL_CALL.finditer(content):
        for name, args in _calls_from_block(match.group(1).strip()):
            calls.append(ToolCall(id=f"call_{start + len(calls)}", name=name, arguments=args))
    remaining = _TOOL_CALL.sub("", content)
    return remaining.strip(), calls


def content_text(content: Any) -> str:
    """Message content as one string: providers may send None, a string, or a list of parts."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = []
        for part in content:
            if isinstance(part, Mapping) and isinstance(part.get("text"), str):
                texts.append(part["text"])
            elif isinstance(part, str):
                texts.append(part)
        return "".join(texts)
    return str(content)

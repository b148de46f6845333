"""Parsing the Hermes-style text of saved ShareGPT turns (pure): the pieces export.convert needs.

A saved `gpt` value is `<think>` reasoning, text and one-line `<tool_call>` JSON blocks joined by
newlines; a `tool` value is one-line `<tool_response>` blocks; the system turn lists the offered
tools inside `<tools>` (agent.sharegpt, agent.prompts write them). The value helpers map a saved
(parsed) arguments/result value to the OpenAI string that agent.sharegpt turns back into it.
"""

from __future__ import annotations

import functools
import re
from typing import Any

import orjson

from trajforge.agent.prompts import sharegpt_system_text
from trajforge.jsonio import dumps_str

THINK_OPEN, THINK_CLOSE = "<think>\n", "\n</think>"
_CALL_OPEN, _CALL_CLOSE = "<tool_call>\n", "\n</tool_call>"
_TOOL_RESPONSE = re.compile(r"<tool_response>\n([^\n]*)\n</tool_response>")
_TOOLS_BLOCK = re.compile(r"<tools>\n([^\n]*)\n</tools>")


class ConversionError(ValueError):
    """A record that cannot be converted; the message names the turn and what is wrong.
    `line` is the input line when the error surfaces after the line was read (a row group)."""

    def __init__(self, message: str, line: int | None = None) -> None:
        super().__init__(message)
        self.line = line


def _parses(text: str) -> bool:
    try:
        orjson.loads(text)
    except orjson.JSONDecodeError:
        return False
    return True


def arguments_text(value: Any) -> str:
    """The OpenAI `arguments` string of a saved call. The record holds the parsed arguments, or
    the model's raw text when it was not JSON; a string that is itself valid JSON (double-encoded
    arguments) is JSON-encoded again so the reverse gets the same string back."""
    if isinstance(value, str) and not _parses(value):
        return value
    return dumps_str(value)


def content_text(value: Any) -> str:
    """The OpenAI tool message `content` of a saved result (a parsed JSON result, or raw text)."""
    return value if isinstance(value, str) else dumps_str(value)


def split_gpt(value: str) -> tuple[str | None, str, list[tuple[str, Any]]]:
    """A saved `gpt` value -> (reasoning, text, [(tool name, arguments value)]).

    Tool call blocks are taken from the end (each one line of JSON), reasoning from the start."""
    calls: list[tuple[str, Any]] = []
    rest = value
    while rest.endswith(_CALL_CLOSE):
        end = len(rest) - len(_CALL_CLOSE)
        start = rest.rfind(_CALL_OPEN, 0, end)
        if start == -1 or (start > 0 and rest[start - 1] != "\n"):
            break
        body = rest[start + len(_CALL_OPEN):end]
        if "\n" in body:
            break
        try:
            call = orjson.loads(body)
        except orjson.JSONDecodeError:
            break
        if not (isinstance(call, dict) and isinstance(call.get("name"), str) and "arguments" in call):
            break
        calls.append((call["name"], call["arguments"]))
        rest = rest[:max(start - 1, 0)]
    calls.reverse()
    reasoning = None
    if rest.startswith(THINK_OPEN):
        end = rest.find(THINK_CLOSE, len(THINK_OPEN))
        after = end + len(THINK_CLOSE)
        if end != -1 and (after == len(rest) or rest[after] == "\n"):
            reasoning = rest[len(THINK_OPEN):end]
            rest = rest[after + 1:]
    return reasoning, rest, calls


def split_tool(value: str, where: str) -> list[tuple[str, str, Any]]:
    """A saved `tool` value -> [(tool_call_id, name, content value)] in call order."""
    out = []
    for m in _TOOL_RESPONSE.finditer(value):
        try:
            body = orjson.loads(m.group(1))
        except orjson.JSONDecodeError as e:
            raise ConversionError(f"{where}: a <tool_response> block is not JSON: {e}") from None
        if not (isinstance(body, dict) and isinstance(body.get("name"), str) and "content" in body):
            raise ConversionError(f"{where}: a <tool_response> block lacks name or content")
        out.append((str(body.get("tool_call_id") or ""), body["name"], body["content"]))
    if not out:
        raise ConversionError(f"{where}: a tool turn without any <tool_response> block")
    return out


def tools_of(system: str) -> list[dict[str, Any]] | None:
    """The offered tool schemas (OpenAI `tools` entries) listed in a saved system turn."""
    m = _TOOLS_BLOCK.search(system)
    if m is None:
        return None
    try:
        functions = orjson.loads(m.group(1))
    except orjson.JSONDecodeError:
        return None
    if not isinstance(functions, list) or not all(isinstance(f, dict) for f in functions):
        return None
    return [{"type": "function", "function": f} for f in functions]


@functools.lru_cache(maxsize=64)
def system_info(value: str) -> tuple[list[dict[str, Any]], bool]:
    """(tools, whether the turn is exactly the standard preamble) of a system turn. Cached: a run
    has a few distinct tool sets, and parsing a ~3 KB turn per record would dominate."""
    tools = tools_of(value) or []
    return tools, sharegpt_system_text(tools) == value

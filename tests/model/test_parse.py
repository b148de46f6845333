"""Unit tests of model/parse.py: reasoning shapes and Hermes-style text tool calls (no event loop)."""

from __future__ import annotations

import json

import pytest

from trajforge.model.parse import (
    INVALID_TOOL_NAME, arguments_text, content_text, extract_hermes_tool_calls, join_reasoning,
    reasoning_from_message, split_reasoning,
)


# --- split_reasoning ---------------------------------------------------------------------------

def test_split_reasoning_without_blocks_keeps_content() -> None:
    assert split_reasoning("  just an answer \n") == ("just an answer", None)
    assert split_reasoning(None) == ("", None)
    assert split_reasoning("") == ("", None)


@pytest.mark.parametrize("tag", ["think", "REASONING_SCRATCHPAD"])
def test_split_reasoning_removes_block(tag: str) -> None:
    content, reasoning = split_reasoning(f"<{tag}>\nstep 1\nstep 2\n</{tag}>\nThe answer is 4.")
    assert content == "The answer is 4."
    assert reasoning == "step 1\nstep 2"


def test_split_reasoning_collects_several_blocks_in_order() -> None:
    content, reasoning = split_reasoning(
        "<think>first</think>Hello <REASONING_SCRATCHPAD>second</REASONING_SCRATCHPAD>world<think>third</think>")
    assert content == "Hello world"
    assert reasoning == "first\n\nsecond\n\nthird"


def test_split_reasoning_unclosed_block_is_reasoning() -> None:
    content, reasoning = split_reasoning("Partial answer <think>I was cut off mid tho")
    assert content == "Partial answer"
    assert reasoning == "I was cut off mid tho"


def test_split_reasoning_orphan_closing_tag() -> None:
    # Chat templates that open <think> in the prompt leave only the closing tag in the output.
    content, reasoning = split_reasoning("the user wants a list\n</think>\n\n- a\n- b")
    assert content == "- a\n- b"
    assert reasoning == "the user wants a list"


def test_split_reasoning_empty_block_gives_no_reasoning() -> None:
    assert split_reasoning("<think>\n\n</think>Answer") == ("Answer", None)


def test_join_reasoning_drops_empties_and_duplicates() -> None:
    assert join_reasoning(["a", None, " ", "a", "b"]) == "a\n\nb"
    assert join_reasoning([]) is None


# --- reasoning_from_message --------------------------------------------------------------------

@pytest.mark.parametrize("field", ["reasoning", "reasoning_content"])
def test_reasoning_string_fields(field: str) -> None:
    assert reasoning_from_message({field: "because"}) == "because"


def test_reasoning_details_text_and_summary() -> None:
    extra = {"reasoning_details": [
        {"type": "reasoning.summary", "summary": "short version"},
        {"type": "reasoning.encrypted", "data": "opaque-bytes"},
        {"type": "reasoning.text", "text": "long version"},
    ]}
    assert reasoning_from_message(extra) == "short version\n\nlong version"


def test_reasoning_same_text_in_two_fields_is_not_doubled() -> None:
    extra = {"reasoning": "thought", "reasoning_details": [{"type": "reasoning.text", "text": "thought"}]}
    assert reasoning_from_message(extra) == "thought"


def test_no_reasoning_fields() -> None:
    assert reasoning_from_message({}) is None
    assert reasoning_from_message({"reasoning": None, "reasoning_details": None, "other": 1}) is None
    assert reasoning_from_message({"reasoning": ""}) is None


# --- extract_hermes_tool_calls -----------------------------------------------------------------

def test_single_hermes_call() -> None:
    text = 'Let me look.\n<tool_call>\n{"name": "terminal", "arguments": {"command": "ls -la"}}\n</tool_call>'
    content, calls = extract_hermes_tool_calls(text)
    assert content == "Let me look."
    assert len(calls) == 1
    assert calls[0].id == "call_1"
    assert calls[0].name == "terminal"
    assert json.loads(calls[0].arguments) == {"command": "ls -la"}


def test_several_hermes_calls_get_sequential_ids() -> None:
    text = ('<tool_call>{"name": "read_file", "arguments": {"path": "a.py"}}</tool_call>\n'
            '<tool_call>{"name": "read_file", "arguments": "{\\"path\\": \\"b.py\\"}"}</tool_call>')
    content, calls = extract_hermes_tool_calls(text)
    assert content == ""
    assert [c.id for c in calls] == ["call_1", "call_2"]
    assert [c.name for c in calls] == ["read_file", "read_file"]
    # Arguments given as a JSON string are passed through as that string.
    assert json.loads(calls[1].arguments) == {"path": "b.py"}


def test_hermes_ids_start_where_asked() -> None:
    _, calls = extract_hermes_tool_calls('<tool_call>{"name": "x", "arguments": {}}</tool_call>', start=5)
    assert calls[0].id == "call_5"


def test_hermes_missing_arguments_become_empty_object() -> None:
    _, calls = extract_hermes_tool_calls('<tool_call>{"name": "browser_back"}</tool_call>')
    assert calls[0].name == "browser_back"
    assert calls[0].arguments == "{}"


def test_hermes_list_in_one_block() -> None:
    text = '<tool_call>[{"name": "a", "arguments": {"x": 1}}, {"name": "b", "parameters": {"y": 2}}]</tool_call>'
    _, calls = extract_hermes_tool_calls(text)
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [("a", {"x": 1}), ("b", {"y": 2})]


def test_malformed_hermes_call_keeps_name_and_raw_text() -> None:
    raw = '{"name": "terminal", "arguments": {"command": "echo "hi""}}'
    content, calls = extract_hermes_tool_calls(f"ok <tool_call>{raw}</tool_call>")
    assert content == "ok"
    assert len(calls) == 1
    assert calls[0].name == "terminal"
    assert calls[0].arguments == raw


def test_malformed_hermes_call_without_name() -> None:
    _, calls = extract_hermes_tool_calls("<tool_call>not json at all</tool_call>")
    assert calls[0].name == INVALID_TOOL_NAME
    assert calls[0].arguments == "not json at all"


def test_unclosed_last_hermes_block_is_still_a_call() -> None:
    content, calls = extract_hermes_tool_calls('Running it.\n<tool_call>\n{"name": "terminal", "arguments": {"command": "pwd"}}')
    assert content == "Running it."
    assert calls[0].name == "terminal"
    assert json.loads(calls[0].arguments) == {"command": "pwd"}


def test_no_hermes_blocks() -> None:
    assert extract_hermes_tool_calls("plain text") == ("plain text", [])
    assert extract_hermes_tool_calls(None) == ("", [])


# --- helpers -----------------------------------------------------------------------------------

def test_content_text_shapes() -> None:
    assert content_text(None) == ""
    assert content_text("abc") == "abc"
    assert content_text([{"type": "text", "text": "a"}, {"type": "image_url"}, {"type": "text", "text": "b"}]) == "ab"


def test_arguments_text_shapes() -> None:
    assert arguments_text(None) == "{}"
    assert arguments_text('{"a": 1}') == '{"a": 1}'
    assert json.loads(arguments_text({"a": "é"})) == {"a": "é"}

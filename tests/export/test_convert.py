"""The pure parts of the export: record <-> OpenAI messages, filters, splits, card scrubbing.

Records are built exactly as the runner builds them (agent.record.build_record over agent.loop
values), including awkward ones: ids reused across turns, arguments that are not JSON or are a
JSON string, text and list results, calls cut off by the length limit, tag-like text in content.
"""

from __future__ import annotations

import random
import re
from datetime import datetime

import pytest

from trajforge.agent.loop import SessionResult, ToolResult, Turn
from trajforge.agent.record import build_record
from trajforge.errors import UsageError
from trajforge.export.card import scrub
from trajforge.export.convert import ConversionError, to_openai, to_record
from trajforge.export.filters import Filters, parse_split, unit_hash
from trajforge.jsonio import dumps
from trajforge.model.types import ToolCall, Usage
from trajforge.tools.toolsets import KNOWN_TOOLS

TOOLS = [{"type": "function", "function": {"name": n, "description": f"the {n} tool",
                                           "parameters": {"type": "object", "properties": {"x": {"type": "string"}}}}}
         for n in ("terminal", "read_file")]
WORDS = ["plain", "ünïcode ✓", "</think>", "<think>\nx\n</think>", "<tool_call>", "{\"a\": 1}", "[1, 2]",
         "line\nbreak", "  padded  ", "\"quoted\"", "", "null", "tab\there"]


def record(turns: list[Turn], prompt: str = "do the task", index: int = 0, sid: str = "abc:0") -> dict:
    session = SessionResult(prompt, TOOLS, turns, completed=True, partial=False, api_calls=len(turns),
                            usage=Usage(3, 4, 1, 0.002), end_reason="answer")
    return build_record(session, prompt_index=index, sample_id=sid,
                        batch_num=0, model="m", toolsets_used=["terminal"], known_tools=KNOWN_TOOLS,
                        now=datetime(2026, 1, 1))


def turn(content: str, reasoning: str | None, calls: list[tuple[str, str, str]], results: list[str | None]) -> Turn:
    tc = [ToolCall(i, n, a) for i, n, a in calls]
    return Turn(content, reasoning, tc, [ToolResult(c, r, r.startswith('{"error"')) for c, r in zip(tc, results)
                                         if r is not None])


def check_pairs(item: dict) -> None:
    seen: list[str] = []
    for m in item["messages"]:
        seen += [c["id"] for c in m.get("tool_calls", [])]
        if m["role"] == "tool":
            assert seen.count(m["tool_call_id"]) == 1
    assert len(seen) == len(set(seen))


def roundtrip(rec: dict) -> None:
    for mode in ("field", "inline"):
        item = to_openai(rec, mode)  # type: ignore[arg-type]
        check_pairs(item)
        assert dumps(to_record(item)) == dumps(rec), mode


def test_awkward_records_round_trip_exactly() -> None:
    rec = record([
        turn("", "first thought", [("call_1", "terminal", '{"x": "ls"}'), ("call_2", "terminal", "not json {")],
             ['{"output": "a"}', '{"error": "bad arguments"}']),
        turn("text and calls", None, [("call_1", "read_file", '"{\\"x\\": \\"double\\"}"'), ("", "terminal", "")],
             ["plain text result", "[1, 2, 3]"]),
        turn("cut off", "r", [("call_9", "terminal", '{"x": "never run"}')], []),
    ])
    roundtrip(rec)
    item = to_openai(rec)
    assistant = [m for m in item["messages"] if m["role"] == "assistant"]
    assert [c["function"]["arguments"] for c in assistant[0]["tool_calls"]] == ['{"x":"ls"}', "not json {"]
    assert assistant[1]["tool_calls"][0]["function"]["arguments"] == '"{\\"x\\": \\"double\\"}"'
    assert assistant[1]["tool_calls"][1]["function"]["arguments"] == "{}"  # empty arguments are saved as {}
    assert assistant[1]["tool_calls"][0]["id"] != "call_1"  # reused id renamed, original kept for the reverse
    assert item["metadata"]["sharegpt"]["renamed_tool_calls"] == [
        {"id": assistant[1]["tool_calls"][0]["id"], "original": "call_1"},
        {"id": assistant[1]["tool_calls"][1]["id"], "original": ""}]
    assert assistant[2]["tool_calls"][0]["id"]  # an unanswered call still gets an id
    tools = [m for m in item["messages"] if m["role"] == "tool"]
    assert [t["content"] for t in tools] == ['{"output":"a"}', '{"error":"bad arguments"}', "plain text result",
                                            "[1,2,3]"]
    assert item["tools"] == TOOLS
    assert item["metadata"]["model"] == "m" and "conversations" not in item["metadata"]


def test_random_records_round_trip_exactly() -> None:
    rng = random.Random(7)
    for n in range(300):
        turns = []
        for t in range(rng.randint(1, 4)):
            args = [f'{{"x": "{t}"}}', "oops", '"s"', '"12"', '"{\\"k\\": 1}"', "", "[1]", "{}"]
            calls = [(rng.choice(["call_1", "call_2", f"c{t}{k}", ""]), rng.choice(["terminal", "read_file"]),
                      rng.choice(args)) for k in range(rng.randint(0, 3))]
            results = [rng.choice(WORDS + ['{"output": "o"}', '{"error": "e"}']) for _ in calls]
            if calls and rng.random() < 0.2:
                results = [None] * len(calls)  # cut off by the length limit
            turns.append(turn(rng.choice(WORDS), rng.choice([None, *WORDS]), calls, results))
        rec = record(turns, prompt=rng.choice(WORDS) or "p", index=n, sid=f"s{n}:0")
        roundtrip(rec)


def test_reasoning_modes() -> None:
    rec = record([turn("answer", "why", [], [])])
    msg = to_openai(rec)["messages"][2]
    assert msg == {"role": "assistant", "content": "answer", "reasoning_content": "why"}
    assert to_openai(rec, "inline")["messages"][2] == {"role": "assistant", "content": "<think>\nwhy\n</think>\nanswer"}
    dropped = to_openai(rec, "drop")
    assert dropped["messages"][2] == {"role": "assistant", "content": "answer"}
    assert to_record(dropped)["conversations"][2] == {"from": "gpt", "value": "answer"}


def test_custom_system_turn_and_foreign_record_shapes_survive() -> None:
    rec = {"conversations": [{"from": "system", "value": "You are helpful."}, {"from": "human", "value": "hi"},
                             {"from": "gpt", "value": "hello"}], "id": 5, "metadata": {"source": "elsewhere"}}
    item = to_openai(rec)
    assert item["tools"] == [] and item["metadata"]["source"] == "elsewhere"
    assert dumps(to_record(item)) == dumps(rec)


@pytest.mark.parametrize("conv, message", [
    ([{"from": "human", "value": "q"}, {"from": "tool", "value": "no blocks"}], "without any <tool_response>"),
    ([{"from": "human", "value": "q"}, {"from": "robot", "value": "x"}], "unknown role 'robot'"),
    ([{"from": "gpt", "value": "no calls"},
      {"from": "tool", "value": '<tool_response>\n{"tool_call_id":"a","name":"terminal","content":"x"}\n'
                                '</tool_response>'}], "answers no call"),
    ([{"from": "human"}], "conversations[0]: not a {from, value} turn"),
])
def test_unconvertible_records_name_the_turn(conv: list, message: str) -> None:
    with pytest.raises(ConversionError, match=re.escape(message)):
        to_openai({"conversations": conv})


def test_openai_line_with_an_unknown_tool_call_id_is_refused() -> None:
    item = {"messages": [{"role": "user", "content": "q"}, {"role": "tool", "tool_call_id": "x", "content": "r"}]}
    with pytest.raises(ConversionError, match=r"messages\[1\]: tool_call_id 'x' matches no call"):
        to_record(item)


def test_split_parsing() -> None:
    assert parse_split("train=0.95,test=0.05") == [("train", 0.95), ("test", 0.05)]
    for bad, msg in (("train=0.9", "add up to 0.9"), ("train", "name=fraction"), ("a=0.5,a=0.5", "named twice"),
                     ("a=x,b=1", "must be a number"), ("a=0,b=1", "more than 0"), ("/x=1", "name=fraction")):
        with pytest.raises(UsageError, match=msg):
            parse_split(bad)


def test_splits_and_sampling_are_deterministic_and_proportional() -> None:
    f = Filters(split=(("train", 0.9), ("val", 0.05), ("test", 0.05)), sample_percent=30, seed=1)
    recs = [{"sample_id": f"id{i}:0", "completed": True} for i in range(20000)]
    splits = [f.split_of(r) for r in recs]
    assert splits == [f.split_of(r) for r in recs]
    assert abs(splits.count("train") / len(recs) - 0.9) < 0.01 and abs(splits.count("test") / len(recs) - 0.05) < 0.01
    kept = [r for r in recs if f.reject(r, lambda _: None) is None]
    assert abs(len(kept) / len(recs) - 0.3) < 0.015
    other = Filters(sample_percent=30, seed=2)
    assert {r["sample_id"] for r in kept} != {r["sample_id"] for r in recs if other.reject(r, lambda _: None) is None}
    assert 0 <= unit_hash("a") < 1 and unit_hash("a") == unit_hash("a") != unit_hash("b")


def test_filter_reasons() -> None:
    rec = {"sample_id": "s", "completed": False, "tool_stats": {"terminal": {"count": 2}},
           "verification": {"passed": False}}
    assert Filters(only="completed").reject(rec, lambda _: None) == "not completed"
    assert Filters(only="passed").reject(rec, lambda _: None) == "not passed"
    assert Filters(only="passed").reject({"sample_id": "s"}, lambda _: None) == "not verified"
    assert Filters(min_tool_calls=3).reject(rec, lambda _: None) == "fewer than 3 tool calls"
    assert Filters(min_tool_calls=2).reject(rec, lambda _: None) is None
    assert Filters(task_type="code").reject(rec, lambda _: "math") == "task type is not code"
    assert Filters(only="passed").reject({**rec, "verification": {"passed": True}}, lambda _: None) is None


def test_card_scrubs_secrets_but_keeps_settings() -> None:
    cfg = {"api_key": "sk-abc", "model": "m", "max_tokens": 5, "base_url": "https://u:p@h.example:8443/v1?key=z",
           "tools": {"web": {"brave_api_key_env": "BRAVE_API_KEY", "token": "t", "headers": ["Bearer xyz"]}}}
    assert scrub(cfg) == {"model": "m", "max_tokens": 5, "base_url": "https://h.example:8443/v1",
                          "tools": {"web": {"brave_api_key_env": "BRAVE_API_KEY", "headers": ["<removed>"]}}}


def test_rollouts_of_one_prompt_share_a_split() -> None:
    f = Filters(split=(("train", 0.5), ("test", 0.5)))
    for row in range(200):
        assert len({f.split_of({"sample_id": f"row{row}:0" + (f"#{k}" if k else "")}) for k in range(4)}) == 1


def test_card_shows_the_run_verification_figures() -> None:
    from trajforge.export.card import render
    from trajforge.runner.reporting.stats import Totals

    run = Totals().as_dict(total=3)
    run["verification"] = {"verified": 4, "passed": 3, "failed": 1, "pass_rate": 0.75, "errors": 1,
                           "by_task_type": {"qa": {"passed": 1, "failed": 1, "pass_rate": 0.5}},
                           "pass_at_1": 0.75, "pass_at_k": {"k": 4, "value": 1.0}, "rows": 2}
    text = render(name="r", command="trajforge export r --format hf --output o", counts={"": 0},
                  exported=Totals().as_dict(), verified=(0, 0), drops=[], schema_doc="-", config={"api_key": "k"},
                  statistics={"run": run})
    for line in ("| pass rate | 75.0% (3 passed, 1 failed) |", "| pass rate: qa | 50.0% |",
                 "| pass@1 / pass@4 (2 rows with a verdict) | 0.75 / 1.0 |", "| verification errors | 1 |"):
        assert line in text
    assert "api_key" not in text

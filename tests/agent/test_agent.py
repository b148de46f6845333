"""The agent loop against the scripted server, with real tools in a real temporary workspace."""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path

import pytest

from tests.support.scripted_server import ScriptedServer, chat, tool_call
from trajforge.agent.args import parse_arguments
from trajforge.agent.loop import SessionResult, run_session
from trajforge.agent.record import build_record
from trajforge.agent.sharegpt import conversations
from trajforge.config import RunConfig
from trajforge.model.client import OpenAIClient
from trajforge.model.types import ModelSettings
from trajforge.sandbox.backends.local.local_sandbox import LocalSandbox
from trajforge.tools import files, terminal
from trajforge.tools.tool import ToolContext
from trajforge.tools.toolsets import KNOWN_TOOLS


def run(server: ScriptedServer, tmp_path: Path, prompt: str = "do it", **kw) -> SessionResult:
    async def go() -> SessionResult:
        settings = RunConfig(tool_timeout=10).tool_settings()
        tools = (await terminal.build(settings)).tools + (await files.build(settings)).tools
        client = OpenAIClient(ModelSettings(model="m", base_url=server.url, max_retries=0), "k")
        sb = LocalSandbox(tmp_path)
        await sb.start()
        try:
            ctx = ToolContext(sb, settings, "id")
            async with ctx.cleanup:
                return await run_session(prompt, client, tools, ctx, max_turns=kw.pop("max_turns", 5), **kw)
        finally:
            await sb.close()
            await client.aclose()

    return asyncio.run(go())


def tool_contents(server: ScriptedServer) -> list[dict]:
    last = server.chat_requests()[-1]
    return [json.loads(m["content"]) for m in last["messages"] if m["role"] == "tool"]


def test_echo_write_read_and_answer(server: ScriptedServer, tmp_path: Path) -> None:
    server.script(
        chat(None, reasoning="run echo", tool_calls=[tool_call("terminal", {"command": "echo tok-42"}, "c1")]),
        chat(None, reasoning="write then read", tool_calls=[
            tool_call("write_file", {"path": "a.txt", "content": "hello file"}, "c2"),
            tool_call("read_file", {"path": "a.txt"}, "c3")]),
        chat("All done", reasoning="finish"),
    )
    session = run(server, tmp_path)
    assert session.completed and not session.partial and session.api_calls == 3
    conv = conversations(session)
    assert [t["from"] for t in conv] == ["system", "human", "gpt", "tool", "gpt", "tool", "gpt"]
    assert "tok-42" in conv[3]["value"]
    assert conv[5]["value"].count("<tool_response>") == 2 and "hello file" in conv[5]["value"]
    blocks = [json.loads(b) for b in re.findall(r"<tool_response>\n(.*?)\n</tool_response>", conv[5]["value"])]
    assert [b["tool_call_id"] for b in blocks] == ["c2", "c3"]
    rec = build_record(session, prompt_index=0, sample_id="x:0", batch_num=0, model="m",
                       toolsets_used=["terminal", "file"], known_tools=KNOWN_TOOLS)
    assert rec["tool_stats"]["terminal"]["success"] == 1 and rec["tool_stats"]["read_file"]["count"] == 1
    assert set(rec["tool_stats"]) == set(KNOWN_TOOLS)
    offered = {t["function"]["name"] for t in server.chat_requests()[0]["tools"]}
    assert offered == {"terminal", "process", "read_file", "write_file", "patch", "search_files"}


def test_model_mistakes_become_error_results(server: ScriptedServer, tmp_path: Path) -> None:
    server.script(
        chat(None, tool_calls=[tool_call("terminal", "{not json", "c1"), tool_call("nope_tool", {}, "c2"),
                               tool_call("read_file", {}, "c3"), tool_call("terminal", {"command": 5}, "c4")]),
        chat("ok"),
    )
    session = run(server, tmp_path)
    errors = [c["error"] for c in tool_contents(server)]
    assert "invalid JSON" in errors[0]
    assert "unknown tool 'nope_tool'" in errors[1]
    assert "missing required argument(s): path" in errors[2]
    assert "must be of type string" in errors[3]
    assert all(r.failed for r in session.turns[0].results)
    rec = build_record(session, prompt_index=0, sample_id="x:0", batch_num=0, model="m", toolsets_used=[],
                       known_tools=KNOWN_TOOLS)
    assert rec["tool_stats"]["unoffered:nope_tool"]["failure"] == 1  # makes the corrupt-entry filter drop it
    assert rec["tool_error_counts"]["terminal"] == 2


def test_calls_sharing_an_id_each_keep_their_result(server: ScriptedServer, tmp_path: Path) -> None:
    """A provider that repeats a tool call id (or omits one) in one reply: every call still gets
    its own id, its own result, and its own <tool_response> in the ShareGPT turn."""
    server.script(
        chat(None, tool_calls=[tool_call("terminal", {"command": "echo first-1"}, "dup"),
                               tool_call("terminal", {"command": "echo second-2"}, "dup"),
                               tool_call("terminal", {"command": "echo third-3"}, "call_2")]),
        chat("done"),
    )
    session = run(server, tmp_path)
    ids = [c.id for c in session.turns[0].tool_calls]
    assert len(set(ids)) == 3 and ids[0] == "dup", ids
    sent = server.chat_requests()[-1]["messages"]
    assistant = next(m for m in sent if m["role"] == "assistant")
    assert [tc["id"] for tc in assistant["tool_calls"]] == ids  # the provider sees the same ids back
    assert [m["tool_call_id"] for m in sent if m["role"] == "tool"] == ids
    conv = conversations(session)
    tool_turn = next(t for t in conv if t["from"] == "tool")["value"]
    assert all(word in tool_turn for word in ("first-1", "second-2", "third-3")), tool_turn


def test_length_and_max_turns_are_partial(server: ScriptedServer, tmp_path: Path) -> None:
    server.script(chat("cut", finish_reason="length"))
    s = run(server, tmp_path)
    assert s.partial and not s.completed and s.end_reason == "length"
    server.handler = lambda req: chat(None, tool_calls=[tool_call("terminal", {"command": "true"})])
    s = run(server, tmp_path, max_turns=3)
    assert s.partial and s.api_calls == 3 and s.end_reason == "max_turns"


def test_a_hostile_model_cannot_make_one_sample_hold_without_bound(server: ScriptedServer, tmp_path: Path) -> None:
    # 3,000 read_file calls in one reply once ran every one and kept every result: 2 GB in the
    # runner, a 284 MB request and a 569 MB record for one sample. Now calls past the per-reply
    # cap are answered without running, and a sample whose results pass MAX_TOOL_OUTPUT ends.
    from trajforge.agent.loop import MAX_CALLS_PER_TURN, MAX_TOOL_OUTPUT

    calls = [tool_call("terminal", {"command": f"echo {i} >> ran.txt; wc -l < ran.txt"}, call_id=f"c{i}")
             for i in range(200)]
    server.script(chat(None, tool_calls=calls), chat("done"))
    s = run(server, tmp_path)
    results = s.turns[0].results
    assert len(results) == 200 and all(r.call.id == f"c{i}" for i, r in enumerate(results))  # every call answered
    assert sum("not run" in r.result for r in results) == 200 - MAX_CALLS_PER_TURN
    assert json.loads(results[MAX_CALLS_PER_TURN - 1].result)["output"].strip() == str(MAX_CALLS_PER_TURN)
    assert s.end_reason == "answer"

    # 50,000 lines of 99 characters, read whole in pieces of 1,000 lines: each result ~100 KB
    big = "seq -f '%099g' 1 50000 > big.txt"
    reads = [tool_call("read_file", {"path": "big.txt", "offset": 1 + 1000 * (i % 50), "limit": 1000},
                       call_id=f"r{i}") for i in range(MAX_CALLS_PER_TURN)]
    server.script(chat(None, tool_calls=[tool_call("terminal", {"command": big})]),
                  *[chat(None, tool_calls=reads) for _ in range(10)], chat("never reached"))
    s = run(server, tmp_path, max_turns=20)
    assert s.end_reason == "max_tool_output" and s.partial
    kept = sum(len(r.result) for turn in s.turns for r in turn.results)
    assert MAX_TOOL_OUTPUT < kept < MAX_TOOL_OUTPUT + MAX_CALLS_PER_TURN * 110_000
    assert s.api_calls < 11


@pytest.mark.parametrize("field", ["reasoning", "reasoning_content", "reasoning_details"])
def test_reasoning_shapes_reach_think_blocks(server: ScriptedServer, tmp_path: Path, field: str) -> None:
    server.script(chat("answer", reasoning="deep thought", reasoning_field=field))
    conv = conversations(run(server, tmp_path))
    assert conv[2]["value"] == "<think>\ndeep thought\n</think>\nanswer"


def test_plain_text_hermes_tool_call_is_executed(server: ScriptedServer, tmp_path: Path) -> None:
    server.script(
        chat('<think>plan</think>Let me look.\n<tool_call>{"name": "terminal", "arguments": {"command": "echo hi-there"}}'
             "</tool_call>"),
        chat("done"),
    )
    session = run(server, tmp_path)
    assert "hi-there" in session.turns[0].results[0].result
    assert session.turns[0].reasoning == "plan"


def test_ephemeral_and_prefill_are_sent_but_never_saved(server: ScriptedServer, tmp_path: Path) -> None:
    server.script(chat("fine", reasoning="r"))
    prefill = [{"role": "user", "content": "PREFILL-Q"}, {"role": "assistant", "content": "PREFILL-A"}]
    session = run(server, tmp_path, ephemeral_system_prompt="EPHEMERAL-XYZ", prefill=prefill)
    sent = json.dumps(server.chat_requests()[0]["messages"])
    assert "EPHEMERAL-XYZ" in sent and "PREFILL-Q" in sent
    saved = json.dumps(conversations(session))
    assert "EPHEMERAL-XYZ" not in saved and "PREFILL" not in saved


def test_argument_validation_is_pure() -> None:
    schema = {"type": "object", "properties": {"n": {"type": "integer"}, "mode": {"enum": ["a", "b"]}},
              "required": ["n"]}
    assert parse_arguments('{"n": 3}', schema) == ({"n": 3}, None)
    assert parse_arguments('{"n": true}', schema)[1] is not None
    assert "one of" in parse_arguments('{"n": 1, "mode": "c"}', schema)[1]
    assert "JSON object" in parse_arguments("[1]", schema)[1]

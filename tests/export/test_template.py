"""An `openai` export goes straight into real chat templates, through llama-cpp-python's Jinja
chat formatting (the Hugging Face-compatible environment it uses for GGUF templates):

- the tool-calling ChatML template llama-cpp-python ships (its `chatml-function-calling` chat
  format): renders the `tools` list in the system turn and each assistant `tool_calls` entry;
- the bundled SmolLM2 GGUF's own template (from the model file's metadata): plain ChatML that
  knows no tools, so it renders every message's content, tool results included.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from tests.support.export_run import make_run, run_export
from tests.support.scripted_server import ScriptedServer

llama_chat_format = pytest.importorskip("llama_cpp.llama_chat_format", reason="needs llama-cpp-python (the "
                                        "`local` extra)")


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, list[dict]]]:
    """The same real run exported with reasoning as a field and inline."""
    tmp = tmp_path_factory.mktemp("tpl")
    with ScriptedServer() as server:
        run = make_run(tmp, server)
    out = {}
    for mode in ("field", "inline"):
        proc = run_export(tmp, run, "--format", "openai", "--reasoning", mode, "--output", f"{mode}.jsonl")
        assert proc.returncode == 0, proc.stderr
        out[mode] = [json.loads(x) for x in (tmp / f"{mode}.jsonl").read_text().splitlines()]
    yield out


def shipped_tool_template() -> str:
    """The Jinja template of llama-cpp-python's `chatml-function-calling` format."""
    fn = llama_chat_format.chatml_function_calling
    found = [c for c in fn.__code__.co_consts if isinstance(c, str) and c.startswith("{% for message in messages")]
    assert len(found) == 1, "llama-cpp-python's chatml-function-calling template moved"
    return found[0]


def in_order(text: str, parts: list[str]) -> None:
    at = 0
    for part in parts:
        found = text.find(part, at)
        assert found >= 0, f"{part!r} missing after offset {at} in:\n{text}"
        at = found + len(part)


def test_tool_calling_template_renders_tools_and_every_call(exported: dict[str, list[dict]]) -> None:
    fmt = llama_chat_format.Jinja2ChatFormatter(shipped_tool_template(), eos_token="<|im_end|>",
                                                bos_token="", add_generation_prompt=False)
    rendered = 0
    for item in exported["field"][:3]:  # a parallel-call trajectory, a plain answer, another parallel one
        prompt = fmt(messages=item["messages"], tools=item["tools"], tool_calls=True).prompt
        expected = [f"<|im_start|>system\n{item['messages'][0]['content']}"]
        expected += [f"\nfunctions.{t['function']['name']}:\n{json.dumps(t['function']['parameters'])}"
                     for t in item["tools"]]
        for msg in item["messages"][1:]:
            if msg["role"] == "user":
                expected.append(f"<|im_start|>user\n{msg['content']}<|im_end|>")
            elif msg["role"] == "assistant":
                if msg["content"]:
                    expected.append(f"message:\n{msg['content']}")
                for c in msg.get("tool_calls", []):
                    assert isinstance(json.loads(c["function"]["arguments"]), dict)  # a JSON object, as text
                    expected.append(f"functions.{c['function']['name']}:\n{c['function']['arguments']}")
        in_order(prompt, expected)
        calls = sum(len(m.get("tool_calls", [])) for m in item["messages"])
        assert prompt.count("functions.terminal:\n{") == calls + 1  # the definition, then each call
        rendered += 1
    assert rendered == 3


def test_bundled_model_template_renders_every_message(exported: dict[str, list[dict]]) -> None:
    from llama_cpp import Llama

    from trajforge.model.local_model import bundled_model_path

    try:
        path = bundled_model_path()
    except Exception as e:  # noqa: BLE001 - the bundled model is an optional install
        pytest.skip(f"bundled model not installed: {e}")
    llm = Llama(model_path=str(path), vocab_only=True, verbose=False)
    template = llm.metadata["tokenizer.chat_template"]
    fmt = llama_chat_format.Jinja2ChatFormatter(template, eos_token="<|im_end|>", bos_token="",
                                                add_generation_prompt=False)
    for mode, items in exported.items():
        for item in items[:3]:
            prompt = fmt(messages=item["messages"], tools=item["tools"]).prompt
            in_order(prompt, [f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>" for m in item["messages"]])
            assert prompt.count("<|im_start|>tool\n{") == sum(m["role"] == "tool" for m in item["messages"])
            assert ("<think>\nI will echo" in prompt) == (mode == "inline" and "parallel" in prompt)

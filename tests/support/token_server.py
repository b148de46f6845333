"""A vLLM-like chat server for token capture: a real chat template, a real tokenizer, ids in vLLM's shapes.

Plugs into ScriptedServer as its handler. Each request's messages and tools are rendered with a
Jinja chat template of the ChatML family that tool-calling models ship (tools listed in the
system turn, Hermes `<tool_call>` blocks for the assistant's calls, `<tool_response>` blocks in
a user turn for the results, `<think>` for reasoning), then tokenized with the bundled model's
real tokenizer (SmolLM2's GGUF, loaded vocab-only through llama_cpp: its vocabulary has the
`<|im_start|>`/`<|im_end|>` special tokens). The "model" is a script: `policy(turn, messages)`
says what the reply is (reasoning, content, tool calls); the server writes it in the template's
own assistant format, tokenizes it, ends it with `<|im_end|>` (the model's stop token) and
gives every generated token a logprob of its own. Like vLLM, it reports `prompt_token_ids` and
`choices[0].token_ids` only when asked (`return_token_ids`) and logprobs only for `logprobs:
true`; `honor_ids=False` plays a server that ignores the request field. Every reply's ids and
logprobs are kept in `calls`, so a test can compare what the client recorded with what was sent.

Two templates: KEEP_REASONING renders an assistant turn's `reasoning_content` back inside
`<think>`, so each prompt extends the last one exactly; DROP_REASONING leaves earlier reasoning
out, as many reasoning models' templates do, so the prompt after a turn with reasoning no longer
starts with what the model generated.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from tests.support.scripted_server import Recorded, Reply, chat

_SYSTEM = """\
{%- if tools %}
{{- '<|im_start|>system\\n' }}
{%- if messages[0].role == 'system' %}{{- messages[0].content + '\\n\\n' }}{%- endif %}
{{- '# Tools\\n\\nYou may call one or more functions. Their signatures are within <tools></tools>:\\n<tools>' }}
{%- for tool in tools %}{{- '\\n' + (tool | tojson) }}{%- endfor %}
{{- '\\n</tools>\\n\\nFor each call, return <tool_call>{"name": ..., "arguments": ...}</tool_call>.<|im_end|>\\n' }}
{%- elif messages[0].role == 'system' %}
{{- '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}
{%- endif %}
"""
_TURNS = """\
{%- for message in messages %}
{%- if message.role == 'user' %}
{{- '<|im_start|>user\\n' + message.content + '<|im_end|>\\n' }}
{%- elif message.role == 'assistant' %}
{{- '<|im_start|>assistant\\n' }}
REASONING
{{- message.content or '' }}
{%- for tc in message.tool_calls or [] %}
{%- if message.content or not loop.first %}{{- '\\n' }}{%- endif %}
{{- '<tool_call>\\n{"name": "' + tc.function.name + '", "arguments": ' + tc.function.arguments + '}\\n</tool_call>' }}
{%- endfor %}
{{- '<|im_end|>\\n' }}
{%- elif message.role == 'tool' %}
{%- if loop.first or messages[loop.index0 - 1].role != 'tool' %}{{- '<|im_start|>user' }}{%- endif %}
{{- '\\n<tool_response>\\n' + message.content + '\\n</tool_response>' }}
{%- if loop.last or messages[loop.index0 + 1].role != 'tool' %}{{- '<|im_end|>\\n' }}{%- endif %}
{%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}
"""
_THINK = "{%- if message.reasoning_content %}{{- '<think>\\n' + message.reasoning_content + '\\n</think>\\n\\n' }}{%- endif %}"
KEEP_REASONING = _SYSTEM + _TURNS.replace("REASONING", _THINK)
DROP_REASONING = _SYSTEM + _TURNS.replace("REASONING\n", "")
STOP = "<|im_end|>"


@dataclass(frozen=True)
class Step:
    """One scripted reply: reasoning, visible content, and tool calls (name, arguments JSON text)."""

    reasoning: str | None = None
    content: str = ""
    calls: tuple[tuple[str, str], ...] = ()


Policy = Callable[[int, list[dict[str, Any]]], Step]


def terminal_policy(turns: int = 1, *, reasoning_at: tuple[int, ...] | None = None) -> Policy:
    """`turns` terminal calls (echo of the prompt's last word), then an answer. Every reply has
    reasoning, unless `reasoning_at` names the only turns that do."""

    def policy(turn: int, messages: list[dict[str, Any]]) -> Step:
        prompt = next(m["content"] for m in messages if m["role"] == "user")
        thinks = reasoning_at is None or turn in reasoning_at
        reasoning = f"Turn {turn}: I will work on '{prompt}'." if thinks else None
        if turn < turns:
            word = prompt.split()[-1]
            return Step(reasoning, "", (("terminal", json.dumps({"command": f"echo {word}-{turn}"})),))
        return Step(reasoning, f"Done with {prompt}.")

    return policy


@functools.lru_cache(maxsize=1)
def vocab() -> Any:
    """The bundled model's tokenizer (its GGUF's vocabulary only: no weights are loaded)."""
    import llama_cpp

    from trajforge.model.local_model import bundled_model_path

    return llama_cpp.Llama(model_path=str(bundled_model_path()), vocab_only=True, verbose=False)


@functools.lru_cache(maxsize=4)
def _compiled(template: str) -> Any:
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    env = ImmutableSandboxedEnvironment()
    env.filters["tojson"] = lambda x: json.dumps(x, ensure_ascii=False)
    return env.from_string(template)


def tokenize(text: str) -> list[int]:
    return vocab().tokenize(text.encode(), add_bos=False, special=True)


def assistant_text(step: Step) -> str:
    """The reply as the model writes it: the template's assistant format, before the stop token."""
    text = f"<think>\n{step.reasoning}\n</think>\n\n" if step.reasoning else ""
    text += step.content
    for i, (name, args) in enumerate(step.calls):
        text += ("\n" if step.content or i else "") + f'<tool_call>\n{{"name": "{name}", "arguments": {args}}}\n</tool_call>'
    return text


def logprob(position: int, token: int) -> float:
    """A logprob of the server's own for each generated token (varied, so a shifted one shows)."""
    return -round(((token * 7919 + position * 104729) % 1000) / 997 + 0.001, 6)


@dataclass
class TokenServer:
    """The handler: `ScriptedServer(TokenServer(policy))`."""

    policy: Policy = field(default_factory=terminal_policy)
    template: str = KEEP_REASONING
    honor_ids: bool = True  # False: ignore return_token_ids, as a server that does not know it
    calls: list[dict[str, Any]] = field(default_factory=list)

    def render(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> str:
        return _compiled(self.template).render(messages=messages, tools=tools, add_generation_prompt=True)

    def __call__(self, req: Recorded) -> Reply:
        body = req.body
        messages = body["messages"]
        turn = sum(1 for m in messages if m["role"] == "assistant")
        step = self.policy(turn, messages)
        prompt_ids = tokenize(self.render(messages, body.get("tools")))
        completion_ids = tokenize(assistant_text(step) + STOP)
        logprobs = [logprob(i, t) for i, t in enumerate(completion_ids)]
        calls = [{"id": f"call_{turn}_{k}", "type": "function", "function": {"name": n, "arguments": a}}
                 for k, (n, a) in enumerate(step.calls)]
        reply = chat(step.content or None, tool_calls=calls or None, reasoning=step.reasoning,
                     reasoning_field="reasoning_content",
                     usage={"prompt_tokens": len(prompt_ids), "completion_tokens": len(completion_ids),
                            "total_tokens": len(prompt_ids) + len(completion_ids)})
        asked = body.get("return_token_ids") is True and self.honor_ids
        if asked:
            reply.body["prompt_token_ids"] = prompt_ids
            reply.body["choices"][0]["token_ids"] = completion_ids
        if body.get("logprobs") is True and self.honor_ids:
            reply.body["choices"][0]["logprobs"] = {"content": [
                {"token": vocab().detokenize([t], special=True).decode(errors="replace"), "logprob": lp,
                 "top_logprobs": []} for t, lp in zip(completion_ids, logprobs)]}
        prompt = next(m["content"] for m in messages if m["role"] == "user")
        self.calls.append({"prompt": prompt, "turn": turn, "prompt_ids": prompt_ids,
                           "completion_ids": completion_ids, "logprobs": logprobs, "sent": asked})
        return reply

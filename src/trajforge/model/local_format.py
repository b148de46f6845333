"""Pure text side of the local llama.cpp backend: Hermes prompt rendering, GBNF grammar, parsing.

Kept free of model state so it can be tested without loading weights. The flow is:
OpenAI-style messages -> `to_chat_messages` (system/user/assistant only, Hermes tags inline)
-> `render_prompt` (the GGUF's own Jinja chat template) -> llama.cpp, whose sampling is
constrained by `build_grammar` -> `parse_output` back into reasoning / text / one tool call.

Why plain roles: small chat templates (SmolLM2's ChatML, Gemma, Mistral) know no `tool` role
and some insist on strict user/assistant alternation, so tool results travel as a user turn of
`<tool_response>` blocks (the Hermes convention) and same-role neighbours are merged.

Decoding policy (`choose_mode`): the output always opens with a bounded `<think>` line, so every
turn carries reasoning (the runner discards samples without any). Until the conversation holds a
tool result the model MUST call a tool ("tool" mode); afterwards it may call another tool or
answer ("either"); after `max_tool_rounds` tool results it must answer ("answer"), which makes a
weak model finish instead of looping until --max_turns. One tool call per turn.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any, Literal

Mode = Literal["tool", "either", "answer"]

THINK_MAX_CHARS = 160
DEFAULT_STRING_MAX_CHARS = 448

TOOLS_PREAMBLE = (
    "You are a function calling AI model. You are provided with function signatures within "
    "<tools></tools> XML tags. You may call one of these functions to assist with the user "
    "query. Don't make assumptions about what values to plug into functions. Here are the "
    "available tools: <tools>\n{tools}\n</tools>\nFirst think briefly inside <think></think>. "
    "To call a function, return a json object with the function name and arguments within "
    "<tool_call></tool_call> XML tags as follows:\n<tool_call>\n"
    '{{"name": <function-name>, "arguments": <args-dict>}}\n</tool_call>\n'
    "Function results come back inside <tool_response></tool_response> tags."
)

# Used when a GGUF file carries no chat template: plain ChatML, which most instruct models know.
CHATML_TEMPLATE = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content']"
    " + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def _dumps(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False)


def _text(content: Any) -> str:
    """OpenAI content may be a string, None or a list of parts; keep the text parts."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(p.get("text", "") for p in content if isinstance(p, dict) and p.get("type") == "text")
    return str(content)


def tools_block(tools: list[dict[str, Any]]) -> str:
    return TOOLS_PREAMBLE.format(tools="\n".join(_dumps(t) for t in tools))


def _call_text(name: str, arguments: str) -> str:
    try:
        args: Any = json.loads(arguments) if arguments else {}
    except ValueError:
        args = arguments  # keep what the model wrote; the agent already reported the error
    return f"<tool_call>\n{_dumps({'name': name, 'arguments': args})}\n</tool_call>"


def to_chat_messages(messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> list[dict[str, str]]:
    """Convert OpenAI chat messages (+ offered tools) into system/user/assistant text turns."""
    system_parts = [_text(m.get("content")) for m in messages if m.get("role") == "system"]
    if tools:
        system_parts.append(tools_block(tools))
    out: list[dict[str, str]] = []
    if system_parts:
        out.append({"role": "system", "content": "\n\n".join(p for p in system_parts if p)})
    names_by_id: dict[str, str] = {}
    for m in messages:
        role = m.get("role")
        if role == "system":
            continue
        if role == "assistant":
            parts = [_text(m.get("content")).strip()]
            for call in m.get("tool_calls") or []:
                fn = call.get("function", {})
                names_by_id[call.get("id", "")] = fn.get("name", "")
                parts.append(_call_text(fn.get("name", ""), fn.get("arguments", "")))
            role, content = "assistant", "\n".join(p for p in parts if p)
        elif role == "tool":
            raw = _text(m.get("content"))
            try:
                body: Any = json.loads(raw)
            except ValueError:
                body = raw
            call_id = m.get("tool_call_id", "")
            payload = {"tool_call_id": call_id, "name": m.get("name") or names_by_id.get(call_id, ""), "content": body}
            role, content = "user", f"<tool_response>\n{_dumps(payload)}\n</tool_response>"
        else:
            role, content = "user", _text(m.get("content"))
        if out and out[-1]["role"] == role and role != "system":
            out[-1]["content"] += "\n" + content
        else:
            out.append({"role": role, "content": content})
    return out


@lru_cache(maxsize=8)
def _compiled(template: str) -> Any:
    """The template compiled once (a conversation renders it a few times per call)."""
    # Imported here: jinja2 arrives with llama-cpp-python, and without it the client must still
    # import far enough to say what to install.
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"])
    env.filters["tojson"] = lambda x, indent=None, **_: json.dumps(x, ensure_ascii=False, indent=indent)
    return env.from_string(template)


def render_prompt(template: str | None, chat: list[dict[str, str]], bos_token: str = "", eos_token: str = "",
                  generation_prompt: bool = True) -> str:
    """Render with the model's Jinja chat template; fold the system turn into the first user
    turn for templates that reject a system role (they call raise_exception). Without
    `generation_prompt`, the text ends where the last turn does (no assistant turn opened)."""
    import jinja2

    def raise_exception(message: str) -> None:
        raise jinja2.TemplateError(message)

    compiled = _compiled(template or CHATML_TEMPLATE)

    def render(msgs: list[dict[str, str]]) -> str:
        return compiled.render(messages=msgs, bos_token=bos_token, eos_token=eos_token,
                               add_generation_prompt=generation_prompt, raise_exception=raise_exception)

    try:
        return render(chat)
    except jinja2.TemplateError:
        if not chat or chat[0]["role"] != "system" or len(chat) < 2:
            raise
        folded = [{"role": "user", "content": chat[0]["content"] + "\n\n" + chat[1]["content"]}, *chat[2:]]
        return render(folded)


def choose_mode(messages: list[dict[str, Any]], tools: list[dict[str, Any]], max_tool_rounds: int) -> Mode:
    if not tools:
        return "answer"
    rounds = sum(1 for i, m in enumerate(messages)
                 if m.get("role") == "tool" and (i == 0 or messages[i - 1].get("role") != "tool"))
    if rounds == 0:
        return "tool"
    return "answer" if rounds >= max_tool_rounds else "either"


def _rule_name(text: str) -> str:
    return re.sub(r"[^a-zA-Z0-9-]+", "-", text).strip("-").lower() or "t"


def _lit(text: str) -> str:
    return json.dumps(text)  # a JSON string literal is also a valid GBNF literal


@lru_cache(maxsize=256)
def _grammar_cached(tools_json: str, mode: Mode, think_max: int, string_max: int) -> str:
    from llama_cpp.llama_grammar import PRIMITIVE_RULES, SchemaConverter

    tools = json.loads(tools_json)
    conv = SchemaConverter(prop_order={}, allow_fetch=False, dotall=False, raw_pattern=False)
    alternatives = []
    for i, tool in enumerate(tools):
        fn = tool.get("function", tool)
        name = fn["name"]
        prefix = f"t{i}-{_rule_name(name)}"
        params = fn.get("parameters") or {"type": "object", "properties": {}}
        try:
            args_rule = conv.visit(conv.resolve_refs(params, name), f"{prefix}-args")
        except Exception:  # schema features the converter lacks: still constrain the tool name
            args_rule = conv._add_primitive("object", PRIMITIVE_RULES["object"])
        head = _lit('{"name": ' + _dumps(name) + ', "arguments": ')
        alternatives.append(conv._add_rule(f"{prefix}-call", f'{head} {args_rule} "}}"'))
    rules = [
        f'think ::= "<think>\\n" [^<\\n \\t] [^<\\n]{{0,{think_max}}} "\\n</think>\\n"',
        # An answer may not open with "<" nor contain "<t", so it can never smuggle a <tool_call>.
        'answer ::= [^<\\n \\t] ([^<] | "<" [^t<])*',
    ]
    if alternatives:
        rules.append(f'toolcall ::= "<tool_call>\\n" ({" | ".join(alternatives)}) "\\n</tool_call>"')
    body = {"tool": "toolcall", "either": "toolcall | answer", "answer": "answer"}[mode if alternatives else "answer"]
    rules.insert(0, f"root ::= think ({body})")
    # Upstream's char rule admits raw control characters, which make invalid JSON.
    schema_rules = conv.format_grammar().replace(
        'string ::= "\\"" char* "\\"" space', f'string ::= "\\"" char{{0,{string_max}}} "\\"" space'
    ).replace('char ::= [^"\\\\] |', 'char ::= [^"\\\\\\x7F\\x00-\\x1F] |')
    return "\n".join(rules) + "\n" + schema_rules + "\n"


def build_grammar(tools: list[dict[str, Any]], mode: Mode, think_max: int = THINK_MAX_CHARS,
                  string_max: int = DEFAULT_STRING_MAX_CHARS) -> str:
    """GBNF admitting `<think>` + (a `<tool_call>` matching one offered tool's schema | an answer).

    Thoughts and JSON strings are bounded in characters (hence in tokens): a small model that
    rambles inside a command string must still close the call within the token budget."""
    return _grammar_cached(json.dumps(tools, sort_keys=True), mode, think_max, string_max)


@dataclass(slots=True)
class ParsedOutput:
    reasoning: str | None
    content: str
    tool_calls: list[tuple[str, str]] = field(default_factory=list)  # (name, arguments JSON)


_THINK_RE = re.compile(r"^\s*<think>(.*?)</think>\s*", re.S)
_CALL_RE = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.S)


def parse_output(text: str) -> ParsedOutput:
    """Split generated text into reasoning, visible text and Hermes tool calls.

    Tolerant on purpose: a truncated or unconstrained output stays visible text rather than
    becoming a half-parsed call."""
    reasoning = None
    m = _THINK_RE.match(text)
    if m:
        reasoning = m.group(1).strip() or None
        text = text[m.end():]
    calls: list[tuple[str, str]] = []
    for block in _CALL_RE.findall(text):
        try:
            obj = json.loads(block, strict=False)  # tolerate raw newlines in unconstrained output
        except ValueError:
            continue
        if isinstance(obj, dict) and isinstance(obj.get("name"), str):
            calls.append((obj["name"], _dumps(obj.get("arguments", {}))))
    if calls:
        text = _CALL_RE.sub("", text)
    return ParsedOutput(reasoning=reasoning, content=text.strip(), tool_calls=calls)

"""The system texts: what the model is told at run time, and the saved ShareGPT system turn.

The saved system turn lists the tools that were actually offered inside <tools></tools> in the
Hermes function-calling style, so a model fine-tuned on the data learns the same format.
"""

from __future__ import annotations

from typing import Any

from trajforge.jsonio import dumps_str

RUNTIME_SYSTEM_PROMPT = (
    "You are a capable assistant that completes tasks by calling the tools you are given. "
    "Think about what to do before each step. Call tools when they help; inspect their results "
    "and correct course when something fails. When the task is done, reply with a final answer "
    "and no tool calls."
)

_PREAMBLE = (
    "You are a function calling AI model. You are provided with function signatures within "
    "<tools> </tools> XML tags. You may call one or more functions to assist with the user query. "
    "Don't make assumptions about what values to plug into functions. Here are the available tools: "
)
_SUFFIX = (
    " For each function call return a JSON object with the function name and arguments within "
    "<tool_call> </tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": "
    "<args-dict>}\n</tool_call>"
)


def runtime_system_message(ephemeral: str | None) -> dict[str, str]:
    text = RUNTIME_SYSTEM_PROMPT if not ephemeral else f"{RUNTIME_SYSTEM_PROMPT}\n\n{ephemeral}"
    return {"role": "system", "content": text}


def sharegpt_system_text(tool_schemas: list[dict[str, Any]]) -> str:
    functions = [t["function"] for t in tool_schemas]
    return f"{_PREAMBLE}<tools>\n{dumps_str(functions)}\n</tools>{_SUFFIX}"

"""Scripted model behaviours that decide each reply from the conversation received.

Because replies depend only on the request, they stay correct under any concurrency and across
retries and resumes, which a fixed reply queue would not.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from tests.support.scripted_server import Recorded, Reply, chat, tool_call


def tool_messages(body: dict[str, Any]) -> list[dict[str, Any]]:
    return [m for m in body["messages"] if m["role"] == "tool"]


def user_prompt(body: dict[str, Any]) -> str:
    return [m for m in body["messages"] if m["role"] == "user"][-1]["content"]


def echo_policy(turns: int = 1, *, delay: float = 0.0, reasoning: bool = True) -> Callable[[Recorded], Reply]:
    """`turns` tool turns of `terminal: echo <prompt>`, then an answer quoting the last output."""

    def handle(req: Recorded) -> Reply:
        body = req.body
        done = len(tool_messages(body))
        think = "I should run a command." if reasoning else None
        if done < turns:
            word = user_prompt(body).split()[-1]
            return chat(None, tool_calls=[tool_call("terminal", {"command": f"echo {word}"})],
                        reasoning=think, delay=delay)
        last = json.loads(tool_messages(body)[-1]["content"]) if done else {}
        return chat(f"Done: {str(last.get('output', '')).strip()}", reasoning=think and "All done.", delay=delay)

    return handle


def prompt_command_policy(req: Recorded) -> Reply:
    """Run the prompt itself as one `terminal` command, then answer with that command's output."""
    done = tool_messages(req.body)
    if not done:
        return chat(None, tool_calls=[tool_call("terminal", {"command": user_prompt(req.body)})], reasoning="Run it.")
    return chat("Output: " + str(json.loads(done[-1]["content"]).get("output")), reasoning="Done.")

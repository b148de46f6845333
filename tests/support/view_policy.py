"""A scripted model whose replies depend on the prompt, giving a run with every kind of sample the
viewer shows: parallel tool calls, hostile HTML in tool output and prompt, a failing tool, a long
output, a made-up tool (dropped at merge), no reasoning (discarded), API and rate-limit failures,
unusable replies, and turn-limit partial samples."""

from __future__ import annotations

from tests.support.policies import tool_messages, user_prompt
from tests.support.scripted_server import Recorded, Reply, chat, http_error, tool_call

XSS = "<script>alert(1)</script>"
TASK_TYPES = {"parallel": "shell", "long": "shell", "plain": "chat"}  # dataset rows' task_type
PROMPTS = [
    "parallel: run two commands at once",
    "xss: print a script tag <img src=x onerror=alert(2)>",
    "error: read a file that does not exist",
    "long: print many lines",
    "hallucinate: call a tool that does not exist",
    "quiet: answer without reasoning",
    "apifail: the API breaks",
    "ratelimit: the API refuses",
    "garbage: the API answers nonsense",
    "loop: never stop calling tools",
    "plain: say hello",
    "apifail: the API breaks again",
]


def view_policy(req: Recorded) -> Reply:
    body = req.body
    prompt = user_prompt(body)
    kind = prompt.split(":")[0]
    done = tool_messages(body)
    if kind == "apifail":
        return http_error(500, "upstream exploded")
    if kind == "ratelimit":
        return http_error(429, "slow down")
    if kind == "garbage":
        return Reply(body={"id": "x", "object": "chat.completion", "choices": []})
    if kind == "quiet":
        return chat("hello without thinking")
    if kind == "loop":
        return chat(None, reasoning=f"Again, step {len(done) + 1}.",
                    tool_calls=[tool_call("terminal", {"command": f"echo step{len(done) + 1}"})])
    if done:
        return chat(f"Finished the {kind} task.", reasoning="The results are in; I can answer.")
    calls = {
        "parallel": [tool_call("terminal", {"command": "sleep 0.3; echo alpha-out"}, "call_alpha"),
                     tool_call("terminal", {"command": "echo beta-out"}, "call_beta")],
        "xss": [tool_call("terminal", {"command": f"echo '{XSS}'"})],
        "error": [tool_call("read_file", {"path": "missing/nothing.txt"})],
        "long": [tool_call("terminal", {"command": "seq 1 300"})],
        "hallucinate": [tool_call("summon_dragon", {"colour": "red"})],
    }.get(kind)
    if calls is None:
        return chat("Hello!", reasoning="A greeting is enough.")
    return chat(None, reasoning=f"I will handle the {kind} task <b>carefully</b>.", tool_calls=calls,
                usage={"prompt_tokens": 100 + len(prompt), "completion_tokens": 20, "total_tokens": 120 + len(prompt)})

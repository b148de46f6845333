"""A small real run for the export tests: parallel tool calls, failed tools, reasoning, a partial.

The scripted model answers from the conversation it receives (tests.support.policies style):
  - `parallel W`: two terminal calls in one turn (echo W, and a call with invalid arguments, which
    fails), then one more call reusing the first call's id (as servers that number calls per
    response do), then an answer;
  - `plain W`: answers at once without tools;
  - `loop W`: calls a tool every turn until --max_turns cuts it off (a partial trajectory).
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from tests.support.commands import run_trajforge
from tests.support.policies import tool_messages, user_prompt
from tests.support.scripted_server import Recorded, Reply, ScriptedServer, chat, tool_call

PROMPTS = ["parallel alpha", "plain beta", "parallel gamma", "loop delta", "parallel epsilon", "plain zeta"]


def export_policy(req: Recorded) -> Reply:
    body = req.body
    kind, word = user_prompt(body).split()
    done = len(tool_messages(body))
    n = sum(1 for m in body["messages"] if m["role"] == "assistant")
    if kind == "parallel" and n == 0:
        return chat("Let me run two things at once.", reasoning=f"I will echo {word} and try a bad call.",
                    tool_calls=[tool_call("terminal", {"command": f"echo {word}"}, "call_a"),
                                tool_call("terminal", {"wrong_field": 1}, "call_b")],
                    usage={"prompt_tokens": 11, "completion_tokens": 7, "total_tokens": 18})
    if kind == "parallel" and n == 1:
        return chat(None, reasoning="The second call failed; one more command.",
                    tool_calls=[tool_call("terminal", {"command": f"printf '%s\\n' {word}-again"}, "call_a")])
    if kind == "loop":
        return chat(None, reasoning="Keep going.", tool_calls=[tool_call("terminal", {"command": "true"})])
    last = tool_messages(body)[-1]["content"] if done else ""
    return chat(f"Final answer for {word}. {len(last)} chars of output seen.", reasoning="Now I can answer.")


def make_run(tmp: Path, server: ScriptedServer, name: str = "exp") -> Path:
    server.handler = export_policy
    ds = tmp / "ds.jsonl"
    ds.write_text("".join(json.dumps({"prompt": p, "task_type": "loopy" if p.startswith("loop") else "qa"}) + "\n"
                          for p in PROMPTS))
    args = [f"--dataset_file={ds}", "--batch_size=4", f"--run_name={name}", f"--base_url={server.url}",
            "--model=scripted-model", "--distribution=terminal_only", "--sandbox=local", "--max_turns=3",
            "--num_workers=3"]
    proc = run_trajforge("run", *args, cwd=tmp, timeout=180)
    assert proc.returncode == 0, proc.stderr
    return tmp / "data" / name


def run_export(cwd: Path, *args: object) -> subprocess.CompletedProcess[str]:
    """`trajforge export ARGS` as a user runs it."""
    return run_trajforge("export", *args, cwd=cwd, timeout=180)

"""Synthetic trajectories in the saved format (SPEC section 5) for the compressor's tests.

Long tool responses make trajectories as large as a test needs; every gpt turn with a
<tool_call> is followed by its tool turn, so tests can check that pairs survive compression.
"""

from __future__ import annotations

import json
import random
import re
from pathlib import Path
from typing import Any

WORDS = ("alpha bravo charlie delta echo foxtrot golf hotel india juliet kilo lima mike november oscar "
         "papa quebec romeo sierra tango uniform victor whiskey xray yankee zulu").split()
TOOLS = ("terminal", "read_file", "web_search")
TOOL_CALL = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.DOTALL)
TOOL_RESPONSE = re.compile(r"<tool_response>\s*(.*?)\s*</tool_response>", re.DOTALL)


def system_text(tools: tuple[str, ...] = TOOLS) -> str:
    listed = [{"name": t, "description": f"the {t} tool", "parameters": {"type": "object"}} for t in tools]
    return f"You are a function calling AI model. <tools>\n{json.dumps(listed)}\n</tools> Use <tool_call>."


def words(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(n))


def trajectory(index: int, steps: int, response_words: int, *, seed: int = 0, think: bool = True,
               completed: bool = True, tool: str | None = None, offered: tuple[str, ...] = TOOLS,
               failures: int = 0) -> dict[str, Any]:
    rng = random.Random(seed * 100_003 + index)
    conv = [{"from": "system", "value": system_text(offered)},
            {"from": "human", "value": f"Task {index}: {words(rng, 12)}"}]
    stats = {t: {"count": 0, "success": 0, "failure": 0} for t in TOOLS}
    for step in range(steps):
        name = tool or TOOLS[step % len(TOOLS)]
        thought = f"<think>\nstep {step}: {words(rng, 8)}\n</think>\n" if think else ""
        call = json.dumps({"name": name, "arguments": {"command": f"echo {step}"}})
        conv.append({"from": "gpt", "value": f"{thought}Running step {step}.\n<tool_call>\n{call}\n</tool_call>"})
        body = json.dumps({"tool_call_id": f"call_{index}_{step}", "name": name,
                           "content": {"output": words(rng, response_words), "step": step}})
        conv.append({"from": "tool", "value": f"<tool_response>\n{body}\n</tool_response>"})
        entry = stats.setdefault(name, {"count": 0, "success": 0, "failure": 0})
        entry["count"] += 1
        failed = step < failures
        entry["failure" if failed else "success"] += 1
    conv.append({"from": "gpt", "value": f"{'<think>done</think>' if think else ''}Final answer {index}: "
                                         f"{words(rng, 20)}"})
    return {"prompt_index": index, "conversations": conv,
            "metadata": {"batch_num": 0, "timestamp": "2026-01-15T10:30:00", "model": "scripted", "score": 0.5},
            "completed": completed, "partial": not completed, "api_calls": steps + 1,
            "toolsets_used": ["terminal"], "tool_stats": stats,
            "tool_error_counts": {t: s["failure"] for t, s in stats.items()}}


def write_jsonl(path: Path, rows: list[dict[str, Any]]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    return path


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def pairs_intact(conv: list[dict[str, Any]]) -> bool:
    """Every tool turn directly follows a gpt turn whose calls it answers, one response per call."""
    for i, turn in enumerate(conv):
        calls = TOOL_CALL.findall(turn["value"]) if turn["from"] == "gpt" else []
        nxt = conv[i + 1] if i + 1 < len(conv) else None
        if turn["from"] == "tool":
            prev = conv[i - 1] if i else None
            if prev is None or prev["from"] != "gpt" or not TOOL_CALL.search(prev["value"]):
                return False
            if len(TOOL_RESPONSE.findall(turn["value"])) != len(TOOL_CALL.findall(prev["value"])):
                return False
        if calls and (nxt is None or nxt["from"] != "tool"):
            return False
    return True

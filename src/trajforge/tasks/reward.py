"""A task's reward files read into a verdict, and the record's `verification` built from it (pure).

The verifier writes `/logs/verifier/reward.json` (an object of numbers, `reward` the main one; an
object of one number makes that one the main) or `/logs/verifier/reward.txt` (one number);
reward.json wins when both exist, as in Harbor. A reward that cannot be had is an error, never a
pass or a fail: `verifier_timeout` (the script passed [verifier].timeout_sec), `verifier_crashed`
(no reward, and the script exited non-zero), `reward_missing` (no reward file, exit 0),
`reward_invalid` (empty, not a number, not finite, no main `reward`, a link). `passed` is
`reward >= --pass_threshold`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import orjson

ERROR_KINDS = ("verifier_timeout", "verifier_crashed", "reward_missing", "reward_invalid")
OUTPUT_CHARS = 32_000  # of the verifier's output kept in the record (head and tail)


@dataclass(slots=True)
class Reward:
    reward: float | None
    rewards: dict[str, float] = field(default_factory=dict)
    source: str | None = None  # reward.json | reward.txt
    problem: str | None = None  # why there is no reward (reward_invalid)


def _finite(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    v = float(value)
    return v if math.isfinite(v) else None


def parse_json(data: bytes) -> Reward:
    if not data.strip():
        return Reward(None, source="reward.json", problem="reward.json is empty")
    try:
        obj = orjson.loads(data)
    except orjson.JSONDecodeError as e:
        return Reward(None, source="reward.json", problem=f"reward.json is not valid JSON: {e}")
    if not isinstance(obj, dict) or not obj:
        return Reward(None, source="reward.json", problem="reward.json must be a non-empty object of numbers")
    rewards: dict[str, float] = {}
    for key, value in obj.items():
        v = _finite(value)
        if v is None:
            return Reward(None, source="reward.json", problem=f"reward.json: {key!r} is not a finite number: {value!r}")
        rewards[str(key)] = v
    main = rewards.get("reward", next(iter(rewards.values())) if len(rewards) == 1 else None)
    if main is None:
        return Reward(None, rewards, "reward.json", f"reward.json has several metrics ({', '.join(rewards)}) and no "
                                                    "main 'reward'")
    return Reward(main, rewards, "reward.json")


def parse_txt(data: bytes) -> Reward:
    text = data.decode("utf-8", "replace").strip()
    if not text:
        return Reward(None, source="reward.txt", problem="reward.txt is empty")
    try:
        value = _finite(float(text))
    except ValueError:
        value = None
    if value is None:
        return Reward(None, source="reward.txt", problem=f"reward.txt is not a finite number: {text[:100]!r}")
    return Reward(value, {"reward": value}, "reward.txt")


def clip_output(text: str, limit: int = OUTPUT_CHARS) -> str:
    """The verifier's output as kept: whole when short, else its head and tail."""
    if len(text) <= limit:
        return text
    head = limit // 8
    return f"{text[:head]}\n[... {len(text) - limit} characters left out ...]\n{text[-(limit - head):]}"


def verification(reward: Reward | None, *, threshold: float, exit_code: int | None, timed_out: bool,
                 seconds: float, output: str, message: str | None = None) -> dict[str, Any]:
    """The record's `verification`: passed/score/method/detail/error as for dataset rows, plus the
    task's `reward` (main, or None) and `rewards` (every number read)."""
    detail: dict[str, Any] = {"exit_code": exit_code, "seconds": round(seconds, 3), "timed_out": timed_out,
                              "reward_file": reward.source if reward else None, "output": clip_output(output)}
    error = None
    if timed_out:
        error, message = "verifier_timeout", message or "the test script passed its timeout"
    elif reward is not None and reward.problem is not None:
        error, message = "reward_invalid", reward.problem
    elif reward is None or reward.reward is None:
        if exit_code != 0:
            error, message = "verifier_crashed", f"the test script exited with {exit_code} and wrote no reward"
        else:
            error, message = "reward_missing", "the test script wrote neither reward.txt nor reward.json"
    if message:
        detail["message"] = message
    rewards = reward.rewards if reward is not None else {}
    if error is not None:
        return {"passed": None, "score": None, "method": "tests", "detail": {"tests": detail}, "error": error,
                "reward": None, "rewards": rewards}
    assert reward is not None and reward.reward is not None
    return {"passed": reward.reward >= threshold, "score": reward.reward, "method": "tests",
            "detail": {"tests": detail}, "error": None, "reward": reward.reward, "rewards": rewards}

"""A task's reward files read into a verdict, and the record's `verification` built from it (pure).

The verifier writes `/logs/verifier/reward.json` (an object of numbers, `reward` the main one) or
`/logs/verifier/reward.txt` (one number); reward.json wins when both exist, as in Harbor. Without a
`reward` key, Harbor's reading is taken where it is unambiguous: an object of one number makes
that one the main; an object of several numbers, none `reward`, has no main reward (Harbor keeps
them all as metrics and has no single number to pass or fail on either), which is
`reward_invalid`. A reward that cannot be had is `verifier_timeout` (the script passed
[verifier].timeout_sec), `verifier_crashed` (no reward, and the script exited non-zero),
`reward_missing` (no reward file, exit 0) or `reward_invalid` (empty, not a number, not finite,
no main `reward`, a link); what that becomes is trajforge.failures' table: in default mode the
agent had the tests' container, so it is a fail with reward 0 and `failure` naming the kind; in
sealed mode it is an error (`error`), never a pass or a fail. `passed` is `reward >= --pass_threshold`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import orjson

from trajforge.failures import DEFAULT, REWARD_0, failure_class

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
                 seconds: float, output: str, message: str | None = None, mode: str = DEFAULT) -> dict[str, Any]:
    """The record's `verification`: passed/score/method/detail/error as for dataset rows, plus the
    task's `reward` (main, or None) and `rewards` (every number read), `isolation` (the mode) and,
    for what the agent could have caused, `failure`."""
    detail: dict[str, Any] = {"exit_code": exit_code, "seconds": round(seconds, 3), "timed_out": timed_out,
                              "reward_file": reward.source if reward else None, "output": clip_output(output)}
    kind = None
    if timed_out:
        kind, message = "verifier_timeout", message or "the test script passed its timeout"
    elif reward is not None and reward.problem is not None:
        kind, message = "reward_invalid", reward.problem
    elif reward is None or reward.reward is None:
        if exit_code != 0:
            kind, message = "verifier_crashed", f"the test script exited with {exit_code} and wrote no reward"
        else:
            kind, message = "reward_missing", "the test script wrote neither reward.txt nor reward.json"
    rewards = reward.rewards if reward is not None else {}
    if kind is not None:
        return no_reward(kind, message or kind, mode=mode, detail=detail, rewards=rewards)
    if message:
        detail["message"] = message
    assert reward is not None and reward.reward is not None
    return {"passed": reward.reward >= threshold, "score": reward.reward, "method": "tests",
            "detail": {"tests": detail}, "error": None, "reward": reward.reward, "rewards": rewards,
            "isolation": mode}


def no_reward(kind: str, message: str, *, mode: str, detail: dict[str, Any] | None = None,
              rewards: dict[str, float] | None = None) -> dict[str, Any]:
    """The verification of a task that got no reward of its tests: a fail with reward 0 when the
    agent could have caused it (`failure`: the kind), else an error (trajforge.failures' table)."""
    row = failure_class(kind, mode)
    detail = {**(detail or {}), "message": message}
    base = {"method": "tests", "detail": {"tests": detail}, "rewards": rewards or {}, "isolation": mode}
    if row.becomes == REWARD_0:
        detail["message"] = f"{message} (scored 0: {row.cause}'s doing in {mode} mode)"
        return {"passed": False, "score": 0.0, "error": None, "failure": kind, "reward": 0.0, **base}
    return {"passed": None, "score": None, "error": kind, "reward": None, **base}

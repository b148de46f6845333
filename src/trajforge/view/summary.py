"""The compact index entry of one sample, and how a record is summarised into it (pure).

An entry holds where the record's line is (file, offset, length) and the few fields the list
shows and filters on; never the conversation, which is read back by offset when a sample is
opened. A sample that has no record (failed, or discarded before it was saved) gets an entry from
checkpoint.json with file = -1.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from trajforge.verify.result import verdict

PROMPT_CAP = 4000  # characters of a prompt kept for the list and for search
_CALL_NAME = re.compile(r'<tool_call>\s*\{\s*"name"\s*:\s*"((?:[^"\\]|\\.)*)"')


@dataclass(slots=True)
class Entry:
    key: str  # sample_id (the sample's identity); for a plain JSONL line without one, "line-N"
    seq: int  # order of appearance in the index
    file: int  # index into RunIndex.files; -1 when the sample has no record
    offset: int
    length: int
    prompt_index: int | None
    batch: int | None
    status: str  # completed | partial | failed | discarded
    reason: str | None  # failure class or discard reason
    message: str | None  # failure detail (checkpoint)
    turns: int  # assistant turns
    tools: tuple[str, ...]  # tools called at least once
    tool_calls: int
    tool_failures: int
    tokens: int | None  # prompt + completion tokens of the whole trajectory
    cost: float | None
    passed: bool | None  # verification outcome, when the record carries one
    score: float | None
    task_type: str | None
    prompt: str  # the first human turn, capped at PROMPT_CAP characters
    attempts: int | None = None
    # the record's verification as statistics.json counts it (verify.result.verdict): passed,
    # failed, unverified or error:<kind>; None for a sample without a record
    verdict: str | None = None

    def row(self) -> dict[str, Any]:
        """What the sample list shows of it (the prompt shortened)."""
        return {"key": self.key, "prompt_index": self.prompt_index, "batch": self.batch, "status": self.status,
                "reason": self.reason, "message": self.message, "turns": self.turns, "tools": list(self.tools),
                "tool_calls": self.tool_calls, "tool_failures": self.tool_failures, "tokens": self.tokens,
                "cost": self.cost, "passed": self.passed, "score": self.score, "task_type": self.task_type,
                "prompt": self.prompt[:300], "attempts": self.attempts, "has_record": self.file >= 0,
                "verification": verdict_view(self.verdict)}


def verdict_label(verification: Any) -> str:
    """One string for a record's verification state (verify.result.verdict): `error:<kind>` for an error."""
    state, error = verdict(verification)
    return f"error:{error}" if error is not None else state


def verdict_view(label: str | None) -> dict[str, Any] | None:
    """What the page gets of a verdict label: {state, error}."""
    if label is None:
        return None
    state, _, error = label.partition(":")
    return {"state": state, "error": error or None}


def _int(v: Any) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) else None


def _num(v: Any) -> float | None:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def used_tools(rec: dict[str, Any]) -> dict[str, dict[str, Any]] | None:
    """The record's tool_stats entries of tools it called (most of the ~30 known ones are zeros)."""
    stats = rec.get("tool_stats")
    if not isinstance(stats, dict):
        return None
    return {n: s for n, s in stats.items() if isinstance(s, dict) and s.get("count")}


def _tools(rec: dict[str, Any], conv: list[Any], used: dict[str, Any] | None) -> tuple[tuple[str, ...], int, int]:
    if used is not None:
        return (tuple(sorted(used)), sum(int(s.get("count") or 0) for s in used.values()),
                sum(int(s.get("failure") or 0) for s in used.values()))
    names: list[str] = []  # a file from another writer: read the calls from the gpt turns
    for t in conv:
        if isinstance(t, dict) and t.get("from") == "gpt" and isinstance(t.get("value"), str):
            names += _CALL_NAME.findall(t["value"])
    return tuple(sorted(set(names))), len(names), 0


def task_type_of(rec: dict[str, Any]) -> str | None:
    meta = rec.get("metadata")
    tt = rec.get("task_type") or (meta.get("task_type") if isinstance(meta, dict) else None)
    return tt if isinstance(tt, str) else None


def summarise(rec: dict[str, Any], *, key: str, seq: int, file: int, offset: int, length: int,
              used: dict[str, Any] | None = None) -> Entry:
    conv = rec.get("conversations")
    conv = conv if isinstance(conv, list) else []
    prompt = next((t.get("value") for t in conv if isinstance(t, dict) and t.get("from") == "human"), "")
    turns = sum(1 for t in conv if isinstance(t, dict) and t.get("from") == "gpt")
    tools, calls, failures = _tools(rec, conv, used if used is not None else used_tools(rec))
    usage = rec.get("usage") if isinstance(rec.get("usage"), dict) else {}
    tokens = None
    if "prompt_tokens" in usage or "completion_tokens" in usage:
        tokens = int(usage.get("prompt_tokens") or 0) + int(usage.get("completion_tokens") or 0)
    ver = rec.get("verification") if isinstance(rec.get("verification"), dict) else {}
    passed = ver.get("passed") if isinstance(ver.get("passed"), bool) else None
    meta = rec.get("metadata") if isinstance(rec.get("metadata"), dict) else {}
    completed = rec.get("completed")
    status = "completed" if completed or (completed is None and not rec.get("partial")) else "partial"
    return Entry(key=key, seq=seq, file=file, offset=offset, length=length,
                 prompt_index=_int(rec.get("prompt_index")), batch=_int(meta.get("batch_num")), status=status,
                 reason=None, message=None, turns=turns, tools=tools, tool_calls=calls, tool_failures=failures,
                 tokens=tokens, cost=_num(usage.get("cost")), passed=passed, score=_num(ver.get("score")),
                 task_type=task_type_of(rec), prompt=str(prompt)[:PROMPT_CAP],
                 verdict=verdict_label(rec.get("verification")))


def outcome_entry(identity: str, info: dict[str, Any], seq: int) -> Entry:
    """A failed or discarded sample known only from checkpoint.json."""
    usage = info.get("usage") if isinstance(info.get("usage"), dict) else {}
    tokens = None
    if usage:
        tokens = int(usage.get("prompt_tokens") or 0) + int(usage.get("completion_tokens") or 0)
    return Entry(key=identity, seq=seq, file=-1, offset=0, length=0, prompt_index=None,
                 batch=_int(info.get("batch")), status=str(info.get("status")), reason=info.get("reason"),
                 message=info.get("message"), turns=0, tools=(), tool_calls=0, tool_failures=0, tokens=tokens,
                 cost=_num(usage.get("cost")), passed=None, score=None, task_type=None, prompt="",
                 attempts=_int(info.get("attempts")))

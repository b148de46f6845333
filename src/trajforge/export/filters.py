"""Which trajectories an export keeps, and which split each goes to (pure, shared by every format).

Sampling and splitting hash the sample identity with the seed instead of drawing random numbers,
so they stream (no count needed in advance), and a sample lands in the same split every time:
re-exporting a run that grew, or with other filters, never moves a sample from test to train.
Splits hash the row identity, so the rollouts of one prompt never straddle train and test.
`--sample_percent P` therefore keeps about P% (each sample independently), not exactly P%.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from trajforge.errors import UsageError

Only = Literal["completed", "passed", "all"]
_SPLIT_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*\Z")


def unit_hash(*parts: object) -> float:
    """A uniform number in [0, 1) determined by `parts`."""
    digest = hashlib.blake2b("\x1f".join(map(str, parts)).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2**64


def parse_split(text: str) -> list[tuple[str, float]]:
    """`train=0.95,test=0.05` -> [("train", 0.95), ("test", 0.05)]. Raises UsageError."""
    out: list[tuple[str, float]] = []
    for part in text.split(","):
        name, eq, frac = part.strip().partition("=")
        if not eq or not _SPLIT_NAME.match(name):
            raise UsageError(f"--split: invalid part {part.strip()!r}: must look like name=fraction, "
                             "e.g. train=0.95,test=0.05")
        try:
            value = float(frac)
        except ValueError:
            raise UsageError(f"--split: invalid fraction {frac!r} of split {name!r}: must be a number") from None
        if not 0 < value <= 1:
            raise UsageError(f"--split: fraction of {name!r} is {value:g}: must be more than 0 and at most 1")
        if name in (n for n, _ in out):
            raise UsageError(f"--split: split {name!r} is named twice")
        out.append((name, value))
    total = sum(v for _, v in out)
    if abs(total - 1) > 1e-6:
        raise UsageError(f"--split: fractions add up to {total:g}: they must add up to 1")
    return out


def identity(record: dict[str, Any]) -> str:
    """The sample identity a record carries; records from elsewhere fall back to their prompt."""
    sid = record.get("sample_id")
    if isinstance(sid, str) and sid:
        return sid
    conv = record.get("conversations") or []
    prompt = next((t.get("value") for t in conv if isinstance(t, dict) and t.get("from") == "human"), "")
    return "prompt:" + hashlib.sha256(str(prompt).encode()).hexdigest()


def row_identity(sample_id: str) -> str:
    """The dataset row a sample identity belongs to: rollout k > 0 of a row is "<row>#k"."""
    row, sep, k = sample_id.rpartition("#")
    return row if sep and k.isdigit() else sample_id


def tool_calls(record: dict[str, Any]) -> int:
    stats = record.get("tool_stats")
    if isinstance(stats, dict):
        return sum(int(s.get("count", 0)) for s in stats.values() if isinstance(s, dict))
    return sum(str(t.get("value", "")).count("<tool_call>\n") for t in record.get("conversations") or ()
               if isinstance(t, dict) and t.get("from") == "gpt")


def record_task_type(record: dict[str, Any]) -> str | None:
    """A task type the record itself carries (top level, its metadata, or its dataset row)."""
    for holder in (record, record.get("metadata"), record.get("row")):
        if isinstance(holder, dict) and isinstance(holder.get("task_type"), str):
            return holder["task_type"]
    return None


def verification_of(record: dict[str, Any]) -> dict[str, Any] | None:
    """The record's verification result, or None when the sample was not verified: no field, or
    the runner's `method: "none"` (a row that asked for no verification)."""
    v = record.get("verification")
    return v if isinstance(v, dict) and v.get("method") != "none" else None


def passed(record: dict[str, Any]) -> bool | None:
    """The verification verdict, or None when the record was not verified."""
    v = verification_of(record)
    return bool(v.get("passed")) if isinstance(v, dict) and v.get("passed") is not None else None


@dataclass(frozen=True)
class Filters:
    only: Only = "all"
    min_tool_calls: int = 0
    task_type: str | None = None
    sample_percent: float | None = None
    seed: int = 42
    split: tuple[tuple[str, float], ...] = ()

    def reject(self, record: dict[str, Any], task_type_of: Callable[[dict[str, Any]], str | None]) -> str | None:
        """Why the record is left out (a short reason used in the summary), or None to keep it."""
        if self.only == "completed" and not record.get("completed"):
            return "not completed"
        if self.only == "passed" and not passed(record):
            return "not passed" if passed(record) is False else "not verified"
        if self.min_tool_calls and tool_calls(record) < self.min_tool_calls:
            return f"fewer than {self.min_tool_calls} tool calls"
        if self.task_type is not None and task_type_of(record) != self.task_type:
            return f"task type is not {self.task_type}"
        if self.sample_percent is not None and unit_hash(self.seed, "sample", identity(record)) * 100 >= \
                self.sample_percent:
            return "not sampled (--sample_percent)"
        return None

    def split_of(self, record: dict[str, Any]) -> str | None:
        if not self.split:
            return None
        u = unit_hash(self.seed, "split", row_identity(identity(record)))  # a row's rollouts stay together
        edge = 0.0
        for name, frac in self.split:
            edge += frac
            if u < edge:
                return name
        return self.split[-1][0]  # rounding: fractions add up to 1 within 1e-6

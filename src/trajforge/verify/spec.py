"""What a row asks to verify, and how row fields, task-type defaults and run defaults combine (pure).

A row may carry `check`, `check_timeout`, `expected`, `match`, `rubric` and `judge_threshold`;
`task_types.<name>` in the config may give defaults for any of them; a row's own value wins.
Values are validated when the dataset is read (the row's fields) and again once resolved (a
task-type `match: regex` meets a row's `expected`), so a bad pattern stops the run before it
starts instead of failing every sample.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, fields, replace
from typing import Any, Literal

from trajforge.verify.answer import parse_number

Match = Literal["exact", "contains", "regex", "number"]
MATCH_MODES: tuple[str, ...] = ("exact", "contains", "regex", "number")
ROW_FIELDS = ("check", "check_timeout", "expected", "match", "rubric", "judge_threshold")


@dataclass(frozen=True, slots=True)
class VerifySpec:
    """Every field optional: None means "not given here" until resolved."""

    check: str | None = None
    check_timeout: float | None = None
    expected: str | None = None
    match: str | None = None
    rubric: str | None = None
    judge_threshold: float | None = None

    @property
    def empty(self) -> bool:
        return self.check is None and self.expected is None and self.rubric is None


@dataclass(frozen=True, slots=True)
class Resolved:
    """A sample's verification with every default applied."""

    check: str | None
    check_timeout: float
    expected: str | None
    match: str
    rubric: str | None
    judge_threshold: float

    @property
    def methods(self) -> list[str]:
        return [m for m, v in (("check", self.check), ("expected", self.expected), ("rubric", self.rubric))
                if v is not None]


def _number(name: str, value: Any, hi: float | None) -> tuple[str | None, float | None]:
    """A number > 0 (hi None) or within 0..hi."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return f"field '{name}' must be a number", None
    if hi is None and not value > 0:
        return f"field '{name}' must be greater than 0, got {value}", None
    if hi is not None and not 0 <= value <= hi:
        return f"field '{name}' must be within 0..{hi:g}, got {value}", None
    return None, float(value)


def parse_row(obj: dict[str, Any]) -> tuple[str | None, VerifySpec | None]:
    """(problem, spec) from a dataset row's verification fields; spec is None when it has none."""
    if not any(k in obj for k in ROW_FIELDS):
        return None, None
    values: dict[str, Any] = {}
    for name in ("check", "rubric"):
        if name in obj and obj[name] is not None:
            v = obj[name]
            if not isinstance(v, str) or not v.strip():
                return f"field '{name}' must be a non-empty string", None
            values[name] = v
    if obj.get("expected") is not None:
        v = obj["expected"]
        if isinstance(v, bool) or not isinstance(v, (str, int, float)):
            return "field 'expected' must be a string or a number", None
        values["expected"] = v if isinstance(v, str) else repr(v) if isinstance(v, float) else str(v)
    if obj.get("match") is not None:
        if obj["match"] not in MATCH_MODES:
            return f"field 'match' must be one of {', '.join(MATCH_MODES)}, got {obj['match']!r}", None
        values["match"] = obj["match"]
    if obj.get("check_timeout") is not None:
        problem, values["check_timeout"] = _number("check_timeout", obj["check_timeout"], None)
        if problem:
            return problem, None
    if obj.get("judge_threshold") is not None:
        problem, values["judge_threshold"] = _number("judge_threshold", obj["judge_threshold"], 1)
        if problem:
            return problem, None
    spec = VerifySpec(**values)
    return problem_of(spec), spec


def problem_of(spec: VerifySpec | Resolved) -> str | None:
    """What is wrong with an expected answer under its match mode (None: nothing)."""
    if spec.expected is None:
        return None
    if spec.match == "regex":
        try:
            re.compile(spec.expected)
        except re.error as e:
            return f"field 'expected' is not a valid regular expression for match 'regex': {e}"
    if spec.match == "number" and parse_number(spec.expected) is None:
        return f"field 'expected' must be a number for match 'number', got {spec.expected!r}"
    return None


def resolve(row: VerifySpec | None, task_default: VerifySpec | None, *, check_timeout: float,
            judge_threshold: float) -> Resolved:
    """The row's values over the task type's over the run's defaults."""
    merged = task_default or VerifySpec()
    if row is not None:
        merged = replace(merged, **{f.name: getattr(row, f.name) for f in fields(VerifySpec)
                                    if getattr(row, f.name) is not None})
    return Resolved(
        check=merged.check,
        check_timeout=merged.check_timeout if merged.check_timeout is not None else check_timeout,
        expected=merged.expected,
        match=merged.match or "contains",
        rubric=merged.rubric,
        judge_threshold=merged.judge_threshold if merged.judge_threshold is not None else judge_threshold,
    )

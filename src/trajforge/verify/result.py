"""One verification part per method, and the record's `verification` built from them (pure).

A part either has a verdict (passed True/False with a score in [0, 1]) or an error kind: the
verification could not run (`check_timeout`, `check_error`, `judge_failed`, `judge_invalid`).
An error is never turned into a pass or a fail: the combined result then has passed = None and
names the error, and the run counts it by kind.

Combined: `passed` is true when every part passed; `score` is the lowest part score (all must
hold); `method` joins the methods used ("check+rubric"), "none" when the row asks for nothing;
`detail` maps each method to its own detail.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

ERROR_KINDS = ("check_timeout", "check_error", "judge_failed", "judge_invalid")


@dataclass(slots=True)
class Part:
    method: str  # check | expected | rubric
    passed: bool | None
    score: float | None
    detail: dict[str, Any] = field(default_factory=dict)
    error: str | None = None  # one of ERROR_KINDS when the verification could not run

    @classmethod
    def verdict(cls, method: str, passed: bool, detail: dict[str, Any], score: float | None = None) -> Part:
        return cls(method, passed, float(passed) if score is None else score, detail)

    @classmethod
    def failure(cls, method: str, kind: str, detail: dict[str, Any]) -> Part:
        assert kind in ERROR_KINDS, kind
        return cls(method, None, None, detail, kind)


def combine(parts: list[Part]) -> dict[str, Any]:
    """The `verification` value of a record."""
    if not parts:
        return {"passed": None, "score": None, "method": "none", "detail": {}, "error": None}
    method = "+".join(p.method for p in parts)
    detail = {p.method: p.detail for p in parts}
    errors = [p.error for p in parts if p.error is not None]
    if errors:
        return {"passed": None, "score": None, "method": method, "detail": detail, "error": errors[0]}
    scores = [p.score for p in parts if p.score is not None]
    return {"passed": all(p.passed for p in parts), "score": round(min(scores), 6) if scores else None,
            "method": method, "detail": detail, "error": None}


def verdict(verification: Any) -> tuple[str, str | None]:
    """A record's `verification` as one of four states, with the error kind of "error": "unverified"
    (no verification, or the row asked for none), "error" (it could not run), "passed", "failed".
    statistics.json counts records this way (runner.verify_stats) and the viewer shows them so."""
    if not isinstance(verification, dict) or verification.get("method", "none") == "none":
        return "unverified", None
    if verification.get("error"):
        return "error", str(verification["error"])
    return ("passed" if verification.get("passed") is True else "failed"), None


def passed(record: dict[str, Any] | None) -> bool:
    """Whether a trajectory record's verification passed (False for none, a fail or an error)."""
    v = (record or {}).get("verification")
    return isinstance(v, dict) and v.get("passed") is True


def tampered(record: dict[str, Any] | None) -> bool:
    """Whether a task record's agent changed what its tests depend on (verification.tampered non-empty)."""
    v = (record or {}).get("verification")
    return isinstance(v, dict) and bool(v.get("tampered"))

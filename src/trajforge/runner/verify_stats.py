"""Verification statistics (pure aggregation over trajectory records), as runner.figures.VerifyFigures.

Counted per rollout record: passed, failed, errors by kind (a verification that could not run)
and unverified (the row asks for nothing). The pass rate is passes / (passes + fails): errors
and unverified rollouts have no verdict, so they are counted apart, never as fails. Per row:
rollouts (records), passes and verdicts; pass@1 and pass@k (k = --samples_per_prompt) are the
means over rows with at least one verdict of the unbiased estimator from those verdicts.
"""

from __future__ import annotations

import base64
from array import array
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from trajforge.dataset import split_rollout
from trajforge.runner.figures import PassAtK, RowFigures, TaskTypeFigures, VerifyFigures
from trajforge.verify.passk import mean_pass_at_k
from trajforge.verify.result import ERROR_KINDS

NO_TASK_TYPE = "(none)"


@dataclass
class VerifyTotals:
    k: int = 1
    task_types: dict[str, str | None] = field(default_factory=dict)  # row identity -> task_type
    passed: int = 0
    failed: int = 0
    unverified: int = 0
    errors: Counter[str] = field(default_factory=Counter)
    by_type: dict[str, list[int]] = field(default_factory=dict)  # type -> [passed, failed, errors]
    rows: dict[str, list[int]] = field(default_factory=dict)  # row identity -> [index, rollouts, passes, verdicts]
    # With one rollout a row, a row whose record has no verdict is only its index: 8 bytes, not a
    # ~150-byte dict entry (a million-row run keeps these figures from one invocation to the next)
    plain: array = field(default_factory=lambda: array("q"))
    skipped_solved: int = 0
    not_kept: int = 0
    per_row: bool = True  # list every row (the run's figures; not repeated for the last invocation)

    def add(self, rec: dict[str, Any]) -> None:
        row_id = split_rollout(str(rec.get("sample_id", "")))[0]
        v = rec.get("verification")
        unverified = not isinstance(v, dict) or v.get("method", "none") == "none"
        if unverified and self.k == 1 and row_id not in self.rows:
            self.plain.append(int(rec.get("prompt_index", -1)))
            self.unverified += 1
            return
        row = self.rows.setdefault(row_id, [int(rec.get("prompt_index", -1)), 0, 0, 0])
        row[1] += 1
        if unverified:
            self.unverified += 1
            return
        assert isinstance(v, dict)
        tt = self.by_type.setdefault(self.task_types.get(row_id) or NO_TASK_TYPE, [0, 0, 0])
        if v.get("error"):
            self.errors[str(v["error"])] += 1
            tt[2] += 1
        elif v.get("passed") is True:
            self.passed += 1
            tt[0] += 1
            row[2] += 1
            row[3] += 1
        else:
            self.failed += 1
            tt[1] += 1
            row[3] += 1

    def figures(self, cost: float) -> VerifyFigures:
        verdict_rows = [(r[3], r[2]) for r in self.rows.values()]
        listed = self.per_row and (self.k > 1 or self.passed or self.failed or self.errors)
        return VerifyFigures(
            verified=self.passed + self.failed,
            passed=self.passed,
            failed=self.failed,
            pass_rate=_rate(self.passed, self.passed + self.failed),
            errors=sum(self.errors.values()),
            errors_by_kind={kind: self.errors.get(kind, 0) for kind in
                            (*ERROR_KINDS, *sorted(set(self.errors) - set(ERROR_KINDS)))},
            unverified=self.unverified,
            by_task_type={name: TaskTypeFigures(p, f, e, _rate(p, p + f))
                          for name, (p, f, e) in sorted(self.by_type.items())},
            rows=len(self.rows) + len(self.plain),
            rows_solved=sum(1 for r in self.rows.values() if r[2]),
            pass_at_1=_round(mean_pass_at_k(verdict_rows, 1)),
            pass_at_k=PassAtK(self.k, _round(mean_pass_at_k(verdict_rows, self.k))),
            skipped_solved=self.skipped_solved,
            not_kept=self.not_kept,
            cost_per_pass=round(cost / self.passed, 8) if self.passed else None,
            per_row=[RowFigures(i, n, c, v) for i, n, c, v in
                     sorted([*self.rows.values(), *([i, 1, 0, 0] for i in self.plain)])] if listed else None,
        )

    def state(self) -> dict[str, Any]:
        """What the incremental merge keeps of these figures (runner.merge): `from_state` reads it."""
        return {"passed": self.passed, "failed": self.failed, "unverified": self.unverified,
                "errors": dict(self.errors), "by_type": self.by_type, "rows": self.rows,
                "plain": base64.b64encode(self.plain.tobytes()).decode(), "not_kept": self.not_kept}

    def load_state(self, state: dict[str, Any]) -> None:
        self.passed, self.failed, self.unverified = state["passed"], state["failed"], state["unverified"]
        self.errors, self.by_type, self.rows = Counter(state["errors"]), state["by_type"], state["rows"]
        self.plain = array("q", base64.b64decode(state["plain"]))
        self.not_kept = state["not_kept"]


def _rate(num: int, den: int) -> float | None:
    return round(num / den, 4) if den else None


def _round(x: float | None) -> float | None:
    return None if x is None else round(x, 6)


def table_rows(v: VerifyFigures) -> list[tuple[str, str]]:
    """Rows of the end-of-run table (nothing when no record asked for verification)."""
    if not v.verified and not v.errors:
        return []
    rate = "-" if v.pass_rate is None else f"{100 * v.pass_rate:.1f}%"
    rows = [("verified: passed / failed", f"{v.passed} / {v.failed} ({rate})")]
    rows += [(f"  pass rate {name}", f"{t.passed}/{t.passed + t.failed}")
             for name, t in v.by_task_type.items() if name != NO_TASK_TYPE or len(v.by_task_type) > 1]
    fmt = lambda x: "-" if x is None else f"{x:.3f}"  # noqa: E731
    rows.append((f"pass@1 / pass@{v.pass_at_k.k} ({v.rows} rows)", f"{fmt(v.pass_at_1)} / {fmt(v.pass_at_k.value)}"))
    rows += [(f"  verification error: {k}", str(n)) for k, n in v.errors_by_kind.items() if n]
    if v.skipped_solved:
        rows.append(("rollouts skipped (solved)", str(v.skipped_solved)))
    if v.not_kept:
        rows.append(("not kept (--keep passed)", str(v.not_kept)))
    if v.cost_per_pass is not None:
        rows.append(("cost per passing trajectory", f"${v.cost_per_pass:.4f}"))
    return rows

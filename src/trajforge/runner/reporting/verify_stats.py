"""Verification statistics (pure aggregation over trajectory records), as runner.reporting.figures.VerifyFigures.

Counted per rollout record: passed, failed, errors by kind (a verification that could not run)
and unverified (the row asks for nothing). The pass rate is passes / (passes + fails): errors
and unverified rollouts have no verdict, so they are counted apart, never as fails. Per row:
rollouts (records), passes and verdicts; pass@1 and pass@k (k = --samples_per_prompt) are the
means over rows with at least one verdict of the unbiased estimator from those verdicts.
"""

from __future__ import annotations

import base64
import sys
import zlib
from array import array
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from trajforge.dataset import split_rollout
from trajforge.runner.reporting.figures import PassAtK, RowFigures, TaskTypeFigures, VerifyFigures, usd
from trajforge.verify.passk import mean_pass_at_k_counted
from trajforge.verify.result import ERROR_KINDS, verdict

NO_TASK_TYPE = "(none)"
_ROW_LIMIT = 1 << 31  # prompt indexes past this (or none) are rows of `irregular`


def _counts() -> array:
    return array("I")


@dataclass
class VerifyTotals:
    """Rows are known by their prompt_index, the row's place in the dataset: the merge writes every
    record with its place in the current one (runner.reporting.merge), so one index is one row. Per row,
    rollouts, passes and verdicts are three arrays: 12 bytes a row, not a dict entry (a
    million-row run keeps these figures from one invocation to the next). A record without a
    usable prompt_index is a row of its own, by identity (`irregular`)."""

    k: int = 1
    task_types: dict[str, str | None] = field(default_factory=dict)  # row identity -> task_type, when not given
    passed: int = 0
    failed: int = 0
    unverified: int = 0
    errors: Counter[str] = field(default_factory=Counter)
    failures: Counter[str] = field(default_factory=Counter)  # fails scored 0 for what the agent could have caused
    by_type: dict[str, list[int]] = field(default_factory=dict)  # type -> [passed, failed, errors]
    rollouts: array = field(default_factory=_counts)  # by prompt_index
    passes: array = field(default_factory=_counts)
    verdicts: array = field(default_factory=_counts)
    irregular: dict[str, list[int]] = field(default_factory=dict)  # row identity -> [index, rollouts, passes, verdicts]
    skipped_solved: int = 0
    not_kept: int = 0
    per_row: bool = True  # list every row (the run's figures; not repeated for the last invocation)

    def add(self, rec: dict[str, Any], task_type: str | None = None, *, typed: bool = False) -> None:
        """Count one record; `task_type` is its row's when `typed`, else looked up in task_types."""
        row_id = split_rollout(str(rec.get("sample_id", "")))[0]
        index = rec.get("prompt_index", -1)
        if isinstance(index, int) and not isinstance(index, bool) and 0 <= index < _ROW_LIMIT:
            if index >= len(self.rollouts):
                grow = array("I", bytes(4 * (index + 1 - len(self.rollouts))))
                for arr in (self.rollouts, self.passes, self.verdicts):
                    arr.extend(grow)
            at: Any = None
        else:
            at = self.irregular.setdefault(row_id, [int(index) if isinstance(index, int) else -1, 0, 0, 0])
        self._bump(at, index, 0)
        v = rec.get("verification")
        state, error = verdict(v)
        if state == "unverified":
            self.unverified += 1
            return
        name = (task_type if typed else self.task_types.get(row_id)) or NO_TASK_TYPE
        tt = self.by_type.setdefault(name, [0, 0, 0])
        if state == "error":
            self.errors[str(error)] += 1
            tt[2] += 1
        elif state == "passed":
            self.passed += 1
            tt[0] += 1
            self._bump(at, index, 1)
            self._bump(at, index, 2)
        else:
            self.failed += 1
            tt[1] += 1
            self._bump(at, index, 2)
            if isinstance(v, dict) and v.get("failure"):
                self.failures[str(v["failure"])] += 1

    def _bump(self, at: list[int] | None, index: int, which: int) -> None:
        if at is not None:
            at[1 + which] += 1
        else:
            (self.rollouts, self.passes, self.verdicts)[which][index] += 1

    def rows(self) -> list[tuple[int, int, int, int]]:
        """(index, rollouts, passes, verdicts) of every row with a record, in index order."""
        dense = [(i, n, self.passes[i], self.verdicts[i]) for i, n in enumerate(self.rollouts) if n]
        return sorted([*(tuple(r) for r in self.irregular.values()), *dense])  # type: ignore[misc]

    def row_passes(self, index: int) -> int:
        """Passing records of the row at `index` (0 when it has none)."""
        return self.passes[index] if 0 <= index < len(self.passes) else 0

    def figures(self, cost: float) -> VerifyFigures:
        verdict_rows: Counter[tuple[int, int]] = Counter(zip(self.verdicts, self.passes))
        for _, _, c, v in self.irregular.values():
            verdict_rows[(v, c)] += 1
        listed = self.per_row and (self.k > 1 or self.passed or self.failed or self.errors)
        rows = sum(1 for n in self.rollouts if n) + len(self.irregular)
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
            rows=rows,
            rows_solved=sum(1 for c in self.passes if c) + sum(1 for r in self.irregular.values() if r[2]),
            rows_with_verdict=sum(1 for v in self.verdicts if v) + sum(1 for r in self.irregular.values() if r[3]),
            pass_at_1=_round(mean_pass_at_k_counted(verdict_rows, 1)),
            pass_at_k=PassAtK(self.k, _round(mean_pass_at_k_counted(verdict_rows, self.k))),
            skipped_solved=self.skipped_solved,
            not_kept=self.not_kept,
            cost_per_pass=round(cost / self.passed, 8) if self.passed else None,
            per_row=[RowFigures(*r) for r in self.rows()] if listed else None,
            failures_by_kind=dict(sorted(self.failures.items())) or None,
        )

    def state(self) -> dict[str, Any]:
        """What the incremental merge keeps of these figures (runner.reporting.merge): `load_state` reads it."""
        return {"passed": self.passed, "failed": self.failed, "unverified": self.unverified,
                "errors": dict(self.errors), "by_type": self.by_type, "rollouts": _pack(self.rollouts),
                "passes": _pack(self.passes), "verdicts": _pack(self.verdicts), "irregular": self.irregular,
                "not_kept": self.not_kept, "failures": dict(self.failures)}

    def load_state(self, state: dict[str, Any]) -> None:
        self.passed, self.failed, self.unverified = state["passed"], state["failed"], state["unverified"]
        self.errors, self.by_type = Counter(state["errors"]), state["by_type"]
        self.rollouts, self.passes = _unpack(state["rollouts"]), _unpack(state["passes"])
        self.verdicts, self.irregular = _unpack(state["verdicts"]), state["irregular"]
        self.not_kept = state["not_kept"]
        self.failures = Counter(state.get("failures", {}))  # absent from a state written before


def _pack(arr: array) -> str:
    """An array of counts as text for checkpoint.json: little-endian, deflated (mostly alike), base64."""
    if sys.byteorder != "little":
        arr = array("I", arr)
        arr.byteswap()
    return base64.b64encode(zlib.compress(arr.tobytes(), 1)).decode()


def _unpack(text: str) -> array:
    arr = array("I", zlib.decompress(base64.b64decode(text)))
    if sys.byteorder != "little":
        arr.byteswap()
    return arr


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
    rows.append((f"pass@1 / pass@{v.pass_at_k.k} ({v.rows_with_verdict} of {v.rows} rows have a verdict)",
                 f"{fmt(v.pass_at_1)} / {fmt(v.pass_at_k.value)}"))
    rows += [(f"  verification error: {k}", str(n)) for k, n in v.errors_by_kind.items() if n]
    if v.skipped_solved:
        rows.append(("rollouts skipped (solved)", str(v.skipped_solved)))
    if v.not_kept:
        rows.append(("not kept (--keep passed)", str(v.not_kept)))
    if v.cost_per_pass is not None:
        rows.append(("cost per passing trajectory", usd(v.cost_per_pass)))
    return rows

"""The run overview and the sample list's filtering (pure functions over index entries).

The overview's figures are the run's own `Totals` (runner/stats.py) over the same inputs the run
uses for statistics.json: the kept records, plus failed and discarded samples from the
checkpoint, plus the invocations' seconds. So a finished run's page shows statistics.json's
numbers, and a live run's page shows the same figures as they grow.
"""

from __future__ import annotations

import copy
import math
from collections import Counter
from dataclasses import dataclass
from typing import Any

from trajforge.view.summary import Entry

STATUSES = ("completed", "partial", "failed", "discarded")


def run_totals(base: Any, outcomes: list[Entry], checkpoint: dict[str, Any]) -> Any:
    """`base` (the kept records' Totals) plus the samples that have no record."""
    totals = copy.deepcopy(base)
    samples = checkpoint.get("samples") or {}
    for e in outcomes:
        if e.status == "failed":
            totals.failed[e.reason or "internal"] += 1
        else:
            totals.discarded[e.reason or "unknown"] += 1
            info = samples.get(e.key) or {}
            totals.add_usage(info.get("usage") or {}, int(info.get("api_calls", 0)))
    return totals


def _nice_step(span: float, bins: int) -> float:
    raw = max(span / bins, 1e-9)
    mag = 10 ** math.floor(math.log10(raw))
    return next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)


def histogram(values: list[int], bins: int = 12) -> list[dict[str, Any]]:
    """Counts over equal bins [lo, hi) of round widths; one bin per value when few distinct ones."""
    if not values:
        return []
    lo, hi = min(values), max(values)
    if hi - lo < bins:
        counts = Counter(values)
        return [{"lo": v, "hi": v + 1, "count": counts.get(v, 0)} for v in range(lo, hi + 1)]
    step = max(1, math.ceil(_nice_step(hi - lo + 1, bins)))
    start = (lo // step) * step
    n = (hi - start) // step + 1
    counts = Counter((v - start) // step for v in values)
    return [{"lo": start + i * step, "hi": start + (i + 1) * step, "count": counts.get(i, 0)} for i in range(n)]


def verification(entries: list[Entry]) -> dict[str, Any] | None:
    checked = [e for e in entries if e.passed is not None]
    if not checked:
        return None
    passed = sum(1 for e in checked if e.passed)
    scores = [e.score for e in checked if e.score is not None]
    return {"verified": len(checked), "passed": passed, "failed": len(checked) - passed,
            "pass_rate": round(passed / len(checked), 4),
            "mean_score": round(sum(scores) / len(scores), 4) if scores else None}


def distributions(entries: list[Entry]) -> dict[str, Any]:
    kept = [e for e in entries if e.file >= 0 and e.status in ("completed", "partial")]
    return {"turns": histogram([e.turns for e in kept]),
            "tokens": histogram([e.tokens for e in kept if e.tokens is not None]),
            "verification": verification(kept),
            "task_types": dict(Counter(e.task_type for e in kept if e.task_type).most_common())}


SORTS = ("turns", "tool_calls", "tokens", "cost")  # besides dataset order: largest first


@dataclass(frozen=True)
class Query:
    status: str = ""
    tool: str = ""
    task_type: str = ""
    reason: str = ""  # failure class or discard reason
    q: str = ""  # text searched in prompts, case-insensitive
    sort: str = ""  # one of SORTS, or dataset order

    @classmethod
    def from_params(cls, params: Any) -> Query:
        fields = ("status", "tool", "task_type", "reason", "q", "sort")
        return cls(**{k: str(params.get(k, "")).strip() for k in fields})

    def matches(self, e: Entry) -> bool:
        return ((not self.status or e.status == self.status) and (not self.tool or self.tool in e.tools)
                and (not self.task_type or e.task_type == self.task_type)
                and (not self.reason or e.reason == self.reason)
                and (not self.q or self.q.casefold() in e.prompt.casefold()))


def apply(query: Query, entries: list[Entry]) -> list[Entry]:
    rows = entries if query == Query(sort=query.sort) else [e for e in entries if query.matches(e)]
    if query.sort in SORTS:  # stable: ties stay in dataset order; samples without the figure last
        rows = sorted(rows, key=lambda e: -(getattr(e, query.sort) or 0))
    return rows


def facets(entries: list[Entry]) -> dict[str, dict[str, int]]:
    """The values each filter can take, with their counts over all samples."""
    status: Counter[str] = Counter()
    tools: Counter[str] = Counter()
    types: Counter[str] = Counter()
    reasons: Counter[str] = Counter()
    for e in entries:
        status[e.status] += 1
        tools.update(e.tools)
        if e.task_type:
            types[e.task_type] += 1
        if e.reason:
            reasons[e.reason] += 1
    return {"status": {s: status.get(s, 0) for s in STATUSES}, "tool": dict(sorted(tools.items())),
            "task_type": dict(sorted(types.items())), "reason": dict(sorted(reasons.items()))}

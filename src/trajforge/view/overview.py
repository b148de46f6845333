"""The run overview and the sample list's filtering, over the index's columns (view.columns).

The overview's figures are the run's own `Totals` (runner/reporting/stats.py) over the same inputs the run
uses for statistics.json: the kept records, plus failed and discarded samples from the
checkpoint, plus the invocations' seconds. So a finished run's page shows statistics.json's
numbers, and a live run's page shows the same figures as they grow.

`Entries` is a list of samples by number (records, then the checkpoint's outcomes: see
RunIndex.order); filters, sorting, facets and distributions read the columns, and an `Entry` is
made only for a sample that is shown.
"""

from __future__ import annotations

import copy
import math
from array import array
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, overload

from trajforge.view.columns import OUTCOME, STATUSES
from trajforge.view.summary import Entry


class Entries(Sequence[Entry]):
    """Samples of an index, by number, in a given order."""

    def __init__(self, index: Any, ids: array) -> None:
        self.index, self.ids = index, ids

    def __len__(self) -> int:
        return len(self.ids)

    @overload
    def __getitem__(self, i: int) -> Entry: ...
    @overload
    def __getitem__(self, i: slice) -> list[Entry]: ...
    def __getitem__(self, i: int | slice) -> Entry | list[Entry]:
        if isinstance(i, slice):
            return [self.index.entry(n) for n in self.ids[i]]
        return self.index.entry(self.ids[i])

    def __iter__(self) -> Iterator[Entry]:
        return (self.index.entry(n) for n in self.ids)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Entries) and other.index is self.index and other.ids == self.ids

    def position(self, entry: Entry) -> int | None:
        """Where `entry` (as made by the index) is in this list."""
        n = entry.seq
        try:
            return self.ids.index(n)
        except ValueError:
            return None

    def split(self) -> tuple[Any, list[int], list[Entry]]:
        """(the record columns, the record numbers, the outcome entries) of this list."""
        outcomes = self.index.outcomes
        return (self.index.records, [i for i in self.ids if i < OUTCOME],
                [outcomes[i - OUTCOME] for i in self.ids if i >= OUTCOME])


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


def verification(entries: Entries) -> dict[str, Any] | None:
    """The kept records' verification counted as statistics.json's `verification` counts it
    (verify.result.verdict): passed, failed, errors by kind, unverified; None when none was verified."""
    cols, records, _ = entries.split()
    kept = [i for i in records if cols.status[i] < 2]  # completed, partial
    labels = Counter(cols.verdicts.values[cols.verdict[i]] for i in kept)
    errors = {str(k).partition(":")[2]: n for k, n in labels.items() if str(k).startswith("error:")}
    passed, failed = labels.get("passed", 0), labels.get("failed", 0)
    if not (passed or failed or errors):
        return None
    scores = [cols.score[i] for i in kept if cols.verdicts.values[cols.verdict[i]] in ("passed", "failed")
              and not math.isnan(cols.score[i])]
    return {"verified": passed + failed, "passed": passed, "failed": failed,
            "pass_rate": round(passed / (passed + failed), 4) if passed + failed else None,
            "errors": sum(errors.values()), "errors_by_kind": dict(sorted(errors.items())),
            "unverified": labels.get("unverified", 0),
            "mean_score": round(sum(scores) / len(scores), 4) if scores else None}


def distributions(entries: Entries) -> dict[str, Any]:
    cols, records, _ = entries.split()
    kept = [i for i in records if cols.status[i] < 2]  # completed, partial: records kept in the run
    types = Counter(cols.task_type[i] for i in kept if cols.task_type[i])
    return {"turns": histogram([cols.turns[i] for i in kept]),
            "tokens": histogram([cols.tokens[i] for i in kept if cols.tokens[i] >= 0]),
            "verification": verification(entries),
            "task_types": {cols.task_types.values[t]: n for t, n in types.most_common()}}


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


def apply(query: Query, entries: Entries) -> Entries:
    """The samples of `entries` the query lets through, in its order."""
    ids = entries.ids
    if query != Query(sort=query.sort):
        keep = _matching(query, entries)
        ids = array("I", (n for n in ids if n in keep))
    if query.sort in SORTS:  # stable: ties stay in dataset order; samples without the figure last
        cols, outcomes = entries.index.records, entries.index.outcomes

        def figure(n: int) -> float:
            v = cols.value(query.sort, n) if n < OUTCOME else getattr(outcomes[n - OUTCOME], query.sort)
            return -(v or 0)

        ids = array("I", sorted(ids, key=figure))
    return Entries(entries.index, ids)


def _matching(query: Query, entries: Entries) -> set[int]:
    """The numbers of the samples the query lets through (records by their columns)."""
    cols, records, outcomes = entries.split()
    tests = []
    if query.status:
        code = STATUSES.index(query.status) if query.status in STATUSES else -1
        tests.append(lambda i: cols.status[i] == code)
    if query.tool:
        sets = {k for k, tools in enumerate(cols.tool_sets.values) if tools and query.tool in tools}
        tests.append(lambda i: cols.tools[i] in sets)
    if query.task_type:
        code = cols.task_types.known(query.task_type)
        tests.append(lambda i: cols.task_type[i] == code)
    if query.reason:
        code = cols.reasons.known(query.reason)
        tests.append(lambda i: cols.reason[i] == code)
    found = cols.search(query.q) if query.q else None
    keep = {i for i in records if (found is None or i in found) and all(t(i) for t in tests)}
    keep.update(e.seq for e in outcomes if query.matches(e))
    return keep


def facets(entries: Entries) -> dict[str, dict[str, int]]:
    """The values each filter can take, with their counts over all samples."""
    cols, records, outcomes = entries.split()
    status = Counter(STATUSES[cols.status[i]] for i in records)
    reasons = Counter(cols.reasons.values[cols.reason[i]] for i in records if cols.reason[i])
    types = Counter(cols.task_types.values[cols.task_type[i]] for i in records if cols.task_type[i])
    tools: Counter[str] = Counter()
    for code, count in Counter(cols.tools[i] for i in records).items():
        tools.update({name: count for name in cols.tool_sets.values[code] or ()})
    for e in outcomes:
        status[e.status] += 1
        tools.update(e.tools)
        if e.task_type:
            types[e.task_type] += 1
        if e.reason:
            reasons[e.reason] += 1
    return {"status": {s: status.get(s, 0) for s in STATUSES}, "tool": dict(sorted(tools.items())),
            "task_type": dict(sorted(types.items())), "reason": dict(sorted(reasons.items()))}

"""The typed sections of statistics.json, and their one conversion to JSON (`to_json`).

Built once at the end of an invocation (runner.reporting.report), by Totals.figures (samples, tools,
reasoning, tokens, cost), VerifyTotals.figures (verification) and RunMonitor (spend, concurrency);
read back by the end-of-run table. Each record's `to_json` is the file's layout: the fields by
name, in order, except where a record says otherwise (keys written only in some runs).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import Any


def usd(amount: float) -> str:
    """A sum of USD with at least two significant digits: a budget of $0.004 is not "$0.00"."""
    if amount == 0:
        return "$0.00"
    if abs(amount) >= 100:
        return f"${amount:,.2f}"
    return f"${amount:,.{max(4, 1 - math.floor(math.log10(abs(amount))))}f}"


class Record:
    """A section: `to_json` is its fields by name, nested sections converted too."""

    __slots__ = ()

    def to_json(self) -> dict[str, Any]:
        return _fields(self)


def _fields(record: Record, skip: tuple[str, ...] = ()) -> dict[str, Any]:
    return {f.name: _json(getattr(record, f.name)) for f in fields(record) if f.name not in skip}  # type: ignore[arg-type]


def _json(value: Any) -> Any:
    if isinstance(value, Record):
        return value.to_json()
    if isinstance(value, dict):
        return {k: _json(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_json(v) for v in value]
    return value


@dataclass(frozen=True, slots=True)
class SampleCounts(Record):
    total: int | None  # None: not known (the last invocation's figures)
    finished: int
    completed: int
    partial: int
    failed: int
    failed_by_class: dict[str, int]
    discarded: int
    discarded_by_reason: dict[str, int]


@dataclass(frozen=True, slots=True)
class ToolFigures(Record):
    count: int
    success: int
    failure: int
    success_rate: float | None
    failure_rate: float | None


@dataclass(frozen=True, slots=True)
class ReasoningFigures(Record):
    assistant_turns: int
    with_reasoning: int
    without_reasoning: int
    coverage: float | None


@dataclass(frozen=True, slots=True)
class TokenFigures(Record):
    prompt: int
    completion: int
    reasoning: int
    total: int


@dataclass(frozen=True, slots=True)
class TaskTypeFigures(Record):
    passed: int
    failed: int
    errors: int
    pass_rate: float | None


@dataclass(frozen=True, slots=True)
class PassAtK(Record):
    k: int
    value: float | None


@dataclass(frozen=True, slots=True)
class RowFigures:
    prompt_index: int
    rollouts: int
    passes: int
    verdicts: int


@dataclass(frozen=True, slots=True)
class VerifyFigures(Record):
    verified: int
    passed: int
    failed: int
    pass_rate: float | None
    errors: int
    errors_by_kind: dict[str, int]
    unverified: int
    by_task_type: dict[str, TaskTypeFigures]
    rows: int
    rows_solved: int
    rows_with_verdict: int  # the rows pass@1 and pass@k are averaged over
    pass_at_1: float | None
    pass_at_k: PassAtK
    skipped_solved: int
    not_kept: int
    cost_per_pass: float | None
    per_row: list[RowFigures] | None = None  # None: not listed (no verdicts, or not the run's figures)

    def to_json(self) -> dict[str, Any]:
        out = _fields(self, ("per_row",))
        if self.per_row is not None:  # one per dataset row: built inline, not by the generic walk
            out["per_row"] = [{"prompt_index": r.prompt_index, "rollouts": r.rollouts, "passes": r.passes,
                               "verdicts": r.verdicts} for r in self.per_row]
        return out


@dataclass(frozen=True, slots=True)
class TaskGroupFigures(Record):
    """A set of tasks (one, a category, a difficulty, all): runner.reporting.task_stats."""

    tasks: int
    rollouts: int
    verdicts: int  # rollouts with a reward
    mean_reward: float | None
    passed: int
    errors: int
    pass_at_1: float | None
    pass_at_k: float | None
    k: int


@dataclass(frozen=True, slots=True)
class TaskFigures(Record):
    """`--tasks` runs: rewards per task and per metadata category and difficulty."""

    all: TaskGroupFigures
    per_task: dict[str, TaskGroupFigures]
    by_category: dict[str, TaskGroupFigures]
    by_difficulty: dict[str, TaskGroupFigures]
    below_full_reward: list[str]  # tasks some rollout of which scored under 1 or had an error


@dataclass(frozen=True, slots=True)
class CaptureFigures(Record):
    """Token capture: samples with their calls' token ids, those without (by reason) and how their
    calls fell into training segments (runner.reporting.token_stats)."""

    samples_captured: int
    samples_without: dict[str, int]
    replies_without_ids: int  # replies that lacked the ids asked for
    calls: int
    segments: int
    prefix_breaks: int
    prefix_integrity: float | None  # calls that extended their segment / calls after a sample's first


@dataclass(frozen=True, slots=True)
class RunFigures(Record):
    """The figures of a set of samples: the whole run's, or the last invocation's."""

    samples: SampleCounts
    tools: dict[str, ToolFigures]
    reasoning: ReasoningFigures
    api_calls: int
    tokens: TokenFigures
    cost: float
    verification: VerifyFigures
    # Written only when the figures have a duration (then throughput too, None for no time at all).
    duration_seconds: float | None = None
    throughput_samples_per_minute: float | None = None
    per_worker: dict[str, int] | None = None  # written only when samples were counted by worker
    tasks: TaskFigures | None = None  # written only for runs of tasks
    token_capture: CaptureFigures | None = None  # written only when some record has token ids or lacks asked-for ones

    def to_json(self) -> dict[str, Any]:
        skip: tuple[str, ...] = () if self.duration_seconds is not None else ("duration_seconds",
                                                                             "throughput_samples_per_minute")
        skip += () if self.per_worker else ("per_worker",)
        skip += () if self.token_capture is not None else ("token_capture",)
        return _fields(self, skip if self.tasks is not None else (*skip, "tasks"))


@dataclass(frozen=True, slots=True)
class MergeFigures(Record):
    written: int
    hallucinated_filtered: int
    duplicates_ignored: int
    not_in_dataset: int
    not_kept: int
    problems: list[str]


@dataclass(frozen=True, slots=True)
class SpendFigures(Record):
    spent: float
    this_invocation: float
    max_cost: float | None
    budget_reached: bool
    average_per_sample: float | None


@dataclass(frozen=True, slots=True)
class GatePoint(Record):
    limit: int
    in_flight: int
    waiting: int
    requests_per_min: float
    tokens_per_min: int
    rate_limited_per_min: float


@dataclass(frozen=True, slots=True)
class SeriesPoint(Record):
    """One reading of the monitor: seconds since the start, USD spent, the gate's state if any."""

    t: float
    spent: float
    gate: GatePoint | None = None

    def to_json(self) -> dict[str, Any]:
        return {"t": self.t, "spent": self.spent, **(self.gate.to_json() if self.gate is not None else {})}


@dataclass(frozen=True, slots=True)
class ConcurrencyFigures(Record):
    adaptive: bool
    ceiling: int
    final_limit: int
    min_limit: int
    requests: int
    ok: int
    rate_limited: int
    series: list[SeriesPoint]


@dataclass(frozen=True, slots=True)
class ConcurrencyNote(Record):
    """In place of ConcurrencyFigures where the runner has no gate of its own (Ray)."""

    note: str


@dataclass(frozen=True, slots=True)
class SettingsChange(Record):
    """Invocation `invocation` (1-based) ran with other settings than the one before it."""

    invocation: int
    changed: dict[str, list[Any]]  # setting -> [before, after]


@dataclass(frozen=True, slots=True)
class Statistics(Record):
    """statistics.json."""

    run_name: str | None
    model: str
    distribution: str
    sandbox: str
    dataset_file: str
    invocations: int
    models: list[str]  # every invocation's model, in order of first use (runner.reporting.settings)
    settings_changes: list[SettingsChange]
    skipped_invalid: int  # dataset rows --skip_invalid left out (this invocation's dataset)
    run: RunFigures
    last_invocation: RunFigures
    merge: MergeFigures
    spend: SpendFigures
    concurrency: ConcurrencyFigures | ConcurrencyNote

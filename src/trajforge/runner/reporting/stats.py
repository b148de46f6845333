"""Run statistics (pure aggregation) and their table.

`Totals` accumulates over trajectory records and outcomes, and gives its figures as a typed
runner.reporting.figures.RunFigures (`figures`) or as their JSON (`as_dict`, for the viewer and the
exporter). The run-wide figures are rebuilt at the end from every batch file plus the checkpoint,
so a resumed run reports the whole run; the last invocation's figures come from the outcomes it
produced.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from trajforge.runner.reporting.figures import (
    ReasoningFigures, RunFigures, SampleCounts, Statistics, TokenFigures, ToolFigures, usd,
)
from trajforge.runner.reporting.task_stats import TaskTotals
from trajforge.runner.reporting.task_stats import table_rows as task_rows
from trajforge.runner.reporting.token_stats import CaptureTotals
from trajforge.runner.reporting.token_stats import table_rows as capture_rows
from trajforge.runner.reporting.verify_stats import VerifyTotals, table_rows
from trajforge.sample.outcome import FAILURE_CLASSES


EXIT_SAMPLES_FAILED = 3  # the run finished, but too many samples ended failed (--fail_on_error)


def run_pace(invocations: Iterable[tuple[int, float]]) -> tuple[int, float]:
    """(samples ended, seconds) of the invocations (ran, seconds) that ran samples: the run's
    throughput, which an invocation that found nothing to do must not skew."""
    ran = [(n, s) for n, s in invocations if n]
    return sum(n for n, _ in ran), sum(s for _, s in ran)


def too_many_failed(failed: int, total: int, threshold: float) -> bool:
    """Whether `failed` of `total` samples reach --fail_on_error: a count when >= 1, else a
    fraction of `total`. A run where every sample failed always does, whatever the threshold:
    that is an infrastructure problem (no sandbox, a dead endpoint), never data."""
    if failed <= 0:
        return False
    if total > 0 and failed >= total:
        return True
    if threshold >= 1:
        return failed >= threshold
    return failed >= threshold * total - 1e-9  # 0.3 * 10 is 3.0000000000000004


@dataclass
class Totals:
    finished: int = 0
    completed: int = 0
    partial: int = 0
    failed: Counter[str] = field(default_factory=Counter)
    discarded: Counter[str] = field(default_factory=Counter)
    tools: dict[str, list[int]] = field(default_factory=dict)  # name -> [count, success, failure]
    assistant_turns: int = 0
    turns_with_reasoning: int = 0
    api_calls: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    reasoning_tokens: int = 0
    cost: float = 0.0
    per_worker: Counter[str] = field(default_factory=Counter)
    verify: VerifyTotals = field(default_factory=VerifyTotals)
    tasks: TaskTotals = field(default_factory=TaskTotals)
    capture: CaptureTotals = field(default_factory=CaptureTotals)

    def add_usage(self, u: dict[str, Any], api_calls: int) -> None:
        self.api_calls += api_calls
        self.prompt_tokens += int(u.get("prompt_tokens", 0))
        self.completion_tokens += int(u.get("completion_tokens", 0))
        self.reasoning_tokens += int(u.get("reasoning_tokens", 0))
        self.cost += float(u.get("cost", 0.0))

    def add_record(self, rec: dict[str, Any], task_type: str | None = None, *, typed: bool = False) -> None:
        """Count a kept record; `task_type`: its row's, when `typed` (else verify.task_types says)."""
        self.finished += 1
        self.completed += bool(rec.get("completed"))
        self.partial += bool(rec.get("partial"))
        self.add_usage(rec.get("usage") or {}, int(rec.get("api_calls", 0)))
        for name, s in rec.get("tool_stats", {}).items():
            t = self.tools.setdefault(name, [0, 0, 0])
            t[0] += s.get("count", 0)
            t[1] += s.get("success", 0)
            t[2] += s.get("failure", 0)
        r = rec.get("reasoning") or {}
        self.assistant_turns += int(r.get("total_assistant_turns", 0))
        self.turns_with_reasoning += int(r.get("turns_with_reasoning", 0))
        self.verify.add(rec, task_type, typed=typed)
        self.tasks.add(rec)
        self.capture.add(rec)

    _STATE = ("finished", "completed", "partial", "tools", "assistant_turns", "turns_with_reasoning", "api_calls",
              "prompt_tokens", "completion_tokens", "reasoning_tokens", "cost")

    def state(self) -> dict[str, Any]:
        """The figures of the records merged so far, as the incremental merge keeps them (runner.reporting.merge)."""
        return {**{name: getattr(self, name) for name in self._STATE}, "discarded": dict(self.discarded),
                "verify": self.verify.state(), "capture": self.capture.state()}

    def load_state(self, state: dict[str, Any]) -> None:
        for name in self._STATE:
            setattr(self, name, state[name])
        self.discarded = Counter(state["discarded"])
        self.verify.load_state(state["verify"])
        self.capture.load_state(state.get("capture"))

    def figures(self, *, total: int | None = None, seconds: float | None = None,
                pace: tuple[int, float] | None = None) -> RunFigures:
        """`total`: the samples there are (None: not known); `seconds`: their duration, if any;
        `pace`: (samples ended, seconds) to take the throughput from instead of finished / seconds
        (the run's: only invocations that ran samples, so a resume that found nothing to do in a
        few milliseconds does not make it thousands a minute)."""
        turns = self.assistant_turns
        done, secs = pace if pace is not None else (self.finished, seconds)
        rate = round(60 * done / secs, 2) if secs is not None and secs > 0 and done else None
        return RunFigures(
            samples=SampleCounts(
                total=total, finished=self.finished, completed=self.completed, partial=self.partial,
                failed=sum(self.failed.values()), failed_by_class={c: self.failed.get(c, 0) for c in FAILURE_CLASSES},
                discarded=sum(self.discarded.values()), discarded_by_reason=dict(sorted(self.discarded.items())),
            ),
            tools={name: ToolFigures(c, s, f, round(s / c, 4) if c else None, round(f / c, 4) if c else None)
                   for name, (c, s, f) in sorted(self.tools.items())},
            reasoning=ReasoningFigures(turns, self.turns_with_reasoning, turns - self.turns_with_reasoning,
                                       round(self.turns_with_reasoning / turns, 4) if turns else None),
            api_calls=self.api_calls,
            tokens=TokenFigures(self.prompt_tokens, self.completion_tokens, self.reasoning_tokens,
                                self.prompt_tokens + self.completion_tokens),
            cost=round(self.cost, 6),
            verification=self.verify.figures(self.cost),
            duration_seconds=None if seconds is None else round(seconds, 3),
            throughput_samples_per_minute=rate,  # None: no time at all
            per_worker=dict(sorted(self.per_worker.items())) if self.per_worker else None,
            tasks=self.tasks.figures(self.verify.k),
            token_capture=self.capture.figures(),
        )

    def as_dict(self, *, total: int | None = None, seconds: float | None = None,
                pace: tuple[int, float] | None = None) -> dict[str, Any]:
        """The figures as statistics.json writes them (the viewer and the exporter show this)."""
        return self.figures(total=total, seconds=seconds, pace=pace).to_json()


def render_table(stats: Statistics) -> Any:
    """A rich renderable summarising the run's statistics."""
    from rich.table import Table

    run, s = stats.run, stats.run.samples
    table = Table(title=f"trajforge run '{stats.run_name}'", show_header=True, header_style="bold")
    table.add_column("metric")
    table.add_column("value", justify="right")
    rows = [
        ("samples total", s.total), ("finished", s.finished), ("  completed / partial", f"{s.completed} / {s.partial}"),
        ("failed", s.failed), ("discarded", s.discarded),
    ]
    rows += [(f"  failed: {k}", v) for k, v in s.failed_by_class.items() if v]
    rows += [(f"  discarded: {k}", v) for k, v in s.discarded_by_reason.items() if v]
    cov = "-" if run.reasoning.coverage is None else f"{100 * run.reasoning.coverage:.1f}%"
    rows += [("reasoning coverage", cov), ("api calls", run.api_calls),
             ("tokens (prompt/completion)", f"{run.tokens.prompt} / {run.tokens.completion}"),
             ("cost (finished and discarded samples)", usd(run.cost)),
             ("spent (every model call, failed attempts too)", usd(stats.spend.spent)),
             ("duration (all invocations)", f"{run.duration_seconds or 0:.1f}s"),
             ("throughput", "-" if run.throughput_samples_per_minute is None
              else f"{run.throughput_samples_per_minute:.1f} samples/min")]
    rows += table_rows(run.verification)
    rows += task_rows(run.tasks)
    rows += capture_rows(run.token_capture)
    last = stats.last_invocation
    if stats.invocations > 1:
        ls = last.samples
        rows.append(("this invocation", f"{ls.finished} finished, {ls.failed} failed, "
                                        f"{ls.discarded} discarded in {last.duration_seconds or 0:.1f}s"))
    for name, t in run.tools.items():
        if t.count:
            rows.append((f"tool {name}", f"{t.count} calls, {100 * (t.success_rate or 0):.0f}% ok"))
    for k, v in rows:
        table.add_row(k, str(v))
    return table

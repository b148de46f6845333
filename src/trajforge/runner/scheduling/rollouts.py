"""Several rollouts per prompt: expanding rows into rollout samples, and scheduling them.

With --samples_per_prompt N every row becomes N samples (rollout 0..N-1), each its own sample
identity, toolset draw and sandbox, finished, failed and resumed like any other sample.

With --stop_after_passes K a row's rollouts are started in order and never more than K - passes
at once: a rollout is started only while the row's finished passes plus its rollouts in flight
stay below K, so K passes are never exceeded, and which rollouts run does not depend on timing
(it is always the shortest prefix of the row's rollouts holding K passes, or all of them). Once
K have passed, the row's remaining rollouts are not started: `skipped_solved`. Rows take turns,
so one row waiting for its rollout never holds the others back. A resumed run starts from the
passes already in the batch files.
"""

from __future__ import annotations

import asyncio
import re
from collections import Counter, deque
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field, replace

import orjson

from trajforge.dataset import Sample, rollout_identity, split_rollout
from trajforge.run_layout import RunLayout
from trajforge.runner.state import store
from trajforge.runner.state.checkpoint import Checkpoint
from trajforge.runner.state.keys import key_of, rollout_key
from trajforge.runner.reporting.merge import calls_unknown_tools
from trajforge.runner.scheduling.rows import RunRows
from trajforge.sample.outcome import Outcome
from trajforge.runner.reporting.stats import Totals
from trajforge.verify.result import passed


_MAYBE_PASSED = re.compile(rb'"passed"\s*:\s*true')


def expand(samples: list[Sample], n: int) -> list[Sample]:
    """Every row's N rollouts, row after row; rollout 0 is the row itself."""
    if n == 1:
        return samples
    return [s if k == 0 else replace(s, identity=rollout_identity(s.identity, k), rollout=k)
            for s in samples for k in range(n)]


def passes_on_disk(layout: RunLayout) -> Counter[str]:
    """Passing records per row identity in the batch files (first record of a sample wins)."""
    seen: set[str] = set()

    def firsts() -> Iterator[store.LineRef]:
        for ref in store.scan(layout):
            if ref.identity not in seen:
                seen.add(ref.identity)
                yield ref

    passes: Counter[str] = Counter()
    for ref, line in store.read_at(layout, firsts(), store.LineRef.location):
        if not _MAYBE_PASSED.search(line):  # no pass anywhere in it: skip decoding (inside a JSON
            continue  # string the quotes would be escaped, so only real structure matches)
        try:
            rec = orjson.loads(line)
        except orjson.JSONDecodeError:
            continue
        if counts_as_pass(rec):
            passes[split_rollout(ref.identity)[0]] += 1
    return passes


def prior_passes(rows: RunRows, checkpoint: Checkpoint) -> Callable[[Sample], int]:
    """Passing records of each row before this invocation, as the scheduler takes them: from the
    last merge's figures (per row, by index) and the records finished since (the index entries
    past the ones it took), so a million-record run is not read for them; from every batch file
    (`passes_on_disk`) when the merge's figures are not this dataset's."""
    state, layout = checkpoint.merge, checkpoint.layout
    if state is None or not rows.extends(state.get("dataset")) or state["entries"] > len(checkpoint.done):
        by_row = passes_on_disk(layout)
        return lambda s: by_row.get(split_rollout(s.identity)[0], 0)
    merged = Totals()
    merged.verify.load_state(state["totals"]["verify"])
    since: Counter[int] = Counter()
    done = checkpoint.done
    new = range(state["entries"], len(done))
    where = rows.positions({done.keys[j] for j in new})
    try:
        for j, line in store.read_at(layout, (j for j in new if done.keys[j] in where), done.location):
            if _MAYBE_PASSED.search(line) and counts_as_pass(orjson.loads(line)):
                since[where[done.keys[j]][0]] += 1
    except (OSError, orjson.JSONDecodeError):  # the merge at the end says what is wrong with the file
        by_row = passes_on_disk(layout)
        return lambda s: by_row.get(split_rollout(s.identity)[0], 0)
    return lambda s: merged.verify.row_passes(s.index) + since[s.index]


def counts_as_pass(rec: dict) -> bool:
    """A pass the merge will keep: verified, and not dropped by the corrupt-entry filter."""
    return passed(rec) and not calls_unknown_tools(rec)


@dataclass
class _Row:
    pending: deque[Sample]
    passes: int = 0
    in_flight: int = 0
    queued: bool = False


@dataclass
class RolloutScheduler:
    """Hands samples to the engine's workers (`next`) and learns their outcomes (`done`)."""

    stop_after: int | None
    skipped: int = 0  # rollouts not started because their row had enough passes
    on_skip: Callable[[int], None] | None = None  # told how many were just skipped (progress)
    _plain: Iterator[Sample] | None = None
    _rows: dict[str, _Row] = field(default_factory=dict)
    _ready: deque[_Row] = field(default_factory=deque)
    _in_flight: int = 0
    _changed: asyncio.Event = field(default_factory=asyncio.Event)

    @classmethod
    def build(cls, todo: Iterable[Sample], stop_after: int | None,
              prior_passes: Mapping[str, int] | Callable[[Sample], int] | None = None,
              on_skip: Callable[[int], None] | None = None) -> RolloutScheduler:
        """`prior_passes`: the passes a row had before, by row identity or as a function of its sample."""
        sched = cls(stop_after, on_skip=on_skip)
        if stop_after is None:
            sched._plain = iter(todo)
            return sched
        known = prior_passes if callable(prior_passes) else \
            (lambda s, passes=prior_passes or {}: passes.get(split_rollout(s.identity)[0], 0))
        for s in todo:
            key = split_rollout(s.identity)[0]
            row = sched._rows.get(key)
            if row is None:
                row = sched._rows[key] = _Row(deque(), passes=known(s))
            row.pending.append(s)
        for row in sched._rows.values():
            row.pending = deque(sorted(row.pending, key=lambda s: s.rollout))
            sched._settle(row)
        return sched

    def _settle(self, row: _Row) -> None:
        """Skip a solved row's remaining rollouts, or queue the row when it may start one."""
        assert self.stop_after is not None
        if row.passes >= self.stop_after and row.pending:
            self.skipped += len(row.pending)
            if self.on_skip is not None:
                self.on_skip(len(row.pending))
            row.pending.clear()
        if row.pending and not row.queued and row.passes + row.in_flight < self.stop_after:
            row.queued = True
            self._ready.append(row)

    async def next(self) -> Sample | None:
        """The next sample to start; None when nothing is left to start (or ever will be)."""
        if self._plain is not None:
            return next(self._plain, None)
        while True:
            self._changed.clear()
            if self._ready:
                row = self._ready.popleft()
                row.queued = False
                sample = row.pending.popleft()
                row.in_flight += 1
                self._in_flight += 1
                self._settle(row)  # back in line behind the other rows if it may start another
                return sample
            if self._in_flight == 0:
                return None
            await self._changed.wait()  # an outcome in flight may make a row ready (or end the run)

    def done(self, sample: Sample, outcome: Outcome) -> None:
        if self._plain is not None:
            return
        row = self._rows[split_rollout(sample.identity)[0]]
        row.in_flight -= 1
        self._in_flight -= 1
        if outcome.status == "done" and outcome.record is not None and counts_as_pass(outcome.record):
            row.passes += 1
        self._settle(row)
        self._changed.set()


def skipped_solved(rows: RunRows, totals: Totals, checkpoint: Checkpoint, stop_after: int) -> int:
    """Rollouts of rows with `stop_after` passes that never ran (no record, no outcome in the
    checkpoint): counted from disk over every row, so a resumed run reports the same figure as one
    that ran straight through."""
    outcomes = {key_of(identity) for identity in checkpoint.samples}
    done = checkpoint.done
    skipped = 0
    for i, key in enumerate(rows.keys):
        if totals.verify.row_passes(i) < stop_after:
            continue
        skipped += sum(1 for r in range(rows.k) if (k := rollout_key(key, r)) not in done and k not in outcomes)
    return skipped

"""Outcome listeners: everything that hears of a sample's end while the run goes on.

A run hands each sample's outcome, once, to a list of listeners, in this order: the batch files
(the record is saved: `BatchFiles`), the checkpoint (the outcome and the invocation's progress
are committed: `CheckpointEntries`), the invocation's figures (`InvocationFigures`), the progress
line (`ProgressLine`), then every listener registered in OUTCOME_LISTENERS (a trainer's stream,
a test's collector). A listener sees only outcomes whose record the batch files hold; after an
output error (disk full) none sees anything more (runner.invocation).

What a listener gets is an `Ended`, which only `Ended.of` makes: the outcome with its record and
message already scrubbed of the run's secrets (trajforge.redact), the record's saved line, and
the verdict of the filters that decide whether trajectories.jsonl will hold it (a call to a tool
that was not offered, --keep passed: runner.reporting.merge.left_out), judged once for every listener. So
a new listener cannot leak a key by forgetting to scrub, nor stream a record the merge will drop.
Each registered listener is also given the scrubber (`ListenerContext.scrubber`) for anything
else it writes.

A listener hears the outcomes of the invocation it was made for, once each. A killed invocation's
records that its checkpoint never saved are put back from the batch files at the next start
(runner.state.recovery) without being heard again (its listeners may have heard them already): a
consumer that must miss none after a kill reads them from the run directory.

Adding one is a module with `make(context: ListenerContext) -> OutcomeListener | None` (None: it
has nothing to do in this run) and one line: `OUTCOME_LISTENERS.register(Spec(NAME,
"module:make", help))`.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

import orjson

from trajforge.config import RunConfig
from trajforge.jsonio import dumps
from trajforge.redact import Scrubber
from trajforge.registry import Registry
from trajforge.run_layout import RunLayout
from trajforge.runner.reporting.merge import left_out
from trajforge.sample.outcome import HALLUCINATED, Outcome

if TYPE_CHECKING:
    from trajforge.runner.scheduling.budget import Budget
    from trajforge.runner.state.checkpoint import Checkpoint
    from trajforge.runner.state.checkpoint_file import InvocationEntry
    from trajforge.runner.reporting.progress import Progress
    from trajforge.runner.reporting.stats import Totals
    from trajforge.runner.state.store import BatchStore

log = logging.getLogger("trajforge")


@dataclass(slots=True)
class Ended:
    """A sample's end as every listener sees it (made by `of` only)."""

    outcome: Outcome  # its record and message scrubbed
    line: bytes | None  # a done outcome's record as its batch file holds it: JSON, scrubbed, ending in a newline
    # why trajectories.jsonl will not hold the record (runner.reporting.merge.left_out); None: it will
    dropped: str | None
    location: tuple[int, int] | None = None  # (offset, length) in batch_<outcome.batch_num>.jsonl, once saved

    @classmethod
    def of(cls, o: Outcome, scrubber: Scrubber, *, keep_passed: bool) -> Ended:
        """`o` scrubbed by `scrubber` and judged by the merge's filters."""
        record, line, dropped = o.record, None, None
        if o.status == "done" and record is not None:
            raw = dumps(record) + b"\n"
            line = scrubber.bytes(raw)
            if line is not raw:  # a secret was found: the listeners get the record the line holds
                record = orjson.loads(line)
            dropped = left_out(record, keep_passed)
        message = scrubber.text(o.message) if o.message is not None else None
        return cls(replace(o, record=record, message=message), line, dropped)

    @property
    def kept(self) -> bool:
        """Whether the record goes to trajectories.jsonl (a done sample whose record no filter drops)."""
        return self.line is not None and self.dropped is None


class OutcomeListener(Protocol):
    def on_outcome(self, ended: Ended) -> None:
        """One sample ended. Raising OutputError stops the run as a file it cannot write does."""

    def close(self) -> None:
        """The invocation is over: every outcome was given, the batch files are synced and the
        checkpoint saved. Called even after an output error."""


@dataclass(frozen=True)
class ListenerContext:
    """What a registered listener's `make` is given."""

    config: RunConfig
    run_dir: Path
    scrubber: Scrubber  # for whatever else the listener writes or sends

    @property
    def layout(self) -> RunLayout:
        """The run directory's paths (a listener may read it through runner.reader)."""
        return RunLayout(self.run_dir)


# Listeners beside the run's own, each made for every invocation; tests register theirs the same way.
OUTCOME_LISTENERS: Registry[None] = Registry("outcome listener")


def registered(context: ListenerContext) -> list[OutcomeListener]:
    """A listener of every registered spec that has something to do in this run."""
    made = (spec.load()(context) for spec in OUTCOME_LISTENERS.specs())
    return [listener for listener in made if listener is not None]


# ---- the run's own listeners, made by runner.invocation in this order ----

class BatchFiles:
    """The record goes to its batch file; its place is noted for the listeners after this one."""

    def __init__(self, store: BatchStore) -> None:
        self.store = store

    def on_outcome(self, ended: Ended) -> None:
        if ended.line is not None:
            ended.location = self.store.append(ended.outcome.batch_num, ended.line)

    def close(self) -> None:
        self.store.close()


class CheckpointEntries:
    """The outcome and the invocation's entry (samples it ended, its spend) are committed."""

    def __init__(self, checkpoint: Checkpoint, entry: InvocationEntry, budget: Budget) -> None:
        self.checkpoint, self.entry, self.budget = checkpoint, entry, budget

    def on_outcome(self, ended: Ended) -> None:
        self.entry.ran += 1  # saved with every commit: a killed invocation says what it ended
        self.budget.fill(self.entry)  # saved with the checkpoint: the next --resume's prior spend
        self.checkpoint.record(ended.outcome, ended.location)
        self.checkpoint.save()

    def close(self) -> None:
        """The last save: the entry is final from here on (statistics.json is made from it)."""
        self.budget.fill(self.entry)
        try:
            self.checkpoint.save(force=True)
        finally:
            self.checkpoint.end_invocation()


class InvocationFigures:
    """The last invocation's figures in statistics.json, from its outcomes."""

    def __init__(self, totals: Totals) -> None:
        self.totals = totals

    def on_outcome(self, ended: Ended) -> None:
        o, totals = ended.outcome, self.totals
        if ended.dropped == HALLUCINATED:  # the merge will drop it: discarded, as the table and statistics say
            totals.discarded[HALLUCINATED] += 1
        elif o.status == "done" and o.record is not None:
            totals.add_record(o.record)
        elif o.status == "failed":
            totals.failed[o.reason or "internal"] += 1
            log.warning("[B%d:P%d] failed (%s) after %d attempt(s): %s", o.batch_num, o.index, o.reason,
                        o.attempts, o.message)
        else:
            totals.discarded[o.reason or "unknown"] += 1
            if o.usage:
                totals.add_usage(o.usage, o.api_calls)
        totals.per_worker[o.worker] += 1

    def close(self) -> None:
        pass


class ProgressLine:
    def __init__(self, progress: Progress) -> None:
        self.progress = progress

    def on_outcome(self, ended: Ended) -> None:
        self.progress.update(ended.outcome, dropped=ended.dropped == HALLUCINATED)

    def close(self) -> None:
        pass

"""One invocation of a run once its input is checked and its directory locked: `Invocation`.

`start` plans what is left (runner.scheduling.plan), starts the executor, records the invocation in the
checkpoint and makes the outcome listeners (runner.listeners); the engine (runner.scheduling.engine) then
hands every sample's outcome to `on_outcome`, which scrubs and judges it once (`Ended.of`) and
gives it to each listener in turn; `finish` closes them, merges, writes statistics.json and says
the exit code.

A file of the run that cannot be written (disk full, read-only, I/O error) stops scheduling
(`halt`): outcomes not yet written are dropped (those samples run again on --resume), what is
written is kept, and the run ends with one line naming the file. The order of the end matters:
batch files are closed and synced, the checkpoint is saved, then the merge and statistics are
rebuilt from what is on disk (runner.reporting.report).
"""

from __future__ import annotations

import asyncio
import dataclasses
import sys
import time
from typing import Any

from trajforge.config import RunConfig
from trajforge.errors import FatalModelError, OutputError
from trajforge.redact import REGISTRY, Scrubber
from trajforge.runner.reporting import settings
from trajforge.runner.state import store
from trajforge.runner.scheduling.budget import BUDGET_EXIT_CODE
from trajforge.runner.state.checkpoint import Checkpoint
from trajforge.runner.scheduling.engine import ExecutorFactory, run_engine
from trajforge.runner.eventloop import flush_periodically, install_signals, remove_signals
from trajforge.runner.scheduling.governor import budget_for
from trajforge.runner.listeners import (
    BatchFiles, CheckpointEntries, Ended, InvocationFigures, ListenerContext, OutcomeListener, ProgressLine, registered,
)
from trajforge.runner.reporting.monitor import RunMonitor
from trajforge.runner.scheduling.plan import plan
from trajforge.runner.reporting.progress import Progress
from trajforge.runner.reporting.report import failed_exit_code, finish, print_summary
from trajforge.runner.scheduling.rollouts import RolloutScheduler, prior_passes
from trajforge.runner.scheduling.rows import RunRows
from trajforge.runner.state.rundir import RunDir
from trajforge.runner.reporting.stats import Totals
from trajforge.sample.outcome import Outcome


class Invocation:
    """One invocation: start, an outcome at a time, halt on an output error, finish."""

    def __init__(self, config: RunConfig, sandbox: str, rows: RunRows,
                 prefill: list[dict[str, Any]] | None, rundir: RunDir, make_executor: ExecutorFactory, *,
                 scrubber: Scrubber = REGISTRY, stop: asyncio.Event | None = None) -> None:
        self.config, self.sandbox, self.rows, self.prefill = config, sandbox, rows, prefill
        self.rundir, self.layout, self.make_executor, self.scrubber = rundir, rundir.layout, make_executor, scrubber
        self.keep_passed = config.keep in ("passed", "passed_untampered")
        self.keep_untampered = config.keep in ("untampered", "passed_untampered")
        self.failures: list[OutputError] = []
        # set to schedule no new sample (a signal, an output error, the caller: the rollout service);
        # a caller that passes its own stop owns SIGINT/SIGTERM too (they set that stop)
        self.stop = stop if stop is not None else asyncio.Event()
        self.own_signals = stop is None
        self.listeners: list[OutcomeListener] = []
        self.fatal: FatalModelError | None = None
        self.interrupted = False

    async def run(self) -> int:
        """The whole invocation; its exit code."""
        await self.start()
        tasks = [asyncio.create_task(flush_periodically(self.batch_store, self.checkpoint, self.progress, self.halt,
                                                        before_save=self._note_spend)),
                 asyncio.create_task(self.monitor.run())]
        try:
            if self.todo:
                with self.progress:
                    self.interrupted = await self._work()
        except* FatalModelError as eg:
            self.fatal = eg.exceptions[0]  # type: ignore[assignment]
        finally:
            for task in tasks:
                task.cancel()
            await self._close()
        return self.finish()

    async def start(self) -> None:
        """Plan, start the executor and record this invocation. A refused start (UsageError from
        the executor or a listener) leaves no result behind."""
        config, rows, layout = self.config, self.rows, self.layout
        self.started_wall, self.t0 = time.time(), time.monotonic()
        self.checkpoint = checkpoint = Checkpoint.load(layout, config.run_name or "")
        planned = plan(rows, checkpoint)
        self.todo = todo = planned.todo
        restored = planned.restored
        rows.check_cached(todo, config.skip_invalid)  # the rows to run that this invocation did not validate
        for p in planned.problems:
            say(p)
        if restored.samples:
            spend = f", with ${restored.spent:.4f} of spend" if restored.spent else ""
            say(f"checkpoint.json lacked {restored.samples} finished sample(s) found in the batch files "
                f"(the run ended before it could save them): added back{spend}")
        if planned.recovered:
            say(f"recovered {planned.recovered} sample(s) that checkpoint.json calls finished but whose "
                "record is missing or unreadable in the batch files: they run again")
        if rows.skipped:
            say(f"skipped {len(rows.skipped)} invalid dataset line(s)")

        self.batch_store = store.BatchStore(layout)
        self.totals = Totals()
        self.totals.verify.k = config.samples_per_prompt
        todo.seen = self.totals.verify.task_types  # filled as the samples are handed out
        self.totals.verify.per_row = False
        self.progress = Progress(len(rows), already=len(rows) - len(todo))
        extra = registered(ListenerContext(config, layout.root, self.scrubber))
        self.executor = executor = self.make_executor(config, self.prefill, layout.root)
        if todo:  # before the checkpoint records this invocation: a refused start leaves no results behind
            try:
                for u in await executor.start({s.image for s in todo if s.image} if rows.with_image else set()):
                    say(f"toolset '{u.toolset}' unavailable, not offered: {u.reason}")
            except BaseException:
                await executor.aclose()
                raise
        if nodes := getattr(executor, "sandboxes", None):  # decided on each node: config.json and statistics.json name them
            decided = config.resolved
            self.config = config = config.resolve(dataclasses.replace(decided, backend=", ".join(sorted(nodes))))
            if config.resolved.backend != decided.backend:
                self.sandbox = f"{config.resolved.backend} (chosen on each node)"
        # Said once the executor started: what it refuses (no toolset of the distribution can be
        # offered, a model that cannot load) comes before this line, never after it.
        say(f"run '{config.run_name}': {len(rows)} samples, {len(rows) - len(todo)} already finished, "
            f"{len(todo)} to run, sandbox {self.sandbox} -> {layout.root}")
        masked = config.masked()
        used = settings.shaping(masked)
        earlier = next((i.settings for i in reversed(checkpoint.invocations) if i.settings is not None), None)
        if diff := settings.changes(earlier, used):
            say(f"this invocation runs with other settings than the previous one: {settings.describe(diff)} "
                "(the run's records will mix them; statistics.json lists each change)")
        self.rundir.save_config(masked)  # once the start was not refused, which keeps a resumed run's own
        self.budget = budget = budget_for(config, checkpoint.invocations, len(todo), (restored.spent, restored.samples))
        self.monitor = RunMonitor(getattr(executor, "gate", None), budget)
        self.progress.extra = self.monitor.progress_text
        self.entry = checkpoint.begin_invocation(self.started_wall, model=config.resolved.model, settings=used,
                                                 skipped_invalid=len(rows.skipped))
        if restored.samples:  # the next invocation's prior, like `spent`
            self.entry.recovered_spent, self.entry.recovered_samples = restored.spent, restored.samples
        checkpoint.compact()  # what planning found, and a journal that starts empty
        if self.own_signals:
            install_signals(self.stop, self.batch_store, checkpoint)
        self.listeners = [BatchFiles(self.batch_store), CheckpointEntries(checkpoint, self.entry, budget),
                          InvocationFigures(self.totals), ProgressLine(self.progress), *extra]

    async def _work(self) -> bool:
        """Every sample left, through the engine; True when a stop cut it short."""
        config = self.config
        passes = prior_passes(self.rows, self.checkpoint) if config.stop_after_passes else None
        source = RolloutScheduler.build(self.todo, config.stop_after_passes, passes, on_skip=self.progress.skip)
        return await run_engine(source, self.executor, self.on_outcome, lambda s: config.retry_limit(s.task_type),
                                self.stop, budget=self.budget)

    def on_outcome(self, o: Outcome) -> None:
        """A sample ended: scrubbed and judged once, then given to each listener in order."""
        if self.failures:
            return  # nothing is written after an output error; the sample runs again on --resume
        ended = Ended.of(o, self.scrubber, keep_passed=self.keep_passed, keep_untampered=self.keep_untampered)
        for listener in self.listeners:
            try:
                listener.on_outcome(ended)
            except OutputError as e:
                self.halt(e)
                return

    def halt(self, e: OutputError) -> None:
        """An output file cannot be written: schedule nothing more, write nothing more (the first
        error is the run's one error line)."""
        self.failures.append(e)
        self.stop.set()

    def _note_spend(self) -> None:
        """Calls of samples in flight are paid already: keep them through a kill."""
        if round(self.budget.spent_now, 8) != self.entry.spent:
            self.budget.fill(self.entry)
            self.checkpoint.changed()

    async def _close(self) -> None:
        """Scheduling is over: the executor goes, then every listener is closed in order (the batch
        files synced, the checkpoint's last save), whatever failed before."""
        self.monitor.tick()
        if self.own_signals:
            remove_signals()  # the merge below is safe to interrupt: every file it writes is atomic
        await self.executor.aclose()
        self.entry.interrupted = self.interrupted
        for listener in self.listeners:
            try:
                listener.close()
            except OutputError as e:
                self.halt(e)
        for msg in self.batch_store.repaired:
            say(msg)
        self.seconds = time.monotonic() - self.t0

    def finish(self) -> int:
        """Merge, write statistics.json, print the summary; the exit code. Raises the first
        OutputError instead when one halted the run."""
        checkpoint, config = self.checkpoint, self.config
        if self.failures:
            checkpoint.close()
            raise self.failures[0]  # trajectories.jsonl and statistics.json of the last good end stay as they are
        stats = finish(config, self.rows, checkpoint, self.totals, self.seconds, self.monitor.spend(),
                       self.monitor.concurrency())
        checkpoint.compact()  # the merge's state with the rest: the next start reads a snapshot, no journal
        checkpoint.close()
        self.rows.save_cache(self.layout.rows_cache)  # after the merge: a kill before it only costs a longer start
        print_summary(stats, self.layout)
        if self.fatal is not None:
            print(f"error: {self.fatal}", file=sys.stderr)
            return 1
        if self.interrupted:
            return 130
        if self.budget.reached:
            for line in self.budget.stop_message():
                print(line, file=sys.stderr)
            return BUDGET_EXIT_CODE
        return failed_exit_code(config, stats)


def say(message: str) -> None:
    print(f"trajforge: {message}", file=sys.stderr)


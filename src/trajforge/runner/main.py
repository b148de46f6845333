"""One invocation of a run, start to end: validate, lock, plan, execute, merge, report.

Everything that can be wrong with the input (dataset, prefill file, model key, contradicting
settings: runner.preflight) is checked before the run directory is touched, so bad input never
alters existing output. The order of the end phase matters: batch files are closed and synced,
the checkpoint is saved, then the merge and statistics are rebuilt from what is on disk
(runner.report).

A file of the run that cannot be written (disk full, read-only, I/O error) stops scheduling:
outcomes not yet written are dropped (those samples run again on --resume), what is written is
kept, and the run ends with one line naming the file. stdout/stderr go through
runner.console.SafeStream: scrubbed of the run's secrets, and never fatal when closed. What the
event loop is given besides the work (child watcher, collector settings, SIGINT/SIGTERM,
periodic flush) is runner.eventloop's.
"""

from __future__ import annotations

import asyncio
import logging
import sys
import time
from pathlib import Path
from typing import Any

from trajforge.catalog.executors import EXECUTORS
from trajforge.catalog.sandboxes import AUTO, image_backend
from trajforge.config import RunConfig
from trajforge.dataset import LoadedDataset, Sample
from trajforge.errors import FatalModelError, OutputError, UsageError
from trajforge.jsonio import dumps
from trajforge.redact import REGISTRY, hide_in_proc, run_secrets
from trajforge.runner import recovery, store
from trajforge.runner.budget import BUDGET_EXIT_CODE
from trajforge.runner.checkpoint import Checkpoint
from trajforge.runner.console import safe_std_streams
from trajforge.runner.engine import ExecutorFactory, run_engine
from trajforge.runner.eventloop import (
    flush_periodically, install_signals, remove_signals, tuned_collector, use_pidfd_child_watcher,
)
from trajforge.runner.governor import budget_for, check_prices
from trajforge.runner.merge import calls_unknown_tools
from trajforge.runner.monitor import RunMonitor
from trajforge.sample.outcome import Outcome
from trajforge.runner.preflight import (
    check_container_images, check_executor, check_network, check_task_engine, choose_model, load_input, load_prefill,
    refuse_contradictions,
)
from trajforge.runner.progress import Progress
from trajforge.runner.report import failed_exit_code, finish, print_summary
from trajforge.runner.rollouts import RolloutScheduler, expand, passes_on_disk, prepare_totals
from trajforge.runner.rundir import RunDir
from trajforge.runner.stats import Totals
from trajforge.sample.lower_settings import sandbox_settings
from trajforge.sandbox.sandbox_settings import SandboxSettings
from trajforge.verify.verifier import validate_verification

log = logging.getLogger("trajforge")


def run(config: RunConfig, make_executor: ExecutorFactory) -> int:
    """Run the job `config` describes on the executor `make_executor` builds (the command layer's choice)."""
    secrets = run_secrets(config)
    REGISTRY.add(*secrets)
    hide_in_proc(secrets)
    with safe_std_streams():
        return _run_checked(config, make_executor)


def _run_checked(config: RunConfig, make_executor: ExecutorFactory) -> int:
    logging.basicConfig(level=logging.INFO if config.verbose else logging.WARNING,
                        format="%(asctime)s %(levelname)s %(message)s", stream=sys.stderr)
    if config.verbose:
        print(dumps(config.masked()).decode(), file=sys.stderr)
    assert (config.dataset_file or config.tasks) is not None and config.run_name is not None
    refuse_contradictions(config)
    prefill = load_prefill(config.prefill_messages_file)
    dataset = load_input(config)
    if config.agent != "oracle":
        config = choose_model(config)
        check_prices(config)
    else:  # the oracle calls no model: no endpoint, key or price to check, and its records say "oracle"
        config = config.model_copy(update={"model": "oracle"})
    config, sandbox = check_network(config, sandbox_settings(config))  # the sandbox's settings, built once
    check_executor(config)
    check_container_images(config, dataset)
    check_task_engine(config)
    validate_verification(config, dataset)
    rundir = RunDir(config.output_dir / config.run_name)
    rundir.acquire(resume=config.resume, overwrite=config.overwrite)
    watcher = use_pidfd_child_watcher()
    refused = False
    try:
        leftovers = rundir.remove_leftovers()
        if leftovers:
            print(f"trajforge: removed {leftovers} temporary file(s) left by a killed run", file=sys.stderr)
        for msg in store.repair(rundir.path):
            print(f"trajforge: {msg}", file=sys.stderr)
        with tuned_collector():
            return asyncio.run(_run(config, sandbox, dataset, prefill, rundir, make_executor))
    except UsageError:  # refused at the executor's start (_run): before any result was written
        refused = True
        raise
    finally:
        if watcher:  # in-process callers (tests, notebooks) get the default back for their own loops
            asyncio.set_child_watcher(None)
        rundir.release(discard=refused)


def plan(samples: list[Sample], run_dir: Path, checkpoint: Checkpoint, problems: list[str],
         recovered: list[Sample] | None = None, unsaved: list[store.LineRef] | None = None) -> list[Sample]:
    """The samples still to run: those with no readable record in a batch file and not discarded
    before (failed ones are retried). The checkpoint never vouches for a record: a sample it
    calls done whose record is gone or unreadable runs again, and is added to `recovered`. The
    records of finished samples that it does not call finished (a run that ended before saving
    it) go to `unsaved`.
    bench/resume_plan.py times this on 100,000 finished samples."""
    unreadable: set[str] = set()
    finished: set[str] = set()
    for ref in store.scan(run_dir, problems, unreadable):
        if unsaved is not None and ref.identity not in finished and recovery.unsaved(checkpoint, ref.identity):
            unsaved.append(ref)  # the first record of a sample is the one the merge keeps
        finished.add(ref.identity)
    finished |= checkpoint.discarded()
    todo = [s for s in samples if s.identity not in finished]
    if recovered is not None:
        recovered += [s for s in todo if s.identity in unreadable or checkpoint.status(s.identity) == "done"]
    return todo


async def _run(config: RunConfig, sandbox_settings: SandboxSettings, dataset: LoadedDataset,
               prefill: list[dict[str, Any]] | None, rundir: RunDir, make_executor: ExecutorFactory) -> int:
    run_dir = rundir.path
    started_wall, t0 = time.time(), time.monotonic()
    checkpoint = Checkpoint.load(run_dir / "checkpoint.json", config.run_name or "")
    scan_problems: list[str] = []
    recovered: list[Sample] = []
    unsaved: list[store.LineRef] = []
    samples = expand(dataset.samples, config.samples_per_prompt)  # every rollout of every row
    todo = plan(samples, run_dir, checkpoint, scan_problems, recovered, unsaved)
    for p in scan_problems:
        print(f"trajforge: {p}", file=sys.stderr)
    restored = recovery.restore(checkpoint, unsaved)  # saved with this invocation's entry, before any sample runs
    if restored.samples:
        spend = f", with ${restored.spent:.4f} of spend" if restored.spent else ""
        print(f"trajforge: checkpoint.json lacked {restored.samples} finished sample(s) found in the batch files "
              f"(the run ended before it could save them): added back{spend}", file=sys.stderr)
    if recovered:
        checkpoint.forget([s.identity for s in recovered])
        print(f"trajforge: recovered {len(recovered)} sample(s) that checkpoint.json calls finished but whose "
              "record is missing or unreadable in the batch files: they run again", file=sys.stderr)
    if dataset.skipped:
        print(f"trajforge: skipped {len(dataset.skipped)} invalid dataset line(s)", file=sys.stderr)
    config, sandbox = await _resolve_sandbox(config, sandbox_settings, dataset)
    print(f"trajforge: run '{config.run_name}': {len(samples)} samples, "
          f"{len(samples) - len(todo)} already finished, {len(todo)} to run, sandbox {sandbox} -> {run_dir}",
          file=sys.stderr)

    batch_store = store.BatchStore(run_dir)
    invocation = Totals()
    prepare_totals(invocation, config, samples)
    invocation.verify.per_row = False
    progress = Progress(len(samples), already=len(samples) - len(todo))
    fatal: FatalModelError | None = None
    interrupted = False
    stop = asyncio.Event()
    failures: list[OutputError] = []

    def halt(e: OutputError) -> None:
        """An output file cannot be written: schedule nothing more, write nothing more (the first
        error is the run's one error line)."""
        failures.append(e)
        stop.set()

    def sink(o: Outcome) -> None:
        if failures:
            return  # nothing is written after an output error; the sample runs again on --resume
        try:
            if o.status == "done" and o.record is not None:
                batch_store.append(o.batch_num, dumps(o.record) + b"\n")
            budget.fill(this_invocation)  # saved with the checkpoint: the next --resume's prior spend
            checkpoint.record(o)
            checkpoint.save()
        except OutputError as e:
            halt(e)
            return
        dropped = o.status == "done" and o.record is not None and calls_unknown_tools(o.record)
        if dropped:  # the merge will drop it: discarded, as the end-of-run table and statistics say
            invocation.discarded["hallucinated_tool"] += 1
        elif o.status == "done" and o.record is not None:
            invocation.add_record(o.record)
        elif o.status == "failed":
            invocation.failed[o.reason or "internal"] += 1
            log.warning("[B%d:P%d] failed (%s) after %d attempt(s): %s", o.batch_num, o.index, o.reason,
                        o.attempts, o.message)
        else:
            invocation.discarded[o.reason or "unknown"] += 1
            if o.usage:
                invocation.add_usage(o.usage, o.api_calls)
        invocation.per_worker[o.worker] += 1
        progress.update(o, dropped=dropped)

    executor = make_executor(config, prefill, run_dir)
    if todo:  # before the checkpoint records this invocation: a refused start leaves no results behind
        try:
            for u in await executor.start({s.image for s in todo if s.image}):
                print(f"trajforge: toolset '{u.toolset}' unavailable, not offered: {u.reason}", file=sys.stderr)
        except BaseException:
            await executor.aclose()
            raise
    rundir.save_config(config.masked())  # once the start was not refused, which keeps a resumed run's own
    budget = budget_for(config, checkpoint.invocations, len(todo), (restored.spent, restored.samples))
    monitor = RunMonitor(getattr(executor, "gate", None), budget)
    progress.extra = monitor.progress_text
    this_invocation = checkpoint.begin_invocation(started_wall)
    if restored.samples:  # the next invocation's prior, like `spent`
        this_invocation.recovered_spent, this_invocation.recovered_samples = restored.spent, restored.samples
    checkpoint.save(force=True)
    install_signals(stop, batch_store, checkpoint)

    def note_spend() -> None:  # calls of samples in flight are paid already: keep them through a kill
        if round(budget.spent_now, 8) != this_invocation.spent:
            budget.fill(this_invocation)
            checkpoint.changed()

    flusher = asyncio.create_task(flush_periodically(batch_store, checkpoint, progress, halt,
                                                     before_save=note_spend))
    sampler = asyncio.create_task(monitor.run())
    try:
        if todo:
            with progress:
                source = RolloutScheduler.build(todo, config.stop_after_passes,
                                                passes_on_disk(run_dir) if config.stop_after_passes else None,
                                                on_skip=progress.skip)
                interrupted = await run_engine(source, executor, sink, lambda s: config.retry_limit(s.task_type), stop,
                                               budget=budget)
    except* FatalModelError as eg:
        fatal = eg.exceptions[0]  # type: ignore[assignment]
    finally:
        flusher.cancel()
        sampler.cancel()
        monitor.tick()
        remove_signals()  # the merge below is safe to interrupt: every file it writes is atomic
        await executor.aclose()
        try:
            batch_store.close()
        except OutputError as e:
            halt(e)
        for msg in batch_store.repaired:
            print(f"trajforge: {msg}", file=sys.stderr)
        seconds = time.monotonic() - t0
        this_invocation.ran, this_invocation.interrupted = sum(invocation.per_worker.values()), interrupted
        budget.fill(this_invocation)
        try:
            checkpoint.save(force=True)
        except OutputError as e:
            halt(e)
    if failures:
        raise failures[0]  # trajectories.jsonl and statistics.json of the last good end stay as they are
    stats = finish(config, samples, run_dir, checkpoint, invocation, seconds, monitor.spend(), monitor.concurrency())
    print_summary(stats, run_dir)
    if fatal is not None:
        print(f"error: {fatal}", file=sys.stderr)
        return 1
    if interrupted:
        return 130
    if budget.reached:
        for line in budget.stop_message():
            print(line, file=sys.stderr)
        return BUDGET_EXIT_CODE
    return failed_exit_code(config, stats)


async def _resolve_sandbox(config: RunConfig, settings: SandboxSettings,
                           dataset: LoadedDataset) -> tuple[RunConfig, str]:
    """Decide `--sandbox auto` once, here, so the start line, config.json and statistics.json name
    the backend the samples really use; a fallback to one that isolates less says why and how to
    get isolation."""
    if config.tasks is not None:
        return config, f"{image_backend().name} (tasks)"
    if not EXECUTORS[config.executor].capabilities.in_process:
        return config, f"{config.sandbox} (chosen on each node)" if config.sandbox == AUTO else config.sandbox
    from trajforge.sandbox.factory import resolve_backend

    kind, passed = await resolve_backend(settings)
    config = config.model_copy(update={"sandbox": kind})
    for name, reason in passed:
        print(f"trajforge: --sandbox auto: {name} is not usable here ({reason}), so commands run in the "
              f"`{kind}` sandbox WITHOUT isolation from this host; run `trajforge doctor` to see how to get "
              f"isolation, or pass --sandbox {kind} to accept it", file=sys.stderr)
    images = sum(s.image is not None for s in dataset.samples)
    runs_images = image_backend().name
    return config, f"{kind} (rows with an image: {runs_images})" if images and kind != runs_images else kind

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
from typing import Any

from trajforge.catalog.executors import EXECUTORS
from trajforge.catalog.sandboxes import AUTO, image_backend
from trajforge.config import RunConfig
from trajforge.errors import FatalModelError, OutputError, UsageError
from trajforge.jsonio import dumps
from trajforge.redact import REGISTRY, hide_in_proc, run_secrets
from trajforge.runner import rowcache, settings, store
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
    check_container_images, check_endpoint, check_executor, check_network, check_sandbox, check_task_engine,
    choose_model, load_input, load_prefill, refuse_contradictions,
)
from trajforge.runner.progress import Progress
from trajforge.runner.report import failed_exit_code, finish, print_summary
from trajforge.runner.plan import plan
from trajforge.runner.rollouts import RolloutScheduler, prior_passes
from trajforge.runner.rows import RunRows
from trajforge.runner.rundir import RunDir
from trajforge.runner.stats import Totals
from trajforge.sample.lower_settings import sandbox_settings
from trajforge.sandbox.sandbox_settings import SandboxSettings
from trajforge.verify.verifier import check_verification_settings

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
    run_path = config.output_dir / config.run_name
    # one pass: every row validated, a few bytes of each kept; a resume reads only what the last
    # invocation did not (rows.idx)
    rows = load_input(config, run_path / rowcache.FILE if config.resume else None)
    if config.agent != "oracle":
        config = choose_model(config)
        check_prices(config)
    else:  # the oracle calls no model: no endpoint, key or price to check, and its records say "oracle"
        config = config.model_copy(update={"model": "oracle"})
    config, sandbox = check_network(config, sandbox_settings(config))  # the sandbox's settings, built once
    check_sandbox(config, sandbox)
    check_executor(config)
    check_container_images(config, rows)
    check_task_engine(config)
    check_verification_settings(config, rows.path, rows.rubric, rows.verified)
    check_endpoint(config)  # last: the one check that waits on the network
    rundir = RunDir(run_path)
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
            return asyncio.run(_run(config, sandbox, rows, prefill, rundir, make_executor))
    except UsageError:  # refused at the executor's start (_run): before any result was written
        refused = True
        raise
    finally:
        if watcher:  # in-process callers (tests, notebooks) get the default back for their own loops
            asyncio.set_child_watcher(None)
        rundir.release(discard=refused)


async def _run(config: RunConfig, sandbox_settings: SandboxSettings, rows: RunRows,
               prefill: list[dict[str, Any]] | None, rundir: RunDir, make_executor: ExecutorFactory) -> int:
    run_dir = rundir.path
    started_wall, t0 = time.time(), time.monotonic()
    checkpoint = Checkpoint.load(run_dir / "checkpoint.json", config.run_name or "")
    planned = plan(rows, run_dir, checkpoint)
    todo, restored = planned.todo, planned.restored
    rows.check_cached(todo, config.skip_invalid)  # the rows to run that this invocation did not validate
    for p in planned.problems:
        print(f"trajforge: {p}", file=sys.stderr)
    if restored.samples:
        spend = f", with ${restored.spent:.4f} of spend" if restored.spent else ""
        print(f"trajforge: checkpoint.json lacked {restored.samples} finished sample(s) found in the batch files "
              f"(the run ended before it could save them): added back{spend}", file=sys.stderr)
    if planned.recovered:
        print(f"trajforge: recovered {planned.recovered} sample(s) that checkpoint.json calls finished but whose "
              "record is missing or unreadable in the batch files: they run again", file=sys.stderr)
    if rows.skipped:
        print(f"trajforge: skipped {len(rows.skipped)} invalid dataset line(s)", file=sys.stderr)
    config, sandbox = await _resolve_sandbox(config, sandbox_settings, rows)
    masked = config.masked()
    used = settings.shaping(masked)
    earlier = next((i.settings for i in reversed(checkpoint.invocations) if i.settings is not None), None)

    batch_store = store.BatchStore(run_dir)
    invocation = Totals()
    invocation.verify.k = config.samples_per_prompt
    todo.seen = invocation.verify.task_types  # filled as the samples are handed out
    invocation.verify.per_row = False
    progress = Progress(len(rows), already=len(rows) - len(todo))
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
            where = None
            if o.status == "done" and o.record is not None:
                where = batch_store.append(o.batch_num, dumps(o.record) + b"\n")
            this_invocation.ran += 1  # saved with every commit: a killed invocation says what it ended
            budget.fill(this_invocation)  # saved with the checkpoint: the next --resume's prior spend
            checkpoint.record(o, where)
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
            for u in await executor.start({s.image for s in todo if s.image} if rows.with_image else set()):
                print(f"trajforge: toolset '{u.toolset}' unavailable, not offered: {u.reason}", file=sys.stderr)
        except BaseException:
            await executor.aclose()
            raise
    if nodes := getattr(executor, "sandboxes", None):  # decided on each node: config.json and statistics.json name them
        config = config.model_copy(update={"sandbox": ", ".join(sorted(nodes))})
        sandbox = f"{config.sandbox} (chosen on each node)" if config.sandbox != sandbox else sandbox
    # Said once the executor started: what it refuses (no toolset of the distribution can be
    # offered, a model that cannot load) comes before this line, never after it.
    print(f"trajforge: run '{config.run_name}': {len(rows)} samples, "
          f"{len(rows) - len(todo)} already finished, {len(todo)} to run, sandbox {sandbox} -> {run_dir}",
          file=sys.stderr)
    if diff := settings.changes(earlier, used):
        print(f"trajforge: this invocation runs with other settings than the previous one: {settings.describe(diff)} "
              "(the run's records will mix them; statistics.json lists each change)", file=sys.stderr)
    rundir.save_config(config.masked())  # once the start was not refused, which keeps a resumed run's own
    budget = budget_for(config, checkpoint.invocations, len(todo), (restored.spent, restored.samples))
    monitor = RunMonitor(getattr(executor, "gate", None), budget)
    progress.extra = monitor.progress_text
    this_invocation = checkpoint.begin_invocation(started_wall, model=config.model, settings=used,
                                                  skipped_invalid=len(rows.skipped))
    if restored.samples:  # the next invocation's prior, like `spent`
        this_invocation.recovered_spent, this_invocation.recovered_samples = restored.spent, restored.samples
    checkpoint.compact()  # what planning found, and a journal that starts empty
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
                                                prior_passes(run_dir, rows, checkpoint) if config.stop_after_passes
                                                else None, on_skip=progress.skip)
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
        this_invocation.interrupted = interrupted
        budget.fill(this_invocation)
        try:
            checkpoint.save(force=True)
        except OutputError as e:
            halt(e)
        checkpoint.end_invocation()
    if failures:
        checkpoint.close()
        raise failures[0]  # trajectories.jsonl and statistics.json of the last good end stay as they are
    stats = finish(config, rows, run_dir, checkpoint, invocation, seconds, monitor.spend(), monitor.concurrency())
    checkpoint.compact()  # the merge's state with the rest: the next start reads a snapshot, no journal
    checkpoint.close()
    rows.save_cache(run_dir / rowcache.FILE)  # after the merge: a kill before it only costs a longer start
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


async def _resolve_sandbox(config: RunConfig, settings: SandboxSettings, rows: RunRows) -> tuple[RunConfig, str]:
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
    runs_images = image_backend().name
    return config, f"{kind} (rows with an image: {runs_images})" if rows.with_image and kind != runs_images else kind

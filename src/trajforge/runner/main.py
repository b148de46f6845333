"""One invocation of a run, start to end: validate, lock, plan, execute, merge, report.

Everything that can be wrong with the input (dataset, prefill file, model key) is checked before
the run directory is touched, so bad input never alters existing output. The order of the end
phase matters: batch files are closed and synced, the checkpoint is saved, then the merge and
statistics are rebuilt from what is on disk.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

from trajforge.config import RunConfig
from trajforge.dataset import LoadedDataset, Sample, load_dataset
from trajforge.errors import FatalModelError, UsageError
from trajforge.jsonio import atomic_write_json, dumps, loads
from trajforge.runner import store
from trajforge.runner.checkpoint import Checkpoint
from trajforge.runner.engine import Executor, run_engine
from trajforge.runner.merge import merge
from trajforge.runner.outcome import Outcome
from trajforge.runner.progress import Progress
from trajforge.runner.rundir import RunDir
from trajforge.runner.stats import EXIT_SAMPLES_FAILED, Totals, render_table, too_many_failed

log = logging.getLogger("trajforge")


def load_prefill(path: Path | None) -> list[dict[str, Any]] | None:
    if path is None:
        return None
    try:
        data = loads(path.read_bytes())
    except OSError as e:
        raise UsageError(f"--prefill_messages_file: cannot read {path}: {e.strerror or e}") from None
    except ValueError as e:
        raise UsageError(f"--prefill_messages_file: {path} is not valid JSON: {e}") from None
    if not isinstance(data, list):
        raise UsageError(f"--prefill_messages_file: {path} must hold a JSON list of messages")
    for i, m in enumerate(data):
        if not (isinstance(m, dict) and m.get("role") in ("system", "user", "assistant")
                and isinstance(m.get("content"), str)):
            raise UsageError(f"--prefill_messages_file: {path}: message {i} must be an object with role "
                             "system/user/assistant and a string content")
    return data


def _choose_model(config: RunConfig) -> None:
    from trajforge.model.client import DEFAULT_BASE_URL
    from trajforge.model.factory import is_local_model, is_loopback, resolve_api_key, should_use_local

    settings = config.model_settings()
    if should_use_local(settings) and not is_local_model(config.model):
        print("trajforge: no API key and no --base_url: using the bundled local model (--model local); "
              "set OPENROUTER_API_KEY or pass --base_url/--api_key to use an API", file=sys.stderr)
        config.model = "local"
        return
    url = settings.base_url or DEFAULT_BASE_URL
    if not is_local_model(config.model) and not is_loopback(url) and resolve_api_key(settings.api_key, os.environ) is None:
        raise UsageError(f"no API key for {url}: pass --api_key or set OPENROUTER_API_KEY / OPENAI_API_KEY")


def _check_container_images(config: RunConfig, dataset: LoadedDataset) -> None:
    """`--sandbox container` with rows that name no image and no `container_image`: every such
    sample could only fail, so refuse before any work."""
    if config.sandbox != "container" or config.container_image:
        return
    bare = [s for s in dataset.samples if s.image is None]
    if bare:
        raise UsageError(f"--sandbox container: {len(bare)} row(s) have no `image` (first: {dataset.path}:"
                         f"{bare[0].line}) and the config sets no `container_image`; give each row an image "
                         "or set `container_image: IMAGE` in the --config file")


def run(config: RunConfig) -> int:
    logging.basicConfig(level=logging.INFO if config.verbose else logging.WARNING,
                        format="%(asctime)s %(levelname)s %(message)s", stream=sys.stderr)
    if config.verbose:
        print(dumps(config.masked()).decode(), file=sys.stderr)
    assert config.dataset_file is not None and config.run_name is not None
    prefill = load_prefill(config.prefill_messages_file)
    dataset = load_dataset(config.dataset_file, skip_invalid=config.skip_invalid, max_samples=config.max_samples)
    _choose_model(config)
    _check_container_images(config, dataset)
    if config.executor == "ray":
        import importlib.util

        if importlib.util.find_spec("ray") is None:
            raise UsageError("--executor ray: Ray is not installed; install it with: pip install 'trajforge[ray]'")
    rundir = RunDir(config.output_dir / config.run_name)
    rundir.acquire(resume=config.resume, overwrite=config.overwrite)
    _use_pidfd_child_watcher()
    try:
        return asyncio.run(_run(config, dataset, prefill, rundir))
    finally:
        rundir.release()


def _use_pidfd_child_watcher() -> None:
    """Wait for subprocesses through a pidfd in the event loop instead of a thread per process.

    Python 3.11's default (ThreadedChildWatcher) starts a thread for every `terminal` command and
    blocks the loop until it runs: ~5% of the loop's time in bench/throughput.py. 3.12+ already
    uses pidfds when the kernel has them (Linux 5.3+), so this only changes 3.11."""
    if sys.version_info >= (3, 12) or not hasattr(os, "pidfd_open"):
        return
    if type(asyncio.get_event_loop_policy()) is not asyncio.DefaultEventLoopPolicy:
        return  # e.g. uvloop's, which waits for children its own way
    try:
        os.close(os.pidfd_open(os.getpid()))
    except OSError:  # an older kernel, or a seccomp filter that forbids it
        return
    asyncio.set_child_watcher(asyncio.PidfdChildWatcher())


def make_executor(config: RunConfig, prefill: list[dict[str, Any]] | None, run_dir: Path) -> Executor:
    ws = run_dir / "workspaces" if config.keep_workspaces else None
    if config.executor == "ray":
        from trajforge.executors.ray import RayExecutor

        return RayExecutor(config, prefill=prefill)
    from trajforge.executors.local import LocalExecutor

    return LocalExecutor(config, prefill=prefill, workspace_root=ws)


def plan(samples: list[Sample], run_dir: Path, checkpoint: Checkpoint, problems: list[str]) -> list[Sample]:
    """The samples still to run: those with no record in a batch file and not discarded before
    (failed ones are retried). bench/resume_plan.py times this on 100,000 finished samples."""
    finished = {ref.identity for ref in store.scan(run_dir, problems)} | checkpoint.discarded()
    return [s for s in samples if s.identity not in finished]


async def _run(config: RunConfig, dataset: LoadedDataset, prefill: list[dict[str, Any]] | None,
               rundir: RunDir) -> int:
    run_dir = rundir.path
    started_wall, t0 = time.time(), time.monotonic()
    checkpoint = Checkpoint.load(run_dir / "checkpoint.json", config.run_name or "")
    scan_problems: list[str] = []
    todo = plan(dataset.samples, run_dir, checkpoint, scan_problems)
    for p in scan_problems:
        print(f"trajforge: {p}", file=sys.stderr)
    if dataset.skipped:
        print(f"trajforge: skipped {len(dataset.skipped)} invalid dataset line(s)", file=sys.stderr)
    sandbox = await _resolve_sandbox(config, dataset)
    print(f"trajforge: run '{config.run_name}': {len(dataset.samples)} samples, "
          f"{len(dataset.samples) - len(todo)} already finished, {len(todo)} to run, sandbox {sandbox} -> {run_dir}",
          file=sys.stderr)
    rundir.save_config(config.masked())

    batch_store = store.BatchStore(run_dir)
    invocation = Totals()
    progress = Progress(len(dataset.samples), already=len(dataset.samples) - len(todo))
    fatal: FatalModelError | None = None
    interrupted = False

    def sink(o: Outcome) -> None:
        if o.status == "done" and o.record is not None:
            batch_store.append(o.batch_num, dumps(o.record) + b"\n")
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
        checkpoint.record(o)
        checkpoint.save()
        progress.update(o)

    executor = make_executor(config, prefill, run_dir)
    if todo:  # before the checkpoint records this invocation: a refused start leaves no results behind
        try:
            for u in await executor.start():
                print(f"trajforge: toolset '{u.toolset}' unavailable, not offered: {u.reason}", file=sys.stderr)
        except BaseException:
            await executor.aclose()
            raise
    stop = asyncio.Event()
    this_invocation = checkpoint.begin_invocation(started_wall)
    checkpoint.save(force=True)
    _install_signals(stop, batch_store, checkpoint)
    flusher = asyncio.create_task(_flush_periodically(batch_store, checkpoint, progress))
    try:
        if todo:
            if config.executor == "local":
                from trajforge.sandbox.factory import prefetch_images

                await prefetch_images(config, {s.image for s in todo if s.image})
            with progress:
                interrupted = await run_engine(todo, executor, sink, lambda s: config.retry_limit(s.task_type), stop)
    except* FatalModelError as eg:
        fatal = eg.exceptions[0]  # type: ignore[assignment]
    finally:
        flusher.cancel()
        _remove_signals()  # the merge below is safe to interrupt: every file it writes is atomic
        await executor.aclose()
        batch_store.close()
        for msg in batch_store.repaired:
            print(f"trajforge: {msg}", file=sys.stderr)
        seconds = time.monotonic() - t0
        this_invocation.update(ran=sum(invocation.per_worker.values()), interrupted=interrupted)
        checkpoint.save(force=True)
    stats = _finish(config, dataset.samples, run_dir, checkpoint, invocation, seconds)
    _print_summary(stats, run_dir)
    if fatal is not None:
        print(f"error: {fatal}", file=sys.stderr)
        return 1
    return 130 if interrupted else _failed_exit_code(config, stats)


def _failed_exit_code(config: RunConfig, stats: dict[str, Any]) -> int:
    """0, or EXIT_SAMPLES_FAILED when the run's failed samples reach --fail_on_error."""
    samples = stats["run"]["samples"]
    failed, total = samples["failed"], samples["total"] or 0
    if not too_many_failed(failed, total, config.fail_on_error):
        return 0
    classes = ", ".join(f"{k} {v}" for k, v in samples["failed_by_class"].items() if v)
    print(f"trajforge: {failed} of {total} sample(s) failed ({classes}); each one's reason is in "
          f"checkpoint.json; `--resume` retries them; exit code {EXIT_SAMPLES_FAILED} "
          f"(--fail_on_error {config.fail_on_error:g})", file=sys.stderr)
    return EXIT_SAMPLES_FAILED


async def _resolve_sandbox(config: RunConfig, dataset: LoadedDataset) -> str:
    """Decide `--sandbox auto` once, here, so the start line, config.json and statistics.json name
    the backend the samples really use; a fallback to `local` says why and how to get isolation."""
    if config.executor != "local":
        return f"{config.sandbox} (chosen on each Ray node)" if config.sandbox == "auto" else config.sandbox
    from trajforge.sandbox.factory import resolve_backend

    kind, fallback_reason = await resolve_backend(config)
    config.sandbox = kind  # type: ignore[assignment]
    if fallback_reason is not None:
        print(f"trajforge: --sandbox auto: bwrap is not usable here ({fallback_reason}), so commands run in the "
              "`local` sandbox WITHOUT isolation from this host; run `trajforge doctor` to see how to get "
              "isolation, or pass --sandbox local to accept it", file=sys.stderr)
    images = sum(s.image is not None for s in dataset.samples)
    return f"{kind} (rows with an image: container)" if images and kind != "container" else kind


def _finish(config: RunConfig, samples: list[Sample], run_dir: Path, checkpoint: Checkpoint,
            invocation: Totals, seconds: float) -> dict[str, Any]:
    totals = Totals()
    current = {s.identity: s.index for s in samples}
    result = merge(run_dir, current, totals, {s.identity: (s.line, s.extra) for s in samples})
    for identity, entry in checkpoint.samples.items():
        if identity not in current or identity in result.finished:
            continue  # a sample no longer in the dataset, or one that a later attempt finished
        if entry["status"] == "failed":
            totals.failed[entry.get("reason", "internal")] += 1
        elif entry["status"] == "discarded":
            totals.discarded[entry.get("reason", "unknown")] += 1
            totals.add_usage(entry.get("usage") or {}, int(entry.get("api_calls", 0)))
    total_seconds = sum(i.get("seconds", 0.0) for i in checkpoint.invocations)
    stats = {
        "run_name": config.run_name,
        "model": config.model,
        "distribution": config.distribution,
        "sandbox": config.sandbox,
        "dataset_file": str(config.dataset_file),
        "invocations": len(checkpoint.invocations),
        "run": totals.as_dict(total=len(samples), seconds=total_seconds),
        "last_invocation": invocation.as_dict(total=None, seconds=seconds),
        "merge": {"written": result.written, "hallucinated_filtered": result.hallucinated,
                  "duplicates_ignored": result.duplicates, "not_in_dataset": result.stale,
                  "problems": result.problems},
    }
    for p in result.problems:
        print(f"trajforge: {p}", file=sys.stderr)
    if result.stale:
        print(f"trajforge: {result.stale} finished sample(s) are no longer in the dataset; they stay in their "
              "batch files but not in trajectories.jsonl", file=sys.stderr)
    atomic_write_json(run_dir / "statistics.json", stats)
    return stats


def _print_summary(stats: dict[str, Any], run_dir: Path) -> None:
    from rich.console import Console

    console = Console(file=sys.stdout, width=100)
    console.print(render_table(stats))
    console.print(f"trajectories: {run_dir / 'trajectories.jsonl'}  statistics: {run_dir / 'statistics.json'}")


async def _flush_periodically(batch_store: store.BatchStore, checkpoint: Checkpoint, progress: Progress,
                              every: float = 2.0) -> None:
    """Keep the durability promises while no sample finishes: fsync, checkpoint, status line."""
    while True:
        await asyncio.sleep(every)
        batch_store.sync()
        checkpoint.save()
        progress.tick()


def _remove_signals() -> None:
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.remove_signal_handler(sig)


def _install_signals(stop: asyncio.Event, batch_store: store.BatchStore, checkpoint: Checkpoint) -> None:
    loop = asyncio.get_running_loop()

    def on_signal(signum: int) -> None:
        if not stop.is_set():
            print("\ntrajforge: stopping: no new samples, in-flight ones get a few seconds "
                  "(press Ctrl-C again to exit now)", file=sys.stderr)
            stop.set()
            return
        batch_store.sync()
        checkpoint.save(force=True)
        os._exit(130)

    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, on_signal, sig)

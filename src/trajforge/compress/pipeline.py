"""One compression run: input -> sample -> compress in parallel -> ordered, durable, resumable output.

Trajectories are processed concurrently but written in input order through a bounded window: the
reader starts a task per line and queues it; the writer awaits the queue head, so at most
`window` trajectories are in memory whatever the input size. CPU work (parsing, token counting)
runs in worker threads (tiktoken releases the GIL); model calls are bounded by
`processing.max_concurrent_requests`. Every input line is checked before anything is written or
any summary paid for (subset.checked_count): a bad one stops the command with nothing created. A
rejected API key, Ctrl-C or SIGTERM stops it after everything done is written and checkpointed,
and the next run with the same flags resumes.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, TextIO

from trajforge.compress import subset
from trajforge.compress.compressor import Outcome, TrajectoryCompressor, encode_entry
from trajforge.compress.config import CompressionConfig
from trajforge.compress.metrics import detail_line, flagged_lines, report, write_report
from trajforge.compress.progress import Progress
from trajforge.compress.records import Position, RawLine, check_paths, default_output, iter_lines, resolve_input
from trajforge.compress.resume import DurableWriter, Paths, fingerprint
from trajforge.compress.summarize import Summariser, falls_back_to_local
from trajforge.compress.tokenize import load_counter
from trajforge.errors import InputError, TrajforgeError


@dataclass(frozen=True, slots=True)
class Options:
    input: Path
    output: Path | None = None
    sample_percent: float | None = None
    sample_by: str = "random"  # random | quality
    seed: int = 42
    dry_run: bool = False
    fresh: bool = False
    api_key: str | None = None
    overwrite: bool = False  # replace an existing output and metrics file


def metrics_path(output: Path) -> Path:
    return output.with_name(f"{output.stem}_metrics.json")


def run(options: Options, config: CompressionConfig, *, environ: Mapping[str, str] = os.environ,
        out: TextIO | None = None) -> int:
    out = out or sys.stdout
    input_file = resolve_input(options.input)
    output = options.output or default_output(options.input, input_file, config.output.output_suffix)
    paths = Paths.for_output(output)
    check_paths(input_file, output, (metrics_path(output), paths.partial, paths.details, paths.state),
                replaced=(metrics_path(output),), overwrite=options.overwrite)
    counter = load_counter(config.tokenizer.name)
    selection = subset.select(input_file, options.sample_percent, options.sample_by, options.seed)
    if options.sample_percent is not None:
        print(f"sampling {selection.size} of {selection.total} trajectories ({options.sample_by}, "
              f"{options.sample_percent:g}%, seed {options.seed})", file=out)
    if options.dry_run:
        from trajforge.compress.dryrun import dry_run

        return dry_run(input_file, output, selection, TrajectoryCompressor(config, counter, None), out)
    if falls_back_to_local(config.summarization, options.api_key, environ):
        print("trajforge compress: no API key and no --base_url: summaries come from the bundled local model "
              "(--model local); set OPENROUTER_API_KEY or pass --model/--base_url/--api_key to use an API",
              file=sys.stderr)
        config.summarization.model = "local"
    summariser = Summariser(config.summarization, target_tokens=config.compression.summary_target_tokens,
                            api_key=options.api_key, environ=environ)
    summariser.check()  # a usage error now, before any file is created
    compressor = TrajectoryCompressor(config, counter, summariser)
    info = _info(options, config, counter.name, input_file, output, selection)
    settings = {**config.fingerprint(), "sample_percent": options.sample_percent,
                "sample_by": options.sample_by, "seed": options.seed, "tokenizer_id": counter.name}
    writer = DurableWriter(paths)
    resumed = writer.open(fingerprint(input_file, settings), options.fresh)
    if resumed is not None:
        print(f"resuming {paths.partial}: {resumed.totals.trajectories} trajectories done, "
              f"continuing after input line {resumed.position.line_no}", file=out)
    try:
        _run_interruptible(_stream(input_file, selection, compressor, writer, config.processing.save_over_limit))
        report_path = metrics_path(output)
        info["finished_at"] = datetime.now(timezone.utc).isoformat(timespec="seconds")
        writer.finish(lambda details: write_report(
            report_path, report(writer.totals, info, flagged_lines(details)), details))
    except (TrajforgeError, KeyboardInterrupt) as e:
        if not isinstance(e, InputError):  # every line was checked at the start: this one changed since
            print(f"progress ({writer.totals.trajectories} trajectories done) is kept in {writer.paths.partial}; "
                  "re-run the same command to continue (add --fresh if the input changed)", file=sys.stderr)
        raise
    finally:
        writer.close()
    t = writer.totals
    ratio = f"{t.tokens_after / t.tokens_before:.3f}" if t.tokens_before else "1"
    print(f"compressed {t.compressed} of {t.trajectories} trajectories ({t.skipped_under_target} under budget, "
          f"{t.over_limit} over limit, {t.failed} failed, {t.dropped_over_limit} dropped); "
          f"tokens {t.tokens_before:,} -> {t.tokens_after:,} (ratio {ratio})", file=out)
    print(f"output: {output}\nmetrics: {metrics_path(output)}", file=out)
    return 0


def _info(options: Options, config: CompressionConfig, tokenizer: str, input_file: Path, output: Path,
          selection: subset.Selection) -> dict[str, Any]:
    samp: dict[str, Any] = {"mode": selection.mode, "percent": options.sample_percent, "seed": options.seed,
                            "input_trajectories": selection.total, "kept": selection.size}
    if selection.mode == "quality":
        scores = list(selection.scores.values())
        samp["score_formula"] = subset.SCORE_FORMULA
        samp["kept_scores"] = {"min": min(scores, default=0), "max": max(scores, default=0),
                               "mean": round(sum(scores) / len(scores), 4) if scores else 0}
    return {"input": str(input_file), "output": str(output), "tokenizer": tokenizer,
            "target_max_tokens": config.compression.target_max_tokens,
            "summary_target_tokens": config.compression.summary_target_tokens,
            "summariser_model": config.summarization.model, "sampling": samp}


Result = tuple[bytes | None, Outcome] | InputError


def _run_interruptible(coro: Any) -> None:
    """asyncio.run(coro), SIGTERM cancelling it as asyncio.run's own Ctrl-C handler does (the work
    winds down and saves its progress, then KeyboardInterrupt), whatever SIGINT's disposition: in
    a process started in the background with SIGINT ignored, asyncio.run installs no handler, and a
    KeyboardInterrupt raised inside a task left a traceback ("Task exception was never retrieved")."""
    terminated = False

    async def main() -> None:
        loop, task = asyncio.get_running_loop(), asyncio.current_task()
        assert task is not None

        def on_term() -> None:
            nonlocal terminated
            terminated = True
            task.cancel()

        previous = signal.getsignal(signal.SIGTERM)
        loop.add_signal_handler(signal.SIGTERM, on_term)
        try:
            await coro
        finally:
            loop.remove_signal_handler(signal.SIGTERM)
            signal.signal(signal.SIGTERM, previous)  # the command's own, for what follows

    try:
        asyncio.run(main())
    except asyncio.CancelledError:
        if terminated:
            raise KeyboardInterrupt from None
        raise


async def _stream(input_file: Path, selection: subset.Selection, comp: TrajectoryCompressor,
                  writer: DurableWriter, save_over_limit: bool) -> None:
    window = max(8, 2 * comp.cfg.processing.max_concurrent_requests)
    queue: asyncio.Queue[tuple[RawLine, asyncio.Task[Result] | None] | None] = asyncio.Queue(window)
    progress = Progress(selection.size, writer.totals.trajectories)

    async def process(raw: RawLine) -> Result:
        try:
            analysis = await asyncio.to_thread(comp.analyse, raw.data, f"{input_file}:{raw.line_no}")
        except InputError as e:
            return e  # raised by the writer in input order, after every earlier line is saved
        entry, outcome = await comp.compress(analysis)
        data = raw.data + b"\n" if entry is None else encode_entry(entry)
        if outcome.over_limit and outcome.status != "failed" and not save_over_limit:
            return None, outcome
        return data, outcome

    async def produce(tg: asyncio.TaskGroup) -> None:
        for raw in iter_lines(input_file, writer.position):
            task = tg.create_task(process(raw)) if selection.keeps(raw.ordinal) else None
            # Sampled-out lines only move the checkpoint; drop their bytes from the queue.
            await queue.put((raw if task else RawLine(raw.line_no, raw.ordinal, b"", raw.end_offset), task))
        await queue.put(None)

    try:
        async with asyncio.TaskGroup() as tg:
            tg.create_task(produce(tg))
            while (item := await queue.get()) is not None:
                raw, task = item
                pos = Position(raw.end_offset, raw.line_no, raw.ordinal + 1)
                if task is None:
                    writer.skip(pos)
                    continue
                result = await task
                if isinstance(result, InputError):
                    raise result
                data, outcome = result
                writer.totals.add(outcome, data is not None)
                line = writer.output_lines + 1 if data is not None else None
                writer.write(data, detail_line(outcome, raw.line_no, line, selection.scores.get(raw.ordinal)), pos)
                progress.advance(writer.totals)
    except BaseExceptionGroup as group:
        # Surface a run-fatal error (bad line, API key) as itself, not wrapped in a group.
        fatal = group.subgroup(TrajforgeError)
        if fatal is not None:
            raise _first(fatal) from None
        raise
    finally:
        progress.close()
        if writer.is_open:
            writer.commit(force=True)  # keep every line written so far for the next run
        if comp.summariser is not None:
            await comp.summariser.aclose()


def _first(group: BaseExceptionGroup[Any]) -> BaseException:
    exc: BaseException = group
    while isinstance(exc, BaseExceptionGroup):
        exc = exc.exceptions[0]
    return exc

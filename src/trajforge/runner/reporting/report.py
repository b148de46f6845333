"""The end of an invocation: the merge, statistics.json rebuilt from disk, the summary table and
the exit code that failed samples give.

The run's figures come from the records (through the merge: those merged before, kept in its
state, plus the new ones) and the checkpoint, which alone knows the failed and discarded
samples; the last invocation's come from its outcomes. They are
kept typed (runner.reporting.figures.Statistics) and become JSON only where statistics.json is written.
"""

from __future__ import annotations

import sys
from typing import Any

from trajforge.config import RunConfig
from trajforge.errors import OutputError
from trajforge.jsonio import atomic_write_bytes, dumps_pretty
from trajforge.redact import REGISTRY
from trajforge.run_layout import RunLayout
from trajforge.runner.state.checkpoint import Checkpoint
from trajforge.runner.reporting.figures import (
    ConcurrencyFigures, ConcurrencyNote, MergeFigures, SpendFigures, Statistics,
)
from trajforge.runner.state.keys import key_of
from trajforge.runner.reporting.append import append_new
from trajforge.runner.reporting.merge import MergeResult, merge, merge_state
from trajforge.sample.outcome import HALLUCINATED
from trajforge.runner.scheduling.rollouts import skipped_solved
from trajforge.runner.scheduling.rows import RunRows
from trajforge.runner.reporting.settings import history
from trajforge.runner.reporting.stats import EXIT_SAMPLES_FAILED, Totals, render_table, run_pace, too_many_failed
from trajforge.runner.reporting.token_stats import missing_note

ORACLE_MODEL = "oracle"  # the model name of --agent oracle runs (trajforge.tasks.oracle)


def finish(config: RunConfig, rows: RunRows, checkpoint: Checkpoint, invocation: Totals,
           seconds: float, spend: SpendFigures, concurrency: ConcurrencyFigures | ConcurrencyNote) -> Statistics:
    """Merge the batch files into trajectories.jsonl, then write and return the run's statistics."""
    result, totals, state = _merge(config, rows, checkpoint)
    for identity in result.hallucinated_ids:
        checkpoint.mark_discarded(identity, HALLUCINATED)
    checkpoint.set_merge(state)  # kept with the rest by the compaction at the end (runner.invocation)
    where = rows.positions({key_of(i) for i in checkpoint.samples})
    for identity, entry in checkpoint.samples.items():
        key = key_of(identity)
        if key not in where or key in checkpoint.done:
            continue  # a sample no longer in the dataset, or one that a later attempt finished
        if entry.status == "failed":
            totals.failed[entry.reason or "internal"] += 1
        elif entry.status == "discarded":
            totals.discarded[entry.reason or "unknown"] += 1
            totals.add_usage(entry.usage.model_dump() if entry.usage else {}, entry.api_calls)
    models, changed = history(checkpoint.invocations)
    stats = Statistics(
        run_name=config.run_name, model=config.resolved.model, distribution=config.distribution,
        sandbox=config.resolved.backend,
        dataset_file=str(config.dataset_file or config.tasks), invocations=len(checkpoint.invocations), models=models,
        settings_changes=changed, skipped_invalid=len(rows.skipped),
        run=totals.figures(total=len(rows), seconds=sum(i.seconds for i in checkpoint.invocations),
                           pace=run_pace((i.ran, i.seconds) for i in checkpoint.invocations)),
        last_invocation=invocation.figures(total=None, seconds=seconds,
                                           pace=(sum(invocation.per_worker.values()), seconds)),
        merge=MergeFigures(written=result.written, hallucinated_filtered=result.hallucinated,
                           duplicates_ignored=result.duplicates, not_in_dataset=result.stale,
                           not_kept=result.not_kept, problems=result.problems),
        spend=spend, concurrency=concurrency,
    )
    for p in result.problems:
        print(f"trajforge: {p}", file=sys.stderr)
    if (note := missing_note(stats.run.token_capture)) is not None:
        print(f"trajforge: {note}", file=sys.stderr)
    if result.stale:
        print(f"trajforge: {result.stale} finished sample(s) are no longer in the dataset; they stay in their "
              "batch files but not in trajectories.jsonl", file=sys.stderr)
    if state.get("out_of_order"):
        print(f"trajforge: {state['out_of_order']} record(s) of trajectories.jsonl follow records that come after "
              "them in the dataset (appended by a resume, not rewritten: docs/user-guide.md, 'Output', says how to "
              "get the order back)", file=sys.stderr)
    path = checkpoint.layout.statistics
    try:
        atomic_write_bytes(path, REGISTRY.bytes(dumps_pretty(stats.to_json())))
    except OSError as e:
        raise OutputError(path, e) from None
    return stats


def _merge(config: RunConfig, rows: RunRows, checkpoint: Checkpoint) -> tuple[MergeResult, Totals, dict[str, Any]]:
    """The incremental merge when it can do (runner.reporting.append), else the whole one; the merge's
    result, the figures of the records, the merge's new state."""
    # untampered concerns task records only, which the incremental merge never takes
    keep_passed, keep_untampered = config.keep in ("passed", "passed_untampered"), "untampered" in config.keep
    totals = Totals()
    totals.verify.k = config.samples_per_prompt
    layout = checkpoint.layout
    appended = append_new(layout, checkpoint.merge, checkpoint.done, rows, totals, keep_passed=keep_passed)
    if appended is not None:
        result, state = appended.result, appended.state
    else:
        totals = Totals()
        totals.verify.k = config.samples_per_prompt
        result = merge(layout, rows, totals, keep_passed=keep_passed, keep_untampered=keep_untampered)
        target = layout.trajectories
        try:
            st = target.stat()
        except OSError as e:
            raise OutputError(target, e, "read") from None
        state = merge_state(result, totals, dataset=rows.identity(), keep_passed=keep_passed,
                            entries=len(checkpoint.done), inode=st.st_ino, size=st.st_size, last=result.last)
    totals.verify.not_kept = result.not_kept
    if config.stop_after_passes is not None:  # over every row, so a resumed run says what one straight through does
        totals.verify.skipped_solved = skipped_solved(rows, totals, checkpoint, config.stop_after_passes)
    return result, totals, state


def print_summary(stats: Statistics, layout: RunLayout) -> None:
    from rich.console import Console

    console = Console(file=sys.stdout, width=100)
    console.print(render_table(stats))
    tasks = stats.run.tasks
    if stats.model == ORACLE_MODEL and tasks is not None:  # the oracle's verdict on the task set
        if tasks.below_full_reward:
            console.print(f"oracle: {len(tasks.below_full_reward)} of {tasks.all.tasks} task(s) do not reach full "
                          "reward (broken tests, environment or solution?):", highlight=False)
            for name in tasks.below_full_reward:
                t = tasks.per_task[name]
                reward = "-" if t.mean_reward is None else f"{t.mean_reward:.3f}"
                errors = f", {t.errors} verification error(s)" if t.errors else ""
                console.print(f"  {name}: mean reward {reward}{errors}", highlight=False, markup=False)
        else:
            console.print(f"oracle: all {tasks.all.tasks} task(s) reach full reward", highlight=False)
    console.print(f"trajectories: {layout.trajectories}  statistics: {layout.statistics}")


def failed_exit_code(config: RunConfig, stats: Statistics) -> int:
    """0, or EXIT_SAMPLES_FAILED when the run's failed samples reach --fail_on_error."""
    samples = stats.run.samples
    failed, total = samples.failed, samples.total or 0
    if not too_many_failed(failed, total, config.fail_on_error):
        return 0
    classes = ", ".join(f"{k} {v}" for k, v in samples.failed_by_class.items() if v)
    print(f"trajforge: {failed} of {total} sample(s) failed ({classes}); each one's reason is in "
          f"checkpoint.json; `--resume` retries them; exit code {EXIT_SAMPLES_FAILED} "
          f"(--fail_on_error {config.fail_on_error:g})", file=sys.stderr)
    return EXIT_SAMPLES_FAILED

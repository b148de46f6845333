"""--dry_run: what a run would do, from token counts and plans alone: no model calls, no files written.

The tokens after compression depend on how long the summaries come out, which only the model
decides: asked for about `compression.summary_target_tokens`, summarisers mostly write less (the
bundled 135M model much less), so a single figure that assumed every summary at its target
overestimated a real run by 20%. The estimate is the range: every summary at its target (the
plan's own assumption, and what "will fit" is judged by) down to summaries of no length at all,
with what each 100 tokens of summary length weighs.
"""

from __future__ import annotations

from pathlib import Path
from typing import TextIO

from trajforge.compress.compressor import TrajectoryCompressor
from trajforge.compress.records import iter_lines
from trajforge.compress.subset import Selection


def dry_run(input_file: Path, output: Path, selection: Selection, comp: TrajectoryCompressor, out: TextIO) -> int:
    under = would_fit = would_stay_over = nothing_to_summarise = 0
    before = after = 0
    summary = comp.cfg.compression.summary_target_tokens  # of comp.summary_budget; the rest is the prefix
    for raw in iter_lines(input_file):
        if not selection.keeps(raw.ordinal):
            continue
        a = comp.analyse(raw.data, f"{input_file}:{raw.line_no}")
        before += a.total
        if a.outcome is not None:
            under += a.outcome.status == "under_target"
            nothing_to_summarise += a.outcome.status == "uncompressible"
            after += a.total
            continue
        assert a.plan.region is not None
        after += a.total - a.plan.region.tokens + comp.summary_budget + a.notice_delta
        would_fit += a.plan.reaches_target
        would_stay_over += not a.plan.reaches_target
    n = under + would_fit + would_stay_over + nothing_to_summarise
    print(f"dry run: {n} trajectories from {input_file} (target {comp.target:,} tokens, {comp.counter.name})", file=out)
    print(f"  under budget, untouched:        {under}", file=out)
    print(f"  to summarise, will fit:         {would_fit}", file=out)
    print(f"  to summarise, still over limit: {would_stay_over}", file=out)
    print(f"  over limit, nothing to summarise: {nothing_to_summarise}", file=out)
    calls = would_fit + would_stay_over
    if calls:
        print(f"  tokens: {before:,} -> {after - calls * summary:,} to {after:,}, as the summaries' length decides: "
              f"{after:,} with every summary at its ~{summary:,}-token target, {calls * 100:,} fewer for each 100 "
              f"tokens they come out shorter; summary calls: {calls}", file=out)
    else:
        print(f"  tokens: {before:,} -> {after:,}; summary calls: 0", file=out)
    print(f"  would write: {output}", file=out)
    return 0

"""`trajforge export INPUT --format F --output PATH [filters]`: flags -> filters + exporter -> one pass.

The input is read once, line by line; each kept record goes to the format's exporter, which
writes into a staging path renamed over PATH at the end (export.exporter), so an export that fails
(a bad line names its file and line, exit 1) or is interrupted leaves PATH as it was. Flags accept
`--a_b=v`, `--a_b v` and `--a-b v`; bad flags exit 2.
"""

from __future__ import annotations

import argparse
import dataclasses
import shlex
import signal
import sys
import time
from collections import Counter
from pathlib import Path

from trajforge.cli.flags import Flag, Parser
from trajforge.errors import UsageError
from trajforge.export import FORMATS, exporter_class
from trajforge.export.exporter import Item, Options, Summary, check_output, staged
from trajforge.export.convert import ConversionError
from trajforge.export.filters import Filters, parse_split, verification_of
from trajforge.export.source import InputError, Source, open_source
from trajforge.registry import words

PROG = "trajforge export"
# (flag, kind, help)
FLAGS: list[Flag] = [
    Flag("input", "path", "a run directory (its trajectories.jsonl) or a trajectories / openai export JSONL file",
         positional=True, metavar="RUN_DIR_OR_JSONL"),
    Flag("format", "str", "output format: {formats} (required)", required=True),
    Flag("output", "path", "output file, or directory for {directories} and with --split (required)", required=True),
    Flag("only", "str", "keep only completed samples, only verified samples that passed, or all [default: all]",
         choices=("completed", "passed", "all")),
    Flag("min_tool_calls", "int", "keep samples with at least N tool calls [default: 0]"),
    Flag("task_type", "str", "keep samples of this task type"),
    Flag("dataset_file", "path", "dataset to read task types from when records carry none "
                                 "[default: the run's config.json dataset_file]"),
    Flag("sample_percent", "float", "keep about P%% of the samples, chosen by a hash of the sample identity and --seed"),
    Flag("seed", "int", "seed of --sample_percent and --split", default=42),
    Flag("split", "str", "split by sample identity, e.g. train=0.95,test=0.05 (the output becomes a directory)"),
    Flag("reasoning", "str", "field (reasoning_content), inline (<think> in content) or drop [default: field]",
         choices=("field", "inline", "drop")),
    Flag("no_reasoning", "bool", "same as --reasoning drop"),
    Flag("jsonl", "bool", "write JSON lines instead of Parquet ({jsonl_formats})"),
    Flag("overwrite", "bool", "replace an existing output (a directory only if it holds nothing but export files)"),
]


def flags() -> list[Flag]:
    """FLAGS with the formats of the registry as it is now (a plugin's format included)."""
    names = {"formats": ", ".join(FORMATS),
             "directories": words([s.name for s in FORMATS.specs() if s.capabilities.directory], "and"),
             "jsonl_formats": words([s.name for s in FORMATS.specs() if s.capabilities.jsonl], "and")}
    return [dataclasses.replace(f, help=f.help.format(**names)) for f in FLAGS]


def make_parser() -> Parser:
    return Parser(PROG, f"Export trajectories for training: {words([s.help for s in FORMATS.specs()])}.", flags())


def parse(argv: list[str]) -> tuple[argparse.Namespace, Filters, Options]:
    ns = make_parser().parse(argv)
    if ns.format not in FORMATS:
        raise UsageError(f"--format: invalid value {ns.format!r}: must be one of {', '.join(FORMATS)}")
    reasoning = ns.reasoning or "field"
    if ns.no_reasoning:
        if ns.reasoning not in (None, "drop"):
            raise UsageError(f"--no_reasoning contradicts --reasoning {ns.reasoning}")
        reasoning = "drop"
    caps = FORMATS[ns.format].capabilities
    if ns.jsonl and not caps.jsonl:
        raise UsageError(f"--jsonl: --format {ns.format} has one output format; --jsonl applies to "
                         f"{words([s.name for s in FORMATS.specs() if s.capabilities.jsonl])}")
    if not caps.reasoning and (ns.reasoning is not None or ns.no_reasoning):
        raise UsageError(f"--{'no_reasoning' if ns.no_reasoning else 'reasoning'}: --format {ns.format} exports the "
                         "token ids the model saw and wrote, reasoning included: they cannot drop or move it")
    if ns.sample_percent is not None and not 0 < ns.sample_percent <= 100:
        raise UsageError(f"--sample_percent: invalid value {ns.sample_percent:g}: must be more than 0 and at most 100")
    if ns.min_tool_calls is not None and ns.min_tool_calls < 0:
        raise UsageError(f"--min_tool_calls: invalid value {ns.min_tool_calls}: must be 0 or more")
    split = tuple(parse_split(ns.split)) if ns.split else ()
    filters = Filters(only=ns.only or "all",  # type: ignore[arg-type]
                      min_tool_calls=ns.min_tool_calls or 0, task_type=ns.task_type,
                      sample_percent=ns.sample_percent, seed=ns.seed, split=split)
    options = Options(reasoning=reasoning, splits=tuple(n for n, _ in split),  # type: ignore[arg-type]
                      command=shlex.join(["trajforge", "export", *argv]), jsonl=bool(ns.jsonl))
    return ns, filters, options


def _same_place(src: Source, output: Path, is_dir: bool) -> bool:
    out, read = output.resolve(), src.path.resolve()
    return out == read or (is_dir and out in read.parents) or (src.run_dir is not None and out == src.run_dir.resolve())


def run(argv: list[str]) -> int:
    ns, filters, options = parse(argv)
    cls = exporter_class(ns.format)
    src = open_source(ns.input)
    options = dataclasses.replace(options, source=src)
    is_dir = FORMATS[ns.format].capabilities.directory or bool(options.splits)
    if _same_place(src, ns.output, is_dir):
        raise UsageError(f"--output: {ns.output} would replace the input; choose another path")
    check_output(ns.output, is_dir, ns.overwrite)
    exporter = cls(options)
    left_out: Counter[str] = Counter()
    total = verified = 0
    started = time.monotonic()
    with staged(ns.output, is_dir) as target:
        try:
            exporter.open(target)
            # Under way: said on stderr (stdout gets the summary), so a long export shows it started.
            print(f"exporting {src.path} to {ns.output} ({ns.format})...", file=sys.stderr, flush=True)
            for line, record in src.records():
                total += 1
                verified += verification_of(record) is not None
                reason = filters.reject(record, lambda r: src.task_type(r, ns.dataset_file))
                if reason is not None:
                    left_out[reason] += 1
                    continue
                try:
                    exporter.write(Item(record, line, filters.split_of(record), src.line))
                except ConversionError as e:
                    raise InputError(f"{src.path}:{e.line or src.line}: {e}") from None
            try:
                summary = exporter.close()
            except ConversionError as e:
                raise InputError(f"{src.path}:{e.line}: {e}") from None
        except BaseException:
            exporter.abort()
            raise
    _report(ns, src, summary, total, left_out, time.monotonic() - started,
            no_verification=filters.only == "passed" and not verified)
    return 0


def _report(ns: argparse.Namespace, src: Source, summary: Summary, total: int, left_out: Counter[str],
            seconds: float, *, no_verification: bool) -> None:
    written = sum(summary.counts.values())
    print(f"exported {written} of {total} trajectories from {src.path} to {ns.output} ({ns.format}) in {seconds:.1f}s")
    if left_out:
        print("  left out: " + ", ".join(f"{n} {why}" for why, n in left_out.most_common()))
    if no_verification:
        print("  note: no record carries a verification result, so --only passed keeps none")
    if summary.rows is not None:
        print(f"  rows: {summary.rows} (a trajectory may give several, or none)")
    if len(summary.counts) > 1 or "" not in summary.counts:
        print("  splits: " + ", ".join(f"{s} {n}" for s, n in summary.counts.items()))
    if FORMATS[ns.format].capabilities.directory or len(summary.files) > 1:
        print("  files: " + ", ".join(summary.files))
    if summary.drops:
        print("  not in this format: " + "; ".join(summary.drops))
    else:
        print("  nothing left out of the exported records")


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def main(argv: list[str]) -> int:
    """Returns the exit code; errors propagate as TrajforgeError for the CLI's guard to print."""
    signal.signal(signal.SIGTERM, _interrupt)  # like Ctrl-C: clean up the staging files, then exit
    try:
        return run(list(argv))
    except KeyboardInterrupt:
        print("interrupted; the output was left as it was", file=sys.stderr)
        return 130

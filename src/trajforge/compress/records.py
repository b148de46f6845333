"""Where the compressor reads from and writes to, and streaming the input one line at a time.

A run directory is compressed through its merged `trajectories.jsonl` only: the batch files hold
the same trajectories, and compressing both (as the reference does) doubles the work and the
data. Lines are read as bytes with their byte offset, so a resumed run can seek straight to the
first unfinished line, and an untouched trajectory can be written back byte for byte. Blank lines
are not trajectories and are dropped.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from trajforge.errors import InputError, UsageError
from trajforge.jsonio import not_regular
from trajforge.run_layout import TRAJECTORIES, RunLayout

_READ_BUFFER = 1 << 20  # trajectory lines run to many KB; small reads would dominate the time


@dataclass(frozen=True, slots=True)
class RawLine:
    line_no: int  # 1-based physical line number, for messages
    ordinal: int  # 0-based index among the non-blank lines: the trajectory's number
    data: bytes  # without the line ending
    end_offset: int  # byte offset just after this line


@dataclass(frozen=True, slots=True)
class Position:
    """How far the input has been consumed: the next line to read."""

    offset: int = 0
    line_no: int = 0
    ordinal: int = 0


def resolve_input(path: Path) -> Path:
    """The JSONL file to read for --input (a file, or a run directory's trajectories.jsonl)."""
    if path.is_dir():
        layout = RunLayout(path)
        merged = layout.trajectories
        if not merged.is_file():
            batches = [p.name for p in layout.batch_files()]
            hint = (f"; the run has batch files ({', '.join(batches[:3])}...) but no merged file: "
                    "finish or resume the run first, or pass one file as --input") if batches else ""
            raise InputError(f"{path}: no {TRAJECTORIES} in this directory{hint}")
        return merged
    if not path.exists():
        raise InputError(f"{path}: no such file or directory")
    if (kind := not_regular(path, follow_symlinks=True)) is not None:
        raise InputError(f"{path}: {kind}, not a regular file")
    return path


def default_output(given: Path, input_file: Path, suffix: str) -> Path:
    """`<input stem><suffix>.jsonl` beside the input file; for a run (a directory given as --input,
    or a `trajectories.jsonl` with the run's `config.json` beside it), `<run name><suffix>.jsonl`
    beside the run directory: inside it, `trajforge run --overwrite` of that run would delete it."""
    run_dir = given if given.is_dir() else input_file.parent if (
        input_file.name == TRAJECTORIES and RunLayout(input_file.parent).config.is_file()) else None
    if run_dir is not None:
        run_dir = run_dir.resolve()
        return run_dir.with_name(f"{run_dir.name}{suffix}.jsonl")
    return input_file.with_name(f"{input_file.stem}{suffix}.jsonl")


def check_paths(input_file: Path, output: Path, companions: tuple[Path, ...] = (), *,
                replaced: tuple[Path, ...] = (), overwrite: bool = True) -> None:
    """Refuse an output that is the input, or that the final rename would destroy rather than write:
    a symlink, device node, FIFO, socket or directory at the output (or at a file written beside it,
    `companions`: the metrics, partial and checkpoint files) would itself be replaced. Without
    `overwrite`, an existing output (or `replaced`: its metrics file) is refused too, as export does."""
    if output.exists() and output.resolve() == input_file.resolve():
        raise UsageError(f"--output {output} is the input file; choose another path")
    for path in (output, *companions):
        if (kind := not_regular(path)) is not None:
            beside = "" if path == output else f" (written beside --output {output})"
            raise UsageError(f"--output: {path}{beside} is {kind}; give a regular file path")
    if not overwrite:
        for path in (output, *replaced):
            if path.exists():
                beside = "" if path == output else f" (written beside --output {output})"
                raise UsageError(f"--output: {path}{beside} exists; pass --overwrite to replace it, "
                                 "or choose another --output")


def iter_lines(path: Path, start: Position = Position()) -> Iterator[RawLine]:
    """Non-blank lines of `path` from `start`, with positions for resuming."""
    try:
        f = path.open("rb", buffering=_READ_BUFFER)
    except OSError as e:
        raise InputError(f"{path}: cannot read: {e.strerror or e}") from None
    with f:
        f.seek(start.offset)
        offset, line_no, ordinal = start.offset, start.line_no, start.ordinal
        for raw in f:
            offset += len(raw)
            line_no += 1
            data = raw.rstrip(b"\r\n")
            if not data or data.isspace():
                continue
            yield RawLine(line_no, ordinal, data, offset)
            ordinal += 1


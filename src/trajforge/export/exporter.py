"""The exporter interface every format implements, and the atomic output every export goes through.

An exporter is driven as open(output) -> write(item)... -> close() -> Summary, once per export.
It writes into a staging path that the pipeline renames over the real output only after close()
returned, so a failed or interrupted export leaves an existing output untouched and never a
half-written file. With splits, or for a format whose output is a directory, the output is a
directory; otherwise one file.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import tempfile
from abc import ABC, abstractmethod
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO, ClassVar

from trajforge.errors import UsageError
from trajforge.export.convert import Reasoning
from trajforge.export.source import Source
from trajforge.jsonio import not_regular


@dataclass(frozen=True)
class Options:
    reasoning: Reasoning = "field"
    splits: tuple[str, ...] = ()  # split names in order; empty: one output
    command: str = ""  # the export command line, for the dataset card
    source: Source | None = None
    jsonl: bool = False  # --jsonl: JSON lines instead of the format's binary files (formats that offer it)


@dataclass(frozen=True)
class Item:
    record: dict[str, Any]  # the saved ShareGPT record
    line: bytes  # its saved JSON line, ending in a newline
    split: str | None
    number: int = 0  # its line number in the input, for error messages


@dataclass
class Summary:
    counts: dict[str, int]  # records written per split ("" without splits)
    files: list[str] = field(default_factory=list)  # what was written, relative to the output
    drops: list[str] = field(default_factory=list)  # what this format leaves out of the records
    rows: int | None = None  # rows written, when a record may give several (or none)


class Exporter(ABC):
    """One format's writer. Its name and whether its output is a directory are its spec's
    (export.FORMATS)."""

    suffix: ClassVar[str]  # of each output file ("" for a directory format)

    def __init__(self, options: Options) -> None:
        self.options = options

    @abstractmethod
    def open(self, output: Path) -> None:
        """Start writing to `output` (a staging path: a file, or an existing empty directory)."""

    @abstractmethod
    def write(self, item: Item) -> None:
        """Add one record. May raise convert.ConversionError for a record it cannot express."""

    @abstractmethod
    def close(self) -> Summary:
        """Finish writing; the pipeline then fsyncs the staging path and renames it into place."""

    def abort(self) -> None:
        """Release what open() took after a failure (the staging path is removed by the caller)."""

    def drops(self) -> list[str]:
        return ["reasoning (--no_reasoning)"] if self.options.reasoning == "drop" else []


class SplitFiles:
    """One binary output file per split (`<dir>/<split><suffix>`), or the output file itself."""

    def __init__(self, output: Path, splits: tuple[str, ...], suffix: str) -> None:
        names = splits or ("",)
        self.paths = {s: (output / f"{s}{suffix}" if s else output) for s in names}
        self.files: dict[str, BinaryIO] = {s: p.open("wb", buffering=1 << 20) for s, p in self.paths.items()}
        self.counts = dict.fromkeys(names, 0)

    def write(self, split: str | None, data: bytes) -> None:
        self.files[split or ""].write(data)
        self.counts[split or ""] += 1

    def close(self) -> None:
        for f in self.files.values():
            f.close()

    def abort(self) -> None:
        for f in self.files.values():
            f.close()

    def names(self, root: Path) -> list[str]:
        return [str(p.relative_to(root)) if p != root else p.name for p in self.paths.values()]


# What an export directory may hold; anything else means the directory is not ours to replace.
_EXPORT_NAMES = ("README.md", "dataset_dict.json", "dataset_info.json", "state.json")
_EXPORT_SUFFIXES = (".jsonl", ".parquet", ".arrow")


def _looks_exported(path: Path, depth: int = 0) -> bool:
    for entry in path.iterdir():
        if entry.is_dir() and not entry.is_symlink():
            if depth > 0 or not _looks_exported(entry, depth + 1):
                return False
        elif not (entry.name in _EXPORT_NAMES or entry.suffix in _EXPORT_SUFFIXES):
            return False
    return True


def check_output(output: Path, is_dir: bool, overwrite: bool) -> None:
    """Refuse an output that exists without --overwrite, that is not an earlier export, or that a
    rename would destroy rather than write (a symlink, device node, FIFO or socket: the rename
    replaces the node or link itself)."""
    kind = not_regular(output)
    if kind == "a directory" and not is_dir:
        raise UsageError(f"--output: {output} is a directory; this export writes one file")
    if kind not in (None, "a directory"):
        raise UsageError(f"--output: {output} is {kind}; give a {'directory' if is_dir else 'regular file'} path")
    if kind is None and not output.exists():
        return
    if not overwrite:
        raise UsageError(f"--output: {output} already exists; pass --overwrite to replace it")
    if kind == "a directory":
        if not _looks_exported(output):
            raise UsageError(f"--output: {output} holds files an export does not write; refusing to replace it")


def _fsync_tree(path: Path) -> None:
    paths = [path] if path.is_file() else [path, *sorted(path.rglob("*"))]
    for p in paths:
        fd = os.open(p, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


@contextlib.contextmanager
def _signals_blocked() -> Iterator[None]:
    """Hold SIGINT/SIGTERM back for a moment, so a Ctrl-C cannot land between creating the staging
    directory and the `try` that removes it; a pending signal is delivered right after."""
    old = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


@contextlib.contextmanager
def staged(output: Path, is_dir: bool) -> Iterator[Path]:
    """A staging path beside `output`, renamed over it when the block ends without an error."""
    output.parent.mkdir(parents=True, exist_ok=True)
    tmp: Path | None = None
    try:
        with _signals_blocked():
            tmp = Path(tempfile.mkdtemp(prefix=f".{output.name}.", suffix=".export", dir=output.parent))
        target = tmp if is_dir else tmp / output.name
        if is_dir:
            os.chmod(tmp, 0o777 & ~_umask())  # mkdtemp's directory is private; an export is meant to be read
        yield target
        _fsync_tree(tmp)
        if not is_dir:
            os.replace(target, output)
        else:  # a directory cannot be replaced in one rename: move the old one aside first
            old = None
            if output.exists() or output.is_symlink():
                old = Path(tempfile.mkdtemp(prefix=f".{output.name}.", suffix=".old", dir=output.parent))
                os.replace(output, old / "out")
            os.replace(tmp, output)
            if old is not None:
                shutil.rmtree(old, ignore_errors=True)
        fd = os.open(output.parent, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


class JsonlExporter(Exporter):
    """A format of one JSON line per record, one file per split: subclasses say what the line is."""

    suffix = ".jsonl"

    @abstractmethod
    def line(self, item: Item) -> bytes:
        """The output line of one record, ending in a newline."""

    def open(self, output: Path) -> None:
        self.root = output
        self.files = SplitFiles(output, self.options.splits, self.suffix)

    def write(self, item: Item) -> None:
        self.files.write(item.split, self.line(item))

    def close(self) -> Summary:
        self.files.close()
        return Summary(self.files.counts, self.files.names(self.root), self.drops())

    def abort(self) -> None:
        if hasattr(self, "files"):
            self.files.abort()

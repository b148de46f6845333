"""Durable append-only batch files: data/<run>/batch_N.jsonl.

Every record is written as one whole line in a single write and flushed; files are fsynced at
least every `sync_interval` seconds and on close. At the start of every invocation (`repair`)
a torn last line (no trailing newline, left by a crash or a full disk) is cut off once and
reported, so new lines are never glued onto a fragment. A sample counts as finished only if a
line of it parses as a whole record: a record cut short in the middle of a file has an intact
head but is no record. Lines come scrubbed of the run's secrets (runner.listeners.Ended, the only
kind of value the writer takes them from), and a failed write raises OutputError naming the file.
"""

from __future__ import annotations

import errno
import os
import re
import stat
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, TypeVar

import orjson

from trajforge.errors import OutputError
from trajforge.run_layout import RunLayout, batch_number

_HEAD_RE = re.compile(rb'^\{"prompt_index":(-?\d+),"sample_id":"([^"\\]+)"')


@dataclass(slots=True)
class LineRef:
    identity: str
    prompt_index: int
    path: Path
    offset: int
    length: int

    @property
    def batch(self) -> int:
        return batch_number(self.path)

    def location(self) -> tuple[int, int, int]:
        """(batch, offset, length), as store.read_at takes it."""
        return self.batch, self.offset, self.length


def read_head(line: bytes) -> tuple[int, str] | None:
    """(prompt_index, sample_id) of a record line, from its first bytes when possible."""
    m = _HEAD_RE.match(line)
    if m:
        return int(m.group(1)), m.group(2).decode()
    try:
        obj = orjson.loads(line)
        return int(obj["prompt_index"]), str(obj["sample_id"])
    except (orjson.JSONDecodeError, KeyError, TypeError, ValueError):
        return None


def scan(layout: RunLayout, problems: list[str] | None = None, unreadable: set[str] | None = None
         ) -> Iterator[LineRef]:
    """Yield every complete record line of every batch file that parses as a whole record.

    `unreadable` collects the sample identities named by lines that do not (when their head is
    intact): those samples are not finished, whatever the checkpoint says. Raises OutputError
    when a batch file cannot be read."""
    for path in layout.batch_files():
        yield from scan_file(path, 0, problems, unreadable)


def scan_file(path: Path, start: int = 0, problems: list[str] | None = None,
              unreadable: set[str] | None = None) -> Iterator[LineRef]:
    """`scan` of one batch file from byte `start` (a line start) on. Raises OutputError."""
    try:
        yield from _scan_file(path, start, problems, unreadable)
    except OSError as e:
        raise OutputError(path, e, "read") from None


def _scan_file(path: Path, offset: int, problems: list[str] | None, unreadable: set[str] | None) -> Iterator[LineRef]:
    where = path.name if offset == 0 else f"{path.name} (from byte {offset})"
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)  # a FIFO must not hang the start
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise OSError(errno.EINVAL, "not a regular file (a batch file must be one)")
    with os.fdopen(fd, "rb") as f:
        f.seek(offset)
        for lineno, line in enumerate(f, start=1):
            start, offset = offset, offset + len(line)
            if not line.endswith(b"\n"):
                if problems is not None:
                    problems.append(f"{where}:{lineno}: torn last line ({len(line)} bytes) ignored")
                break
            try:
                obj = orjson.loads(line)
                ref: LineRef | None = LineRef(str(obj["sample_id"]), int(obj["prompt_index"]), path, start,
                                              len(line))
            except (orjson.JSONDecodeError, KeyError, TypeError, ValueError):
                ref = None
            if ref is not None:
                yield ref
                continue
            if not line.strip():
                continue
            head = read_head(line)
            if head is not None and unreadable is not None:
                unreadable.add(head[1])
            if problems is not None:
                which = f" of sample {head[1]}" if head else ""
                problems.append(f"{where}:{lineno}: unreadable record{which} ignored ({len(line)} bytes)")


def repair(layout: RunLayout) -> list[str]:
    """Cut the torn last line of every batch file (a crash or a full disk mid-write), once, at start."""
    messages = []
    for path in layout.batch_files():
        try:
            cut = cut_torn_tail(path)
        except OSError as e:
            raise OutputError(path, e) from None
        if cut:
            messages.append(f"{path.name}: removed a torn last line of {cut} bytes (its sample runs again)")
    return messages


def cut_torn_tail(path: Path) -> int:
    """Truncate a trailing partial line; return the number of bytes removed."""
    size = path.stat().st_size
    if size == 0:
        return 0
    with path.open("rb+") as f:
        f.seek(max(0, size - 1))
        if f.read(1) == b"\n":
            return 0
        chunk = 1 << 16
        pos = size
        while pos > 0:
            start = max(0, pos - chunk)
            f.seek(start)
            data = f.read(pos - start)
            nl = data.rfind(b"\n")
            if nl != -1:
                keep = start + nl + 1
                break
            pos = start
        else:
            keep = 0
        f.truncate(keep)
        f.flush()
        os.fsync(f.fileno())
        return size - keep


T = TypeVar("T")


def read_at(layout: RunLayout, items: Iterable[T], where: Callable[[T], tuple[int, int, int]]
            ) -> Iterator[tuple[T, bytes]]:
    """(item, its line) for each of `items`, in that order: the line at `where(item)`, a (batch,
    offset, length). Each batch file is opened once. Raises OSError, naming the file."""
    handles: dict[int, BinaryIO] = {}
    try:
        for item in items:
            batch, offset, length = where(item)
            try:
                f = handles.get(batch)
                if f is None:
                    f = handles[batch] = layout.batch(batch).open("rb")
                f.seek(offset)
                line = f.read(length)
            except OSError as e:
                e.filename = e.filename or str(layout.batch(batch))
                raise
            yield item, line
    finally:
        for f in handles.values():
            f.close()


class BatchStore:
    def __init__(self, layout: RunLayout, *, sync_interval: float = 2.0) -> None:
        self.layout = layout
        self.sync_interval = sync_interval
        self._files: dict[int, BinaryIO] = {}
        self._sizes: dict[int, int] = {}
        self._dirty: set[int] = set()
        self._last_sync = time.monotonic()
        self.repaired: list[str] = []

    def _open(self, batch_num: int) -> BinaryIO:
        f = self._files.get(batch_num)
        if f is None:
            path = self.layout.batch(batch_num)
            try:
                if path.exists():
                    cut = cut_torn_tail(path)
                    if cut:
                        self.repaired.append(f"{path.name}: removed a torn last line of {cut} bytes")
                f = self._files[batch_num] = path.open("ab", buffering=0)
                self._sizes[batch_num] = os.fstat(f.fileno()).st_size
            except OSError as e:
                raise OutputError(path, e) from None
        return f

    def append(self, batch_num: int, line: bytes) -> tuple[int, int]:
        """Write one record line (already scrubbed); return its (offset, length). Raises OutputError."""
        f = self._open(batch_num)
        data = memoryview(line if line.endswith(b"\n") else line + b"\n")
        where, length = self._sizes[batch_num], len(data)
        try:
            while data:  # unbuffered: one write per line, repeated only if the kernel took part of it
                data = data[f.write(data):]
        except OSError as e:
            raise OutputError(f.name, e) from None  # the run writes nothing more (Invocation.halt)
        self._sizes[batch_num] = where + length
        self._dirty.add(batch_num)
        if time.monotonic() - self._last_sync >= self.sync_interval:
            self.sync()
        return where, length

    def sync(self) -> None:
        for n in list(self._dirty):
            try:
                os.fsync(self._files[n].fileno())
            except OSError as e:
                raise OutputError(self._files[n].name, e) from None
            self._dirty.discard(n)
        self._last_sync = time.monotonic()

    def close(self) -> None:
        """Sync and close every file; all are closed even when a sync fails (then OutputError)."""
        try:
            self.sync()
        finally:
            for f in self._files.values():
                f.close()
            self._files.clear()
            self._sizes.clear()
            self._dirty.clear()

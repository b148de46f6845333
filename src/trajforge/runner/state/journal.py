"""journal.jsonl: the run's bookkeeping since the last snapshot, as appended groups of small lines.

checkpoint.json is a snapshot, rewritten only when the journal is compacted (runner.state.checkpoint);
everything that happens in between is appended here, so saving costs what changed, not the size
of the run. Lines are buffered and written as one group by `commit`, whose last line is the
commit line (it carries the current invocation's entry); the group is then fsynced. A reader
applies only whole committed groups: lines after the last commit line (a group torn by a kill or
a full disk) are ignored, and cut off before the next group is appended, so a group is never glued
to a fragment.

The first line names the journal's generation. The snapshot says which generation continues it:
a journal of another generation was already folded into the snapshot (a compaction that was
interrupted after writing it) and is ignored. `rotate` replaces the journal, atomically, with an
empty one of the next generation.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import orjson

from trajforge.errors import OutputError
from trajforge.jsonio import atomic_write_bytes
from trajforge.redact import REGISTRY

COMMIT = "invocation"  # the key of a group's last line


@dataclass
class Replay:
    groups: list[list[dict[str, Any]]]  # the committed groups, lines in order
    end: int  # bytes of the file that hold the header and those groups
    torn: int  # bytes after them (an uncommitted or torn group)


def header(generation: int) -> bytes:
    return orjson.dumps({"journal": generation}) + b"\n"


def read(path: Path, generation: int) -> Replay | None:
    """The committed groups of the journal at `path` when it continues snapshot `generation`; None
    when there is no journal or it belongs to another generation. Raises OutputError (read)."""
    try:
        with path.open("rb") as f:
            data = f.read()
    except FileNotFoundError:
        return None
    except OSError as e:
        raise OutputError(path, e, "read") from None
    first, _, _ = data.partition(b"\n")
    try:
        head = orjson.loads(first)
    except orjson.JSONDecodeError:
        return None  # a header torn at creation: nothing was ever committed to it
    if not isinstance(head, dict) or head.get("journal") != generation:
        return None
    groups: list[list[dict[str, Any]]] = []
    group: list[dict[str, Any]] = []
    end = pos = len(first) + 1
    for line in _lines(data, pos):
        if not line.endswith(b"\n"):
            break
        try:
            obj = orjson.loads(line)
        except orjson.JSONDecodeError:
            break
        if not isinstance(obj, dict):
            break
        pos += len(line)
        group.append(obj)
        if COMMIT in obj:
            groups.append(group)
            group = []
            end = pos
    return Replay(groups, end, len(data) - end)


def _lines(data: bytes, pos: int) -> Iterator[bytes]:
    while pos < len(data):
        nl = data.find(b"\n", pos)
        stop = len(data) if nl == -1 else nl + 1
        yield data[pos:stop]
        pos = stop


class Journal:
    """The open journal of the running invocation (one writer: the run's lock holder)."""

    def __init__(self, path: Path, generation: int, end: int | None) -> None:
        """`end`: bytes of the existing file to keep (its committed groups); None: start a new file."""
        self.path = path
        self.generation = generation
        self._pending: list[bytes] = []
        self._f: BinaryIO | None = None
        self._end = end

    def add(self, obj: dict[str, Any]) -> None:
        self._pending.append(orjson.dumps(obj))

    @property
    def pending(self) -> int:
        return len(self._pending)

    @property
    def size(self) -> int:
        """Bytes of the file's committed part."""
        return self._end or 0

    def _open(self) -> BinaryIO:
        if self._f is None:
            try:
                if self._end is None:
                    atomic_write_bytes(self.path, header(self.generation))
                    self._end = len(header(self.generation))
                f = self.path.open("r+b", buffering=0)
                f.truncate(self._end)  # an uncommitted tail goes before anything is appended
                f.seek(self._end)
                self._f = f
            except OSError as e:
                raise OutputError(self.path, e) from None
        return self._f

    def commit(self, line: dict[str, Any]) -> None:
        """Append the pending lines and `line` (the commit line) as one group, then fsync.
        Raises OutputError; the group is then not committed (a reader ignores it)."""
        f = self._open()
        data = memoryview(REGISTRY.bytes(b"\n".join([*self._pending, orjson.dumps(line)]) + b"\n"))
        size = len(data)
        try:
            while data:
                data = data[f.write(data):]
            os.fsync(f.fileno())
        except OSError as e:
            raise OutputError(self.path, e) from None
        assert self._end is not None
        self._end += size
        self._pending.clear()

    def rotate(self, generation: int) -> None:
        """Replace the journal with an empty one of `generation` (after the snapshot that folds it in)."""
        self.close()
        self._pending.clear()
        self.generation, self._end = generation, None
        self._open()

    def close(self) -> None:
        if self._f is not None:
            self._f.close()
            self._f = None  # reopened at the end of its last committed group

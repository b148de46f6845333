"""rows.idx (RunLayout.rows_cache): the last invocation's pass over the dataset, so a resume reads
again only what changed.

Validating a million rows costs several seconds (bench/RESULTS.md), and a resume that runs a
thousand of them must not pay it each time. At the end of an invocation the rows the runner kept
(runner.scheduling.rows: each valid row's key, byte offset, line and occurrence) are saved here with where
the pass stood after its last whole line (dataset.PassState), the blake2b digest of the dataset
bytes up to there, and a digest of everything else that decides which rows are valid and what
they are (`settings`). The next start with the same settings hashes as many bytes of the dataset
file; when they match (the same file, or one with rows appended) it takes the rows from here and
reads only the rest. Anything else (another file, an edited row, other settings or trajforge
version, a torn or foreign file) is a miss, and the whole file is read as if there were no cache.

Rows taken from here are not validated again by the pass; the runner checks again every such row
it is about to run (runner.scheduling.rows), when it reads it back, so a row that became invalid (a rule of
a newer version, a cwd that now leads somewhere else) never runs.

Layout: one JSON line (the header, with the task types' names), then six little-endian arrays of
`n` items: keys (u64), offsets (i64), lines (u32), occurrences (u32), task types (u16, numbers
into the names), and the keys again in ascending order (u64, for the occurrences of rows
appended later: `prior`). Written atomically.
"""

from __future__ import annotations

import hashlib
import sys
from array import array
from bisect import bisect_left
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

import orjson

from trajforge import __version__
from trajforge.catalog.sandboxes import runs_on_host
from trajforge.config import RunConfig
from trajforge.errors import OutputError
from trajforge.jsonio import atomic_write_bytes
from trajforge.runner.state.keys import row_key

FORMAT = 2  # bump when the layout, the identities or the rows' checks change
CHUNK = 1 << 20


def row_settings(config: RunConfig) -> dict[str, Any]:
    """The settings that decide which rows of a file are the dataset's samples, and so their places."""
    return {"skip_invalid": config.skip_invalid, "max_samples": config.max_samples,
            "host_cwd": runs_on_host(config.sandbox)}


def settings(config: RunConfig) -> str:
    """What, besides the dataset's bytes, decides the rows this file keeps and what is known of them."""
    verify = {name: tt.model_dump(mode="json") for name, tt in sorted(config.task_types.items())}
    return hashlib.blake2b(orjson.dumps({
        "format": FORMAT, "trajforge": __version__, **row_settings(config), "task_types": verify,
        "check_timeout": config.check_timeout, "judge_threshold": config.judge_threshold,
    }, option=orjson.OPT_SORT_KEYS), digest_size=16).hexdigest()


@dataclass
class Saved:
    """A rows.idx read back: the pass's state at its end and the rows it kept."""

    settings: str
    offset: int  # dataset bytes covered (whole lines)
    digest: str  # blake2b (16 bytes) of them
    lines: int
    rows: int
    count: int
    skipped: list[str]
    with_image: int
    first_bare: int | None
    rubric: bool
    verified: bool
    keys: array = field(default_factory=lambda: array("Q"))
    offsets: array = field(default_factory=lambda: array("q"))
    line_of: array = field(default_factory=lambda: array("I"))
    occurrences: array = field(default_factory=lambda: array("I"))
    task_type: array = field(default_factory=lambda: array("H"))
    task_names: list[str | None] = field(default_factory=lambda: [None])
    ordered: array = field(default_factory=lambda: array("Q"))

    def matches(self, dataset: Path) -> Any:
        """The blake2b digest (16 bytes) of the bytes this pass read, fed them from `dataset`, when
        the file begins with them (the pass goes on with it); else None. Never raises: a file that
        cannot be read is a miss, and the pass then says what is wrong with it."""
        digest = prefix_digest(dataset, self.offset)
        return digest if digest is not None and digest.hexdigest() == self.digest else None

    def prior(self, d: bytes) -> int:
        """How many of the rows here have content digest `d` (their occurrences are 0, 1, ...)."""
        n = 0
        while self._has(row_key(d, n)):
            n += 1
        return n

    def _has(self, key: int) -> bool:
        i = bisect_left(self.ordered, key)
        return i < len(self.ordered) and self.ordered[i] == key


def prefix_digest(path: Path, size: int) -> Any:
    """A blake2b digest (16 bytes) fed the first `size` bytes of `path`; None when the file is
    shorter or cannot be read."""
    digest = hashlib.blake2b(digest_size=16)
    try:
        with path.open("rb") as f:
            while size:
                chunk = f.read(min(CHUNK, size))
                if not chunk:
                    return None
                digest.update(chunk)
                size -= len(chunk)
    except OSError:
        return None
    return digest


def load(path: Path, wanted: str) -> Saved | None:
    """The rows.idx at `path` when it was written with settings `wanted`, else None (a miss)."""
    try:
        with path.open("rb") as f:
            head = orjson.loads(f.readline())
            if not isinstance(head, dict) or head.get("settings") != wanted:
                return None
            n = int(head["n"])
            saved = Saved(wanted, int(head["offset"]), str(head["digest"]), int(head["lines"]), int(head["rows"]),
                          int(head["count"]), [str(p) for p in head["skipped"]], int(head["with_image"]),
                          head["first_bare"], bool(head["rubric"]), bool(head["verified"]),
                          task_names=[None, *(str(t) for t in head["task_names"])])
            for arr in (saved.keys, saved.offsets, saved.line_of, saved.occurrences, saved.task_type, saved.ordered):
                _read(f, arr, n)
            if f.read(1):
                return None
    except (OSError, ValueError, KeyError, TypeError, EOFError, orjson.JSONDecodeError):
        return None
    if saved.count != n:
        return None
    return saved


def _read(f: BinaryIO, arr: array, n: int) -> None:
    arr.fromfile(f, n)  # EOFError when the file is shorter
    if sys.byteorder != "little":
        arr.byteswap()


def save(path: Path, saved: Saved) -> None:
    """Write `saved` (its `ordered` is made here) atomically. Raises OutputError."""
    saved.ordered = array("Q", sorted(saved.keys))
    head = {"settings": saved.settings, "offset": saved.offset, "digest": saved.digest, "lines": saved.lines,
            "rows": saved.rows, "count": saved.count, "skipped": saved.skipped, "with_image": saved.with_image,
            "first_bare": saved.first_bare, "rubric": saved.rubric, "verified": saved.verified,
            "task_names": saved.task_names[1:], "n": len(saved.keys)}
    parts = [orjson.dumps(head) + b"\n"]
    for arr in (saved.keys, saved.offsets, saved.line_of, saved.occurrences, saved.task_type, saved.ordered):
        if sys.byteorder != "little":
            arr = array(arr.typecode, arr)
            arr.byteswap()
        parts.append(arr.tobytes())
    try:
        atomic_write_bytes(path, b"".join(parts))
    except OSError as e:
        raise OutputError(path, e) from None

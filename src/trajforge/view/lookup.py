"""Answers from the viewer's index (view/index.py's RunIndex is a Lookup): every sample in order,
one sample as an Entry or its record read back, the run's time and pace, whether it is live; and
what the viewer reads of the run's state besides its records: checkpoint.json with its journal,
read leniently, and the run's lock, read from /proc/locks.
"""

from __future__ import annotations

import time
from array import array
from pathlib import Path
from typing import Any

import orjson

from trajforge.errors import OutputError, RunStateError
from trajforge.export.source import as_record
from trajforge.runner.reader import RunReader, key_of, run_pace
from trajforge.view.columns import BY_ID, BY_LINE, OUTCOME, Columns
from trajforge.view.summary import Entry, task_type_of

SETTLE = 2.0  # seconds: while catching up, the order of the list is made again at most this often


class Lookup:
    """The queries of RunIndex, over the state its reading keeps."""

    run_dir: Path | None
    files: list[Path]
    records: Columns
    outcomes: list[Entry]
    checkpoint: dict[str, Any]
    generation: int
    behind: int
    _order: tuple[tuple[int, int], float, array]
    _outcomes_made: int

    def order(self) -> array:
        """Every sample (records by number, then outcomes from OUTCOME on) in dataset order within
        batches; made again when the index changed, at most every SETTLE seconds while it is
        still catching up with the files (new outcomes always)."""
        (gen, made), at, cached = self._order
        now = time.monotonic()
        if made != self._outcomes_made or (gen != self.generation and (not self.behind or now - at >= SETTLE)):
            cached = self._make_order()
            self._order = ((self.generation, self._outcomes_made), now, cached)
        return cached

    def _make_order(self) -> array:
        n = len(self.records)
        if self.run_dir is None:
            return array("I", range(n))
        big = 1 << 40
        cols = self.records
        place = [(b if b >= 0 else big) << 41 | (p if p >= 0 else big) for b, p in zip(cols.batch, cols.prompt_index)]
        place += [(big if e.batch is None else e.batch) << 41 | (big if e.prompt_index is None else e.prompt_index)
                  for e in self.outcomes]
        ids = sorted(range(len(place)), key=place.__getitem__)  # stable: ties in order of reading
        return array("I", (i if i < n else OUTCOME + i - n for i in ids))

    def entries(self) -> Any:
        """Every sample, in dataset order within batches (view.overview.Entries)."""
        from trajforge.view.overview import Entries

        return Entries(self, self.order())

    def entry(self, i: int) -> Entry:
        """Sample `i` of `order()`'s numbering as an Entry: a record's key and prompt read back."""
        if i >= OUTCOME:
            return self.outcomes[i - OUTCOME]
        rec = self.read_at(i) or {}
        cols = self.records
        sid = str(rec.get("sample_id", ""))
        spelled = cols.spelled[i]
        key = sid if spelled == BY_ID else f"line-{cols.line[i]}" if spelled == BY_LINE else \
            f"{sid}@{self.files[cols.file[i]].name}:{cols.line[i]}"
        conv = rec.get("conversations") if isinstance(rec.get("conversations"), list) else []
        prompt = next((t.get("value") for t in conv if isinstance(t, dict) and t.get("from") == "human"), "")
        e = cols.entry(i, key, str(prompt))
        e.task_type = e.task_type or task_type_of(rec)
        return e

    def find(self, key: str) -> Entry | None:
        try:
            i = self.records.key.index(key_of(key))
        except ValueError:
            return next((o for o in self.outcomes if o.key == key), None)
        e = self.entry(i)
        e.key = key  # another record at its place (the file was rewritten) is found out when it is read
        return e

    def read_at(self, i: int) -> dict[str, Any] | None:
        cols = self.records
        try:
            with self.files[cols.file[i]].open("rb") as f:
                f.seek(cols.offset[i])
                rec = orjson.loads(f.read(cols.length[i]))
            return as_record(rec) if isinstance(rec, dict) else None
        except (OSError, orjson.JSONDecodeError, ValueError):
            return None

    def read_record(self, e: Entry) -> dict[str, Any] | None:
        if e.file < 0:
            return None
        with self.files[e.file].open("rb") as f:
            f.seek(e.offset)
            data = f.read(e.length)
        rec = orjson.loads(data)
        try:
            return as_record(rec) if isinstance(rec, dict) else None
        except ValueError:
            return None

    def seconds(self) -> float | None:
        inv = self.checkpoint.get("invocations")
        if not isinstance(inv, list) or not inv:
            return None
        return sum(float(i.get("seconds", 0.0)) for i in inv if isinstance(i, dict))

    def pace(self) -> tuple[int, float] | None:
        """The run's throughput basis, as statistics.json takes it (runner.reporting.stats.run_pace)."""
        inv = self.checkpoint.get("invocations")
        if not isinstance(inv, list) or not inv:
            return None
        return run_pace((int(i.get("ran", 0)), float(i.get("seconds", 0.0))) for i in inv if isinstance(i, dict))

    def live(self) -> bool:
        """Whether a trajforge process runs the run now (runner.reader: never taking its lock)."""
        return self.run_dir is not None and RunReader(self.run_dir).live()


def read_checkpoint(run_dir: Path, problem: Any) -> dict[str, Any]:
    """{"samples": failed and discarded ones, "invocations": [...]}, as JSON, from the run's
    bookkeeping read the way the runner reads it (runner.reader); a problem, and nothing, when
    the runner would refuse it."""
    try:
        state = RunReader(run_dir).state(index=False)
    except (RunStateError, OutputError) as e:
        problem(f"{e}; failed and discarded samples not shown")
        return {"samples": {}, "invocations": []}
    return {"samples": {k: e.model_dump(exclude_unset=True) for k, e in state.samples.items()},
            "invocations": [i.model_dump(exclude_unset=True) for i in state.invocations]}

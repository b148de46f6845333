"""Answers from the viewer's index (view/index.py's RunIndex is a Lookup): every sample in order,
one sample as an Entry or its record read back, the run's time and pace, whether it is live; and
what the viewer reads of the run's state besides its records: checkpoint.json with its journal,
read leniently, and the run's lock, read from /proc/locks.
"""

from __future__ import annotations

import os
import time
from array import array
from pathlib import Path
from typing import Any

import orjson

from trajforge.errors import OutputError
from trajforge.export.source import as_record
from trajforge.runner import journal
from trajforge.runner.checkpoint_file import JOURNAL_FILE
from trajforge.runner.keys import key_of
from trajforge.runner.stats import run_pace
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
        """The run's throughput basis, as statistics.json takes it (runner.stats.run_pace)."""
        inv = self.checkpoint.get("invocations")
        if not isinstance(inv, list) or not inv:
            return None
        return run_pace((int(i.get("ran", 0)), float(i.get("seconds", 0.0))) for i in inv if isinstance(i, dict))

    def live(self) -> bool:
        """Whether a trajforge process holds the run's lock (read from /proc/locks, so the viewer
        never takes the lock itself and cannot get in a starting run's way)."""
        if self.run_dir is None:
            return False
        return lock_held(self.run_dir / ".lock")


def lock_held(path: Path) -> bool:
    try:
        st = path.stat()
        locks = Path("/proc/locks").read_text()
    except OSError:
        return False
    # Lines read "1: FLOCK ADVISORY WRITE <pid> <major>:<minor>:<inode> 0 EOF". On overlay file
    # systems stat() may report another device than the lock table: the inode decides then.
    needle = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino} "
    if needle in locks:
        return True
    return any(f":{st.st_ino} " in line and "FLOCK" in line for line in locks.splitlines())


def read_checkpoint(run_dir: Path, problem: Any) -> dict[str, Any]:
    """{"samples": failed and discarded ones, "invocations": [...]} from checkpoint.json and its
    journal, read leniently (the viewer shows what it can of a file another version wrote)."""
    data: dict[str, Any] = {}
    try:
        loaded = orjson.loads((run_dir / "checkpoint.json").read_bytes())
        data = loaded if isinstance(loaded, dict) else {}
    except FileNotFoundError:
        pass
    except (OSError, orjson.JSONDecodeError) as e:
        problem(f"checkpoint.json: unreadable ({e}); failed and discarded samples not shown")
    raw = data.get("samples")
    samples = {k: v for k, v in raw.items() if isinstance(v, dict) and v.get("status") != "done"} \
        if isinstance(raw, dict) else {}
    invocations = [i for i in data.get("invocations") or [] if isinstance(i, dict)]
    try:
        replay = journal.read(run_dir / JOURNAL_FILE, data.get("journal", 0))
    except OutputError:
        replay = None
    for line in (ln for group in (replay.groups if replay else []) for ln in group):
        if "sample" in line:
            samples[str(line["sample"])] = {k: v for k, v in line.items() if k != "sample"}
        elif "done" in line or "forget" in line:
            samples.pop(str(line.get("done", line.get("forget"))), None)
        elif isinstance(line.get(journal.COMMIT), int):
            entry = {k: v for k, v in line.items() if k != journal.COMMIT}
            i = line[journal.COMMIT]
            invocations[i:i + 1] = [entry]
    return {"samples": samples, "invocations": invocations}

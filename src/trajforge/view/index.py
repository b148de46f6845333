"""The viewer's index of a run directory or a JSONL file: built once, then extended as it grows.

Built by one pass over the batch files (or the one JSONL file), keeping per sample an `Entry`
(where its line is, plus the list's fields) and never a conversation. While a run is live,
`refresh()` reads each file only from where the last pass stopped (a torn last line is left for
the next pass), and reloads checkpoint.json when it changed, so a poll costs a few stat calls when
nothing happened. A file that shrank or was replaced (`--overwrite`) makes it start over.

Kept records follow the run's own merge rules (runner/merge.py), so the figures match
statistics.json: the first record of an identity wins, and a record that called a tool that does
not exist or was not offered counts as discarded (`hallucinated_tool`). Samples with no record
(failed, discarded) come from the checkpoint: checkpoint.json and its journal, read as the runner
reads them (runner.checkpoint).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from trajforge.errors import OutputError
from trajforge.runner import journal, store
from trajforge.runner.checkpoint import JOURNAL_FILE
from trajforge.runner.stats import Totals
from trajforge.tools.registry import KNOWN_TOOLS
from trajforge.view.dataset import Row, load_rows
from trajforge.view.summary import Entry, outcome_entry, summarise, used_tools

_KNOWN = frozenset(KNOWN_TOOLS)
MAX_PROBLEMS = 50


class _StartOver(Exception):
    """A file was replaced or cut: the index is rebuilt from scratch."""


def _whole(line: bytes) -> bool:
    try:
        return isinstance(orjson.loads(line), dict)
    except orjson.JSONDecodeError:
        return False


@dataclass
class _FilePos:
    inode: int
    offset: int  # bytes consumed: always at a line start
    lineno: int


class RunIndex:
    def __init__(self, source: Path) -> None:
        self.source = source
        self.run_dir = source if source.is_dir() else None
        self.files: list[Path] = []
        self._pos: dict[Path, _FilePos] = {}
        self.records: list[Entry] = []
        self.by_key: dict[str, Entry] = {}
        self.outcomes: list[Entry] = []  # samples known only from checkpoint.json
        self.totals = Totals()  # over the kept records
        self.duplicates = 0
        self.problems: list[str] = []
        self.generation = 0
        self.checkpoint: dict[str, Any] = {}
        self._ckpt_sig: tuple[object, ...] | None = None
        self._sorted: tuple[int, list[Entry]] = (-1, [])
        self.dataset: dict[str, Row] = {}  # identity -> the dataset row, when the dataset is found
        self.dataset_note: str | None = None

    def attach_dataset(self) -> None:
        """Read the run's dataset for what records and the checkpoint lack (call before refresh)."""
        if self.run_dir is not None:
            self.dataset, self.dataset_note = load_rows(self.run_dir)

    # -- sources -------------------------------------------------------------------------------
    def _sources(self) -> list[Path]:
        if self.run_dir is None:
            return [self.source]
        files = store.batch_files(self.run_dir)
        merged = self.run_dir / "trajectories.jsonl"
        return files or ([merged] if merged.exists() else [])

    def _reset(self) -> None:
        dataset, note = self.dataset, self.dataset_note
        self.__init__(self.source)  # type: ignore[misc]
        self.dataset, self.dataset_note = dataset, note

    def refresh(self) -> bool:
        """Take in what was appended since the last call; True when anything changed."""
        before = self.generation
        sources = self._sources()
        try:
            if any(p not in sources for p in self._pos):  # a file went away: the run was overwritten
                raise _StartOver
            for path in sources:
                self._read_new(path)
        except _StartOver:
            self._reset()
            self.generation = before + 1
            for path in sources:
                self._read_new(path)
        if self.run_dir is not None:
            self._load_checkpoint()
        if self.generation != before:
            self._rebuild_outcomes()
        return self.generation != before

    def _read_new(self, path: Path) -> None:
        try:
            st = path.stat()
        except FileNotFoundError:
            return
        pos = self._pos.get(path)
        if pos is not None and (pos.inode != st.st_ino or st.st_size < pos.offset):
            raise _StartOver  # replaced or truncated: what was read before may be gone
        if pos is None:
            pos = self._pos[path] = _FilePos(st.st_ino, 0, 0)
            self.files.append(path)
        if st.st_size == pos.offset:
            return
        file_id = self.files.index(path)
        start = pos.offset
        with path.open("rb") as f:
            f.seek(pos.offset)
            for line in f:
                # A last line without a newline is a line being written, unless it is a whole JSON
                # value (a file another tool wrote without a final newline): a cut-off object never is.
                if not line.endswith(b"\n") and not _whole(line):
                    break
                offset = pos.offset
                pos.offset += len(line)
                pos.lineno += 1
                if line.strip():
                    self._add_line(line, path, file_id, offset, pos.lineno)
        if pos.offset != start:
            self.generation += 1

    def _problem(self, text: str) -> None:
        if len(self.problems) < MAX_PROBLEMS:
            self.problems.append(text)

    def _add_line(self, line: bytes, path: Path, file_id: int, offset: int, lineno: int) -> None:
        try:
            rec = orjson.loads(line)
        except orjson.JSONDecodeError as e:
            self._problem(f"{path.name}:{lineno}: unreadable line ignored ({e.msg})")
            return
        if not isinstance(rec, dict):
            self._problem(f"{path.name}:{lineno}: not a JSON object, ignored")
            return
        sid = rec.get("sample_id")
        key = sid if isinstance(sid, str) and sid else f"line-{lineno}"
        if key in self.by_key:
            if self.run_dir is not None:
                self.duplicates += 1  # the merge keeps the first record of an identity
                return
            key = f"{key}@{path.name}:{lineno}"
        used = used_tools(rec)
        entry = summarise(rec, key=key, seq=len(self.records), file=file_id, offset=offset, length=len(line),
                          used=used)
        row = self.dataset.get(key)
        if row is not None:
            entry.task_type = entry.task_type or row.task_type
            if row.prompt == entry.prompt:
                entry.prompt = row.prompt  # one copy of the text in memory, not two
        stats = rec.get("tool_stats")
        if self.run_dir is not None and isinstance(stats, dict) and not stats.keys() <= _KNOWN:
            entry.status, entry.reason = "discarded", "hallucinated_tool"
            self.totals.discarded["hallucinated_tool"] += 1
        else:
            if isinstance(stats, dict) and not stats.keys() <= self.totals.tools.keys():
                for name in stats:  # statistics.json lists every tool a record names, zeros too
                    self.totals.tools.setdefault(name, [0, 0, 0])
            # Totals only needs the tools called: ~30x less work than the full normalised stats
            self.totals.add_record(rec if used is None else {**rec, "tool_stats": used})
        self.records.append(entry)
        self.by_key[key] = entry

    def _load_checkpoint(self) -> None:
        """checkpoint.json with its journal (runner.checkpoint), read again when either changed."""
        assert self.run_dir is not None
        sig = []
        for name in ("checkpoint.json", JOURNAL_FILE):
            try:
                st = (self.run_dir / name).stat()
                sig.append((st.st_mtime_ns, st.st_size))
            except FileNotFoundError:
                sig.append(None)
        if sig == [None, None] or tuple(sig) == self._ckpt_sig:
            return
        self._ckpt_sig = tuple(sig)
        self.checkpoint = read_checkpoint(self.run_dir, self._problem)
        self.generation += 1

    def _rebuild_outcomes(self) -> None:
        samples = self.checkpoint.get("samples")
        self.outcomes = []
        if not isinstance(samples, dict):
            return
        seq = len(self.records)
        for identity, info in samples.items():
            if not isinstance(info, dict) or info.get("status") not in ("failed", "discarded"):
                continue
            if identity in self.by_key:
                continue  # a later attempt finished it
            entry = outcome_entry(identity, info, seq)
            row = self.dataset.get(identity)
            if row is not None:
                entry.prompt_index, entry.task_type, entry.prompt = row.index, row.task_type, row.prompt
            self.outcomes.append(entry)
            seq += 1

    # -- reading -------------------------------------------------------------------------------
    def entries(self) -> list[Entry]:
        """Every sample, in dataset order within batches (cached until the index changes)."""
        gen, cached = self._sorted
        if gen != self.generation:
            big = 1 << 62
            if self.run_dir is None:
                cached = list(self.records)
            else:
                cached = sorted([*self.records, *self.outcomes], key=lambda e: (
                    big if e.batch is None else e.batch, big if e.prompt_index is None else e.prompt_index, e.seq))
            self._sorted = (self.generation, cached)
        return cached

    def find(self, key: str) -> Entry | None:
        e = self.by_key.get(key)
        if e is not None:
            return e
        return next((o for o in self.outcomes if o.key == key), None)

    def read_record(self, e: Entry) -> dict[str, Any] | None:
        if e.file < 0:
            return None
        with self.files[e.file].open("rb") as f:
            f.seek(e.offset)
            data = f.read(e.length)
        rec = orjson.loads(data)
        return rec if isinstance(rec, dict) else None

    def seconds(self) -> float | None:
        inv = self.checkpoint.get("invocations")
        if not isinstance(inv, list) or not inv:
            return None
        return sum(float(i.get("seconds", 0.0)) for i in inv if isinstance(i, dict))

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

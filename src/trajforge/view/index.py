"""The viewer's index of a run directory or a JSONL file: built as it is read, then extended as it grows.

One pass over the batch files (or the one JSONL file) keeps per record a few numbers in columns
(view.columns: where its line is, and the list's fields), never an object or a conversation. The
pass goes in slices of bounded time (`refresh(budget)`), so the server can answer while a big run
is still being read: the first page of a million-sample run is served after its first batch file,
and the rest comes in behind it (`behind` says how many bytes are left). While a run is live,
`refresh()` reads each file only from where the last pass stopped (a torn last line is left for
the next pass), and reloads checkpoint.json when it changed, so a poll costs a few stat calls when
nothing happened. A file that shrank or was replaced (`--overwrite`) makes it start over.

Kept records follow the run's own merge rules (runner/reporting/merge.py), so the figures match
statistics.json: the first record of an identity wins, and a record that called a tool that does
not exist or was not offered counts as discarded (`hallucinated_tool`). Samples with no record
(failed, discarded) come from the checkpoint: checkpoint.json and its journal, read as the runner
reads them (runner.state.checkpoint); the dataset (view.dataset) gives their prompts and positions, and
the task types records do not carry.
A JSONL file may also be an `openai` export: its lines are read back into the records they came
from (export.source.as_record); a line that is neither is named as a problem, never shown as an
empty conversation.
"""

from __future__ import annotations

import time
from array import array
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from trajforge.dataset import split_rollout
from trajforge.export.source import as_record
from trajforge.runner.reader import HALLUCINATED, RunLayout, Totals, key_of
from trajforge.tools.toolsets import KNOWN_TOOLS
from trajforge.view.columns import BY_ID, BY_ID_AT_LINE, BY_LINE, OUTCOME, Columns
from trajforge.view.dataset import DatasetRows, load_rows
from trajforge.view.lookup import Lookup, read_checkpoint
from trajforge.view.summary import (
    Entry,
    outcome_entry,
    summarise,
    used_tools,
)

_KNOWN = frozenset(KNOWN_TOOLS)
MAX_PROBLEMS = 50
SLICE_LINES = 256  # lines read between two looks at the clock; a slice reads at least this many


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
    file: int  # its number in RunIndex.files


class RunIndex(Lookup):
    """The index: what refresh() has read so far (Lookup answers from it)."""

    def __init__(self, source: Path) -> None:
        self.source = source
        self.run_dir = source if source.is_dir() else None
        self.layout = RunLayout(source) if self.run_dir is not None else None
        self.files: list[Path] = []
        self._pos: dict[Path, _FilePos] = {}
        self.records = Columns()
        self._taken: set[int] = set()  # keys of the records taken: the first of an identity wins
        self.outcomes: list[Entry] = []  # samples known only from checkpoint.json
        self.totals = Totals()  # over the kept records
        self.duplicates = 0
        self.problems: list[str] = []
        self.generation = 0
        self.behind = 0  # bytes of the files not read yet (a big run being indexed)
        self._lines_read = 0
        self.checkpoint: dict[str, Any] = {}
        self._ckpt_sig: tuple[object, ...] | None = None
        self._order: tuple[tuple[int, int], float, array] = ((-1, -1), 0.0, array("I"))
        self._outcomes_made = 0  # times the outcomes were made: the order holds their numbers
        self.dataset: DatasetRows | None = None
        self.dataset_note: str | None = None
        self.dataset_pending = False  # the dataset is being read (cli/view.py): figures may still change
        self._row_keys = array("Q")  # each record's row (runner.state.keys), for its task type in the dataset
        self._typed = 0  # records whose task type the dataset was asked for
        self._rows_known: dict[str, Any] = {}  # identity -> dataset row (None: not in it), of samples without a record
        self.outcomes_not_in_dataset = 0  # failed or discarded samples of rows the dataset no longer has

    def attach_dataset(self) -> None:
        """Read the run's dataset for what records and the checkpoint lack (before refresh, or at
        any time: records already indexed get their task types at the next refresh)."""
        if self.run_dir is not None:
            self.use_dataset(*load_rows(self.run_dir))

    def use_dataset(self, dataset: DatasetRows | None, note: str | None) -> None:
        self.dataset, self.dataset_note = dataset, note
        self._typed, self._rows_known = 0, {}
        self._ckpt_sig = None  # the outcomes are made again with their prompts

    def busy(self) -> bool:
        """Whether there is more to read (files, or task types of records from the dataset)."""
        ds = self.dataset
        return bool(self.behind) or (ds is not None and self._typed < len(self.records) and any(ds.rows.task_names))

    # -- sources -------------------------------------------------------------------------------
    def _sources(self) -> list[Path]:
        if self.layout is None:
            return [self.source]
        files = self.layout.batch_files()
        merged = self.layout.trajectories
        return files or ([merged] if merged.exists() else [])

    def _reset(self) -> None:
        dataset, note, pending = self.dataset, self.dataset_note, self.dataset_pending
        self.__init__(self.source)  # type: ignore[misc]
        self.dataset, self.dataset_note, self.dataset_pending = dataset, note, pending

    def refresh(self, budget: float | None = None) -> bool:
        """Take in what was appended since the last call, for at most `budget` seconds (None: all of
        it); True when anything changed. `behind` then says what is left."""
        before = self.generation
        deadline = None if budget is None else time.monotonic() + budget
        sources = self._sources()
        try:
            present = set(sources)
            if any(p not in present for p in self._pos):  # a file went away: the run was overwritten
                raise _StartOver
            self._read(sources, deadline)
        except _StartOver:
            self._reset()
            self.generation = before + 1
            self._read(sources, deadline)
        self._type_records(deadline)
        checkpoint = self.run_dir is not None and self._load_checkpoint()
        # while a big run is still being read, the outcomes (which later records may finish) wait
        if checkpoint or (self.generation != before and not self.behind):
            self._rebuild_outcomes()
        return self.generation != before

    def _read(self, sources: list[Path], deadline: float | None) -> None:
        self.behind = 0
        self._lines_read = 0
        for path in sources:
            self._read_new(path, deadline)

    def _out_of_time(self, deadline: float | None) -> bool:
        """Past the deadline, once this pass has read a slice (each call makes progress)."""
        return deadline is not None and self._lines_read >= SLICE_LINES and time.monotonic() >= deadline

    def _read_new(self, path: Path, deadline: float | None) -> None:
        try:
            st = path.stat()
        except FileNotFoundError:
            return
        pos = self._pos.get(path)
        if pos is not None and (pos.inode != st.st_ino or st.st_size < pos.offset):
            raise _StartOver  # replaced or truncated: what was read before may be gone
        if pos is None:
            pos = self._pos[path] = _FilePos(st.st_ino, 0, 0, len(self.files))
            self.files.append(path)
        if st.st_size == pos.offset:
            return
        if self._out_of_time(deadline):
            self.behind += st.st_size - pos.offset
            return
        file_id = pos.file
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
                self._lines_read += 1
                if self._lines_read % SLICE_LINES == 0 and self._out_of_time(deadline):
                    self.behind += st.st_size - pos.offset
                    break
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
        try:
            rec = as_record(rec)
        except ValueError as e:
            self._problem(f"{path.name}:{lineno}: {e}, ignored")
            return
        sid = rec.get("sample_id")
        spelled, key = (BY_ID, key_of(sid)) if isinstance(sid, str) and sid else (BY_LINE, key_of(f"line-{lineno}"))
        if key in self._taken:
            if self.run_dir is not None:
                self.duplicates += 1  # the merge keeps the first record of an identity
                return
            spelled, key = BY_ID_AT_LINE, key_of(f"{sid}@{path.name}:{lineno}")
        self._taken.add(key)
        used = used_tools(rec)
        entry = summarise(rec, key="", seq=len(self.records), file=file_id, offset=offset, length=len(line), used=used)
        stats = rec.get("tool_stats")
        if self.run_dir is not None and isinstance(stats, dict) and not stats.keys() <= _KNOWN:
            entry.status, entry.reason = "discarded", HALLUCINATED
            self.totals.discarded[HALLUCINATED] += 1
        else:
            if isinstance(stats, dict) and not stats.keys() <= self.totals.tools.keys():
                for name in stats:  # statistics.json lists every tool a record names, zeros too
                    self.totals.tools.setdefault(name, [0, 0, 0])
            # Totals only needs the tools called: ~30x less work than the full normalised stats
            self.totals.add_record(rec if used is None else {**rec, "tool_stats": used})
        self.records.add(entry, key, spelled, lineno)
        self._row_keys.append(key_of(split_rollout(sid)[0]) if spelled != BY_LINE else 0)

    def _type_records(self, deadline: float | None) -> None:
        """Records take their task type from the dataset's row (records do not carry one)."""
        ds, cols = self.dataset, self.records
        if ds is None or not any(ds.rows.task_names[1:]):
            return
        while self._typed < len(cols):
            i = self._typed
            self._typed += 1
            if self._row_keys[i] and not cols.task_type[i]:
                name = ds.task_type_by_key(self._row_keys[i], cols.prompt_index[i])
                if name is not None:
                    cols.task_type[i] = cols.task_types.number(name)
                    self.generation += 1
            if deadline is not None and i % 4096 == 4095 and time.monotonic() >= deadline:
                break

    def _load_checkpoint(self) -> bool:
        """checkpoint.json with its journal (runner.state.checkpoint), read again when either changed."""
        assert self.run_dir is not None and self.layout is not None
        sig = []
        for path in (self.layout.checkpoint, self.layout.journal):
            try:
                st = path.stat()
                sig.append((st.st_mtime_ns, st.st_size))
            except FileNotFoundError:
                sig.append(None)
        if sig == [None, None] or tuple(sig) == self._ckpt_sig:
            return False
        self._ckpt_sig = tuple(sig)
        self.checkpoint = read_checkpoint(self.run_dir, self._problem)
        self.generation += 1
        return True

    def _rebuild_outcomes(self) -> None:
        samples = self.checkpoint.get("samples")
        self.outcomes = []
        self.outcomes_not_in_dataset = 0
        self._outcomes_made += 1
        if not isinstance(samples, dict):
            return
        seq = OUTCOME
        left = {identity: info for identity, info in samples.items() if isinstance(info, dict)
                and info.get("status") in ("failed", "discarded") and key_of(identity) not in self._taken}
        unknown = [identity for identity in left if identity not in self._rows_known]
        if unknown and self.dataset is not None:  # one pass over the dataset's keys for all of them
            self._rows_known.update(dict.fromkeys(unknown))
            self._rows_known.update(self.dataset.rows_of(unknown))
        for identity, info in left.items():  # (the others: a later attempt finished them)
            row = self._rows_known.get(identity)
            if row is None and self.dataset is not None:
                # Its row was edited out of the dataset: the run no longer has this sample, and
                # statistics.json does not count it (runner.report), so neither does the page.
                self.outcomes_not_in_dataset += 1
                continue
            entry = outcome_entry(identity, info, seq)
            if row is not None:
                entry.prompt_index, entry.task_type, entry.prompt = row.index, row.task_type, row.prompt
            self.outcomes.append(entry)
            seq += 1

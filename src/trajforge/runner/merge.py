"""The whole merge: trajectories.jsonl written anew from the batch files.

Most invocations append to the file instead (runner.append); this one runs when that cannot do:
no state of an earlier merge, another dataset, another --keep, a file that is not the one the
state describes.

Exactly one line per finished sample of the current dataset (first occurrence wins), ordered by
the sample's index in it (so a reordered dataset merges in its new order), with the corrupt-entry
filter applied: a record that called a tool it was not offered is dropped and counted. Records of
samples no longer in the dataset (an edited row, a lower --max_samples) stay in their batch file
but are left out and counted, so prompt_index values never clash. What a record says of its
input row (prompt_index, dataset_line, row) is the current dataset's (`fit`).

Memory holds a few numbers per line (arrays, not objects), never the trajectories themselves, and
one row of the dataset at a time: a million-sample run merges in ~100 MB. A file that cannot be
read or written raises OutputError naming it; the previous trajectories.jsonl then stays.
"""

from __future__ import annotations

from array import array
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

import orjson

from trajforge.catalog import known_tool_set
from trajforge.errors import OutputError
from trajforge.runner import store
from trajforge.runner.keys import key_of
from trajforge.runner.outputs import open_outputs
from trajforge.runner.rows import RunRows
from trajforge.runner.stats import Totals
from trajforge.verify.result import passed, tampered


@dataclass
class MergeResult:
    written: int
    hallucinated: int
    duplicates: int
    problems: list[str]
    hallucinated_ids: list[str]  # identities whose record the corrupt-entry filter dropped
    stale: int = 0  # records of samples no longer in the dataset (left out of trajectories.jsonl)
    not_kept: int = 0  # records left out by --keep passed (counted in the statistics all the same)
    last: tuple[int, int] = (-1, 0)  # (row, rollout) of the last record written


def calls_unknown_tools(rec: dict) -> bool:
    """The corrupt-entry filter: a record that called a tool it was not offered is dropped."""
    known = known_tool_set()
    return any(name not in known for name in rec.get("tool_stats", {}))


def fit(rec: dict[str, Any], line: bytes, index: int, dataset_line: int, extra: dict[str, Any]) -> bytes:
    """The record's line, saying what the current dataset says of its row: its index (the dataset
    was reordered), line and extra fields (edited beside the ones that make its identity)."""
    if (rec.get("prompt_index"), rec.get("dataset_line"), rec.get("row")) != (index, dataset_line, extra):
        rec["prompt_index"], rec["dataset_line"], rec["row"] = index, dataset_line, extra
        return orjson.dumps(rec) + b"\n"
    return line


@dataclass
class Intake:
    """What both merges do with each record of the current dataset: the corrupt-entry filter, the
    fit to the dataset, the figures, and --keep (passed, untampered)."""

    rows: RunRows
    totals: Totals
    keep_passed: bool
    problems: list[str] = field(default_factory=list)
    keep_untampered: bool = False
    hallucinated: list[str] = field(default_factory=list)  # identities whose record the filter dropped
    not_kept: int = 0

    def take(self, line: bytes, i: int, row: tuple[int, dict[str, Any]], where: str) -> tuple[bytes, dict] | None:
        """The line to write for the record `line` of row `i` ((line, extra fields) of that row:
        `row`) and the record, or None when it is not written. `where`: the record's place, for
        a problem."""
        try:
            rec = orjson.loads(line)
        except orjson.JSONDecodeError as e:
            self.problems.append(f"{where}: corrupt record ignored: {e}")
            return None
        if calls_unknown_tools(rec):
            self.hallucinated.append(str(rec.get("sample_id")))
            self.totals.discarded["hallucinated_tool"] += 1
            return None
        line = fit(rec, line, i, *row)
        self.totals.add_record(rec, self.rows.task_type_of(i), typed=True)
        if (self.keep_passed and not passed(rec)) or (self.keep_untampered and tampered(rec)):
            self.not_kept += 1
            return None
        return line, rec


def merge(run_dir: Path, rows: RunRows, totals: Totals, *, keep_passed: bool = False,
          keep_untampered: bool = False) -> MergeResult:
    """Write run_dir/trajectories.jsonl and add every record to `totals` (kept or, with
    `keep_passed`, left out because its verification did not pass; with `keep_untampered`,
    because its agent tampered with what its tests depend on). Raises OutputError."""
    target = run_dir / "trajectories.jsonl"
    try:
        return _merge(run_dir, rows, totals, keep_passed, keep_untampered)
    except OSError as e:
        if e.filename is not None and Path(e.filename) != target and not Path(e.filename).name.startswith("."):
            raise OutputError(e.filename, e, "read") from None
        raise OutputError(target, e) from None


def _merge(run_dir: Path, rows: RunRows, totals: Totals, keep_passed: bool, keep_untampered: bool) -> MergeResult:
    problems: list[str] = []
    place = rows.places()  # key -> row * k + rollout, for every sample of the dataset
    seen: set[int] = set()
    files: list[Path] = []
    pos, fid, offsets, lengths = array("q"), array("I"), array("Q"), array("I")
    duplicates = stale = 0
    for ref in store.scan(run_dir, problems):
        key = key_of(ref.identity)
        if key in seen:
            duplicates += 1
            continue
        seen.add(key)
        at = place.get(key)
        if at is None:
            stale += 1  # finished for an earlier version of the dataset; kept in its batch file
            continue
        if not files or files[-1] != ref.path:
            files.append(ref.path)
        pos.append(at)
        fid.append(len(files) - 1)
        offsets.append(ref.offset)
        lengths.append(ref.length)
    del seen, place
    order = sorted(range(len(pos)), key=pos.__getitem__)
    written = 0
    last = (-1, 0)
    intake = Intake(rows, totals, keep_passed, problems, keep_untampered)
    with open_outputs(run_dir) as outputs, rows.reader() as dataset:  # trajectories.jsonl and the others
        lines = _read(files, ((fid[j], offsets[j], lengths[j]) for j in order))
        at, row = -1, (0, {})  # the row read last, (its line, its extra fields)
        for j, line in zip(order, lines):
            i, rollout = divmod(pos[j], rows.k)
            if at != i:
                at, row = i, rows.extra(i, dataset)  # rows come in order: each read once
            taken = intake.take(line, i, row, f"{files[fid[j]].name} at byte {offsets[j]}")
            if taken is None:
                continue
            for out in outputs:
                out.write(*taken)
            written += 1
            last = (i, rollout)
    return MergeResult(written, len(intake.hallucinated), duplicates, problems, intake.hallucinated, stale,
                       intake.not_kept, last)


def _read(files: list[Path], where: Iterable[tuple[int, int, int]]) -> Iterator[bytes]:
    """The lines at (file, offset, length) of `where`, in that order."""
    handles: dict[int, BinaryIO] = {}
    try:
        for n, offset, length in where:
            f = handles.get(n)
            if f is None:
                f = handles[n] = files[n].open("rb")
            f.seek(offset)
            yield f.read(length)
    finally:
        for f in handles.values():
            f.close()


def merge_state(result: MergeResult, totals: Totals, *, dataset: dict[str, Any], keep_passed: bool, entries: int,
                inode: int, size: int, last: tuple[int, int], out_of_order: int = 0) -> dict[str, Any]:
    """What the next merge needs to go on from this one (runner.append), kept in the checkpoint."""
    return {"dataset": dataset, "keep_passed": keep_passed, "entries": entries, "inode": inode, "size": size,
            "last": list(last), "written": result.written, "hallucinated": result.hallucinated,
            "duplicates": result.duplicates, "stale": result.stale, "not_kept": result.not_kept,
            "out_of_order": out_of_order, "totals": totals.state()}

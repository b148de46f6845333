"""The whole merge: trajectories.jsonl written anew from the batch files.

Most invocations append to the file instead (runner.reporting.append); this one runs when that cannot do:
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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from trajforge.catalog import known_tool_set
from trajforge.errors import OutputError
from trajforge.run_layout import RunLayout
from trajforge.runner.state import store
from trajforge.runner.state.keys import key_of
from trajforge.runner.reporting.outputs import open_outputs
from trajforge.runner.scheduling.rows import RunRows
from trajforge.runner.reporting.stats import Totals
from trajforge.sample.outcome import HALLUCINATED
from trajforge.verify.result import passed


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


NOT_KEPT = "not_kept"  # a record --keep passed leaves out (still counted in the statistics)


def calls_unknown_tools(rec: dict) -> bool:
    """The corrupt-entry filter: a record that called a tool it was not offered is dropped."""
    known = known_tool_set()
    return any(name not in known for name in rec.get("tool_stats", {}))


def left_out(rec: dict, keep_passed: bool) -> str | None:
    """Why trajectories.jsonl does not hold a finished record (HALLUCINATED or NOT_KEPT), None when
    it does: the filters, written once for the merges and for the outcome listeners (runner.listeners)."""
    if calls_unknown_tools(rec):
        return HALLUCINATED
    if keep_passed and not passed(rec):
        return NOT_KEPT
    return None


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
    fit to the dataset, the figures, and --keep passed."""

    rows: RunRows
    totals: Totals
    keep_passed: bool
    problems: list[str] = field(default_factory=list)
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
        why = left_out(rec, self.keep_passed)
        if why == HALLUCINATED:
            self.hallucinated.append(str(rec.get("sample_id")))
            self.totals.discarded[HALLUCINATED] += 1
            return None
        line = fit(rec, line, i, *row)
        self.totals.add_record(rec, self.rows.task_type_of(i), typed=True)
        if why == NOT_KEPT:
            self.not_kept += 1
            return None
        return line, rec


def merge(layout: RunLayout, rows: RunRows, totals: Totals, *, keep_passed: bool = False) -> MergeResult:
    """Write the run's trajectories.jsonl and add every record to `totals` (kept or, with
    `keep_passed`, left out because its verification did not pass). Raises OutputError."""
    target = layout.trajectories
    try:
        return _merge(layout, rows, totals, keep_passed)
    except OSError as e:
        if e.filename is not None and Path(e.filename) != target and not Path(e.filename).name.startswith("."):
            raise OutputError(e.filename, e, "read") from None
        raise OutputError(target, e) from None


def _merge(layout: RunLayout, rows: RunRows, totals: Totals, keep_passed: bool) -> MergeResult:
    problems: list[str] = []
    place = rows.places()  # key -> row * k + rollout, for every sample of the dataset
    seen: set[int] = set()
    pos, batch, offsets, lengths = array("q"), array("I"), array("Q"), array("I")
    duplicates = stale = 0
    for ref in store.scan(layout, problems):
        key = key_of(ref.identity)
        if key in seen:
            duplicates += 1
            continue
        seen.add(key)
        at = place.get(key)
        if at is None:
            stale += 1  # finished for an earlier version of the dataset; kept in its batch file
            continue
        pos.append(at)
        batch.append(ref.batch)
        offsets.append(ref.offset)
        lengths.append(ref.length)
    del seen, place
    order = sorted(range(len(pos)), key=pos.__getitem__)
    written = 0
    last = (-1, 0)
    intake = Intake(rows, totals, keep_passed, problems)
    with open_outputs(layout) as outputs, rows.reader() as dataset:  # trajectories.jsonl and the others
        lines = store.read_at(layout, order, lambda j: (batch[j], offsets[j], lengths[j]))
        at, row = -1, (0, {})  # the row read last, (its line, its extra fields)
        for j, line in lines:
            i, rollout = divmod(pos[j], rows.k)
            if at != i:
                at, row = i, rows.extra(i, dataset)  # rows come in order: each read once
            taken = intake.take(line, i, row, f"{layout.batch(batch[j]).name} at byte {offsets[j]}")
            if taken is None:
                continue
            for out in outputs:
                out.write(*taken)
            written += 1
            last = (i, rollout)
    return MergeResult(written, len(intake.hallucinated), duplicates, problems, intake.hallucinated, stale,
                       intake.not_kept, last)


def merge_state(result: MergeResult, totals: Totals, *, dataset: dict[str, Any], keep_passed: bool, entries: int,
                inode: int, size: int, last: tuple[int, int], out_of_order: int = 0) -> dict[str, Any]:
    """What the next merge needs to go on from this one (runner.reporting.append), kept in the checkpoint."""
    return {"dataset": dataset, "keep_passed": keep_passed, "entries": entries, "inode": inode, "size": size,
            "last": list(last), "written": result.written, "hallucinated": result.hallucinated,
            "duplicates": result.duplicates, "stale": result.stale, "not_kept": result.not_kept,
            "out_of_order": out_of_order, "totals": totals.state()}

"""The final merge: trajectories.jsonl rebuilt atomically from every batch file.

Exactly one line per finished sample of the current dataset (first occurrence wins), ordered by
the sample's index in it (so a reordered dataset merges in its new order), with the corrupt-entry
filter applied: a record that called a tool it was not offered is dropped and counted. Records of
samples no longer in the dataset (an edited row, a lower --max_samples) stay in their batch file
but are left out and counted, so prompt_index values never clash.
Memory holds one small reference per line, never the trajectories themselves. A file that cannot
be read or written raises OutputError naming it; the previous trajectories.jsonl then stays.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import orjson

from trajforge.errors import OutputError
from trajforge.dataset import split_rollout
from trajforge.runner import store
from trajforge.runner.outputs import open_outputs
from trajforge.runner.stats import Totals
from trajforge.catalog import known_tool_set
from trajforge.verify.result import passed



@dataclass
class MergeResult:
    written: int
    hallucinated: int
    duplicates: int
    problems: list[str]
    finished: set[str]  # identities with a record in the batch files
    hallucinated_ids: list[str]  # identities whose record the corrupt-entry filter dropped
    stale: int = 0  # records of samples no longer in the dataset (left out of trajectories.jsonl)
    not_kept: int = 0  # records left out by --keep passed (counted in the statistics all the same)


def merge(run_dir: Path, current_index: dict[str, int], totals: Totals,
          rows: dict[str, tuple[int, dict[str, Any]]] | None = None, *, keep_passed: bool = False) -> MergeResult:
    """Write run_dir/trajectories.jsonl and add every record to `totals` (kept or, with
    `keep_passed`, left out because its verification did not pass). Raises OutputError.

    `rows` (identity -> dataset line, extra fields) refreshes what a record says about its input
    row when the dataset was reordered or a field that is not part of the identity was edited."""
    target = run_dir / "trajectories.jsonl"
    try:
        return _merge(run_dir, current_index, totals, target, rows, keep_passed)
    except OSError as e:
        if e.filename is not None and Path(e.filename) != target and not Path(e.filename).name.startswith("."):
            raise OutputError(e.filename, e, "read") from None
        raise OutputError(target, e) from None


def calls_unknown_tools(rec: dict) -> bool:
    """The corrupt-entry filter: a record that called a tool it was not offered is dropped."""
    known = known_tool_set()
    return any(name not in known for name in rec.get("tool_stats", {}))


def _merge(run_dir: Path, current_index: dict[str, int], totals: Totals, target: Path,
           rows: dict[str, tuple[int, dict[str, Any]]] | None, keep_passed: bool) -> MergeResult:
    problems: list[str] = []
    refs: dict[str, store.LineRef] = {}
    duplicates = 0
    for ref in store.scan(run_dir, problems):
        if ref.identity in refs:
            duplicates += 1
            continue
        refs[ref.identity] = ref
    ordered = sorted(refs.values(), key=lambda r: (current_index.get(r.identity, 1 << 62), r.prompt_index,
                                                   split_rollout(r.identity)[1]))
    finished = set(refs)
    del refs
    written = stale = not_kept = 0
    hallucinated: list[str] = []
    handles: dict[Path, BinaryIO] = {}
    try:
        with open_outputs(run_dir) as outputs:  # trajectories.jsonl and any registered output
            for ref in ordered:
                f = handles.get(ref.path)
                if f is None:
                    f = handles[ref.path] = ref.path.open("rb")
                f.seek(ref.offset)
                line = f.read(ref.length)
                if ref.identity not in current_index:
                    stale += 1  # finished for an earlier version of the dataset; kept in its batch file
                    continue
                try:
                    rec = orjson.loads(line)
                except orjson.JSONDecodeError as e:
                    problems.append(f"{ref.path.name}: corrupt record of sample {ref.identity} ignored: {e}")
                    finished.discard(ref.identity)
                    continue
                if calls_unknown_tools(rec):
                    hallucinated.append(ref.identity)
                    totals.discarded["hallucinated_tool"] += 1
                    continue
                idx = current_index.get(ref.identity)
                if idx is not None and idx != rec.get("prompt_index"):
                    rec["prompt_index"] = idx  # the dataset was reordered: index in the current file
                    line = orjson.dumps(rec) + b"\n"
                row = rows.get(ref.identity) if rows is not None else None
                if row is not None and (rec.get("dataset_line"), rec.get("row")) != row:
                    rec["dataset_line"], rec["row"] = row
                    line = orjson.dumps(rec) + b"\n"
                totals.add_record(rec)
                if keep_passed and not passed(rec):
                    not_kept += 1
                    continue
                for out in outputs:
                    out.write(line, rec)
                written += 1
    finally:
        for f in handles.values():
            f.close()
    return MergeResult(written, len(hallucinated), duplicates, problems, finished, hallucinated, stale, not_kept)

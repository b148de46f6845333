"""The final merge: trajectories.jsonl from the batch files, appended to or rebuilt.

An invocation that adds a thousand samples to a run of a million must not rewrite gigabytes:
`append_new` adds the records of the samples finished since the last merge (the checkpoint's
index says where they are) to the end of trajectories.jsonl, and the run's figures continue from
those the last merge kept (its state, in the checkpoint). The file stays in dataset order while
the new samples come after those already in it; when some come before (failed samples that a
resume finished), a file under REWRITE_LIMIT is rebuilt in order, and a larger one gets them
appended at its end (statistics.json's merge.out_of_order counts them; the README says how to
get the order back). Everything else (another dataset, another --keep, no state, a file that is
not the one the state describes) takes the whole merge, `merge`:

Exactly one line per finished sample of the current dataset (first occurrence wins), ordered by
the sample's index in it (so a reordered dataset merges in its new order), with the corrupt-entry
filter applied: a record that called a tool it was not offered is dropped and counted. Records of
samples no longer in the dataset (an edited row, a lower --max_samples) stay in their batch file
but are left out and counted, so prompt_index values never clash.
Memory holds one small reference per line, never the trajectories themselves. A file that cannot
be read or written raises OutputError naming it; the previous trajectories.jsonl then stays.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import orjson

from trajforge.errors import OutputError
from trajforge.dataset import split_rollout
from trajforge.runner import store
from trajforge.runner.outputs import RUN_OUTPUTS, open_outputs
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
    last: tuple[int, int] = (-1, 0)  # (row, rollout) of the last record written


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
    last = (-1, 0)
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
                last = (current_index[ref.identity], split_rollout(ref.identity)[1])
    finally:
        for f in handles.values():
            f.close()
    return MergeResult(written, len(hallucinated), duplicates, problems, finished, hallucinated, stale, not_kept,
                       last)


# --- the incremental merge --------------------------------------------------------------------

REWRITE_LIMIT = 256 << 20  # below this size a merge that would append out of order rewrites instead


@dataclass
class Appended:
    result: MergeResult
    state: dict[str, Any]  # the new merge state (runner.checkpoint keeps it)


def append_new(run_dir: Path, state: dict[str, Any] | None, entries: Any, positions: Any, totals: Totals,
               task_type: Any, *, dataset: dict[str, Any], same_rows: bool, keep_passed: bool,
               rewrite_limit: int = REWRITE_LIMIT) -> Appended | None:
    """Add to trajectories.jsonl the records of the finished samples it lacks, without rewriting it:
    the index entries past the ones the last merge took (`entries`: the checkpoint's Finished).
    `positions(keys)` gives each key's place in the dataset ((row, rollout)), `task_type(row)` a
    row's task type; `totals` starts from the figures of the records merged before. `dataset`:
    the current dataset's identity (runner.rows); `same_rows`: whether every row of the one the
    state was merged against is at the same index in it (the same file, or rows appended).

    None when only a whole merge can do: no state of a previous one, another dataset, another
    --keep, a trajectories.jsonl that is not the one the state describes, another run output, or
    records that sort before ones already written while the file is under `rewrite_limit` (above
    it they are appended all the same, and counted as out of order). Raises OutputError."""
    target = run_dir / "trajectories.jsonl"
    if state is None or not same_rows or state.get("keep_passed") != keep_passed \
            or set(RUN_OUTPUTS) != {"trajectories.jsonl"}:
        return None
    try:
        st = target.stat()
    except OSError:
        return None
    if st.st_ino != state["inode"] or st.st_size < state["size"] or state["entries"] > len(entries):
        return None
    totals.load_state(state["totals"])
    new = range(state["entries"], len(entries))
    where = positions({entries.keys[j] for j in new})
    problems: list[str] = []
    hallucinated: list[str] = []
    kept: list[tuple[tuple[int, int], int]] = []  # (place in the dataset, entry): lines are read again to write
    stale = not_kept = 0
    try:
        for j, line in _read_entries(run_dir, entries, new):
            pos = where.get(entries.keys[j])
            if pos is None:
                stale += 1
                continue
            try:
                rec = orjson.loads(line)
            except orjson.JSONDecodeError as e:
                problems.append(f"corrupt record ignored: {e}")
                continue
            if calls_unknown_tools(rec):
                hallucinated.append(str(rec.get("sample_id")))
                totals.discarded["hallucinated_tool"] += 1
                continue
            totals.verify.task_types[split_rollout(str(rec.get("sample_id")))[0]] = task_type(pos[0])
            totals.add_record(rec)
            if keep_passed and not passed(rec):
                not_kept += 1
                continue
            kept.append((pos, j))
    except OSError as e:
        raise OutputError(e.filename or target, e, "read") from None
    kept.sort()
    last = tuple(state["last"])
    late = sum(1 for pos, _ in kept if pos < last)
    if late and state["size"] < rewrite_limit:
        return None
    size = _append(target, state["size"], (line for _, line in _read_entries(run_dir, entries, [j for _, j in kept])))
    totals.verify.not_kept = state["not_kept"] + not_kept
    result = MergeResult(state["written"] + len(kept), state["hallucinated"] + len(hallucinated),
                         state["duplicates"], problems, set(), hallucinated, state["stale"] + stale,
                         totals.verify.not_kept)
    new_state = merge_state(result, totals, dataset=dataset, keep_passed=keep_passed, entries=len(entries),
                            inode=st.st_ino, size=size, last=max([last, *(pos for pos, _ in kept)]),
                            out_of_order=state.get("out_of_order", 0) + late)
    return Appended(result, new_state)


def merge_state(result: MergeResult, totals: Totals, *, dataset: dict[str, Any], keep_passed: bool, entries: int,
                inode: int, size: int, last: tuple[int, int], out_of_order: int = 0) -> dict[str, Any]:
    return {"dataset": dataset, "keep_passed": keep_passed, "entries": entries, "inode": inode, "size": size,
            "last": list(last), "written": result.written, "hallucinated": result.hallucinated,
            "duplicates": result.duplicates, "stale": result.stale, "not_kept": result.not_kept,
            "out_of_order": out_of_order, "totals": totals.state()}


def _append(target: Path, size: int, lines: Iterable[bytes]) -> int:
    """Append `lines` to `target` from byte `size` on (what a merge killed before its state was
    saved appended goes first), fsynced; the new size. On an error the file is cut back to `size`,
    as it was, and OutputError raised."""
    try:
        with target.open("r+b", buffering=0) as f:
            f.truncate(size)
            f.seek(size)
            try:
                chunk: list[bytes] = []
                held = 0
                for line in lines:
                    chunk.append(line)
                    held += len(line)
                    if held >= 1 << 20:
                        _write_all(f, b"".join(chunk))
                        chunk, held = [], 0
                _write_all(f, b"".join(chunk))
                os.fsync(f.fileno())
            except BaseException:
                f.truncate(size)
                raise
            return f.tell()
    except OSError as e:
        raise OutputError(e.filename or target, e, "read" if e.filename else "write") from None


def _write_all(f: BinaryIO, data: bytes) -> None:
    view = memoryview(data)
    while view:  # unbuffered: repeated only if the kernel took part of it
        view = view[f.write(view):]


def _read_entries(run_dir: Path, entries: Any, which: Iterable[int]) -> Iterator[tuple[int, bytes]]:
    handles: dict[int, BinaryIO] = {}
    try:
        for j in which:
            batch, offset, length = entries.location(j)
            f = handles.get(batch)
            if f is None:
                f = handles[batch] = (run_dir / f"batch_{batch}.jsonl").open("rb")
            f.seek(offset)
            yield j, f.read(length)
    finally:
        for f in handles.values():
            f.close()

"""The incremental merge: trajectories.jsonl appended to, never rewritten, for what finished since.

An invocation that adds a thousand samples to a run of a million must not rewrite gigabytes:
`append_new` adds the records of the samples finished since the last merge (the checkpoint's
index, runner.state.finished, says where they are, in the order they finished) to the end of
trajectories.jsonl, and the run's figures go on from those the last merge kept (its state, in the
checkpoint). The file stays in dataset order while the new samples come after those already in
it; when some come before (failed samples that a resume finished), a file under REWRITE_LIMIT is
written anew in order instead, and a larger one gets them appended at its end (statistics.json's
merge.out_of_order counts them; docs/user-guide.md, "Output", says how to get the order back).

Crash safety: the append starts at the size the saved state names (cutting what a merge killed
before its state was saved appended), is fsynced, and is cut back when it fails (disk full), so
the file is always the state's, or the state's plus whole records that the next merge cuts and
writes again. Readers of the file may see a last line being written.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

from trajforge.errors import OutputError
from trajforge.run_layout import RunLayout
from trajforge.runner.state import store
from trajforge.runner.state.finished import Finished
from trajforge.runner.reporting.merge import Intake, MergeResult, merge_state
from trajforge.runner.reporting.outputs import RUN_OUTPUTS
from trajforge.runner.scheduling.rows import RunRows
from trajforge.runner.reporting.stats import Totals

REWRITE_LIMIT = 256 << 20  # below this size a merge that would append out of order rewrites instead


@dataclass
class Appended:
    result: MergeResult
    state: dict[str, Any]  # the new merge state (runner.state.checkpoint keeps it)


def append_new(layout: RunLayout, state: dict[str, Any] | None, entries: Finished, rows: RunRows, totals: Totals, *,
               keep_passed: bool, rewrite_limit: int = REWRITE_LIMIT) -> Appended | None:
    """Add to trajectories.jsonl the records of the index entries past the ones the last merge
    took (`entries`: the checkpoint's Finished); `totals` goes on from the figures of the records
    merged before.

    None when only a whole merge can do: no state of a previous one, a dataset whose rows are not
    those of the one merged before (the same file, or one with rows appended, is), tasks (a few
    hundred: their figures are not kept from one merge to the next), another
    --keep, a trajectories.jsonl that is not the one the state describes, another run output, or
    records that sort before ones already written while the file is under `rewrite_limit`.
    Raises OutputError."""
    target = layout.trajectories
    if state is None or rows.kept is not None or not rows.extends(state.get("dataset")) \
            or state.get("keep_passed") != keep_passed or set(RUN_OUTPUTS) != {target.name}:
        return None
    try:
        st = target.stat()
    except OSError:
        return None
    if st.st_ino != state["inode"] or st.st_size < state["size"] or state["entries"] > len(entries):
        return None
    totals.load_state(state["totals"])
    new = range(state["entries"], len(entries))
    where = rows.positions({entries.keys[j] for j in new})
    kept: list[tuple[tuple[int, int], int, bytes | None]] = []  # (place, entry, the line when fit changed it)
    stale = 0
    intake = Intake(rows, totals, keep_passed)
    try:
        with rows.reader() as dataset:
            extras: dict[int, tuple[int, dict[str, Any]]] = {}
            for j, line in store.read_at(layout, new, entries.location):
                pos = where.get(entries.keys[j])
                if pos is None:
                    stale += 1
                    continue
                i = pos[0]
                row = extras.get(i) or extras.setdefault(i, rows.extra(i, dataset))
                taken = intake.take(line, i, row, f"entry {j} of {layout.finished_index.name}")
                if taken is not None:
                    kept.append((pos, j, None if taken[0] is line else taken[0]))
    except OSError as e:
        raise OutputError(e.filename or target, e, "read") from None
    kept.sort(key=lambda x: x[:2])
    last = tuple(state["last"])
    late = sum(1 for pos, _, _ in kept if pos < last)
    if late and state["size"] < rewrite_limit:
        return None
    size = _append(target, state["size"], _lines(layout, entries, kept))
    totals.verify.not_kept = state["not_kept"] + intake.not_kept
    result = MergeResult(state["written"] + len(kept), state["hallucinated"] + len(intake.hallucinated),
                         state["duplicates"], intake.problems, intake.hallucinated, state["stale"] + stale,
                         totals.verify.not_kept)
    new_state = merge_state(result, totals, dataset=rows.identity(), keep_passed=keep_passed, entries=len(entries),
                            inode=st.st_ino, size=size, last=max([last, *(pos for pos, _, _ in kept)]),
                            out_of_order=state.get("out_of_order", 0) + late)
    return Appended(result, new_state)


def _append(target: Path, size: int, lines: Iterable[bytes]) -> int:
    """Append `lines` to `target` from byte `size` on, fsynced; the new size. On an error the file
    is cut back to `size`, as it was, and OutputError raised."""
    try:
        with target.open("r+b", buffering=0) as f:
            f.truncate(size)  # what a merge killed before its state was saved appended goes first
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
    except OSError as e:  # a batch file read again, or trajectories.jsonl written
        read = e.filename is not None and Path(e.filename) != target
        raise OutputError(e.filename if read else target, e, "read" if read else "write") from None


def _write_all(f: BinaryIO, data: bytes) -> None:
    view = memoryview(data)
    while view:  # unbuffered: repeated only if the kernel took part of it
        view = view[f.write(view):]


def _lines(layout: RunLayout, entries: Finished, kept: list[tuple[tuple[int, int], int, bytes | None]]
           ) -> Iterator[bytes]:
    """The lines to append, in `kept`'s order: read again from the batch files, one at a time."""
    raw = store.read_at(layout, (j for _, j, fitted in kept if fitted is None), entries.location)
    for _, _, fitted in kept:
        yield next(raw)[1] if fitted is None else fitted

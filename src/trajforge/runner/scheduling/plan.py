"""Resume planning: what is finished, what the batch files hold that the checkpoint lacks, what
is left to run.

The checkpoint (runner.state.checkpoint) knows where every record it saved is and how far into each
batch file that goes, so only what lies beyond (the records a killed invocation wrote after its
last save) is read and parsed; a million finished samples cost a set lookup each, never a parse.
The checkpoint never vouches for a record that is gone: a batch file shorter than the checkpoint
knows it, or missing, is read whole, and its samples with no record left run again. Without a
usable index (a checkpoint of version 1, none at all, an index its snapshot does not vouch for)
every batch file is read whole, as before, and the index is rebuilt from it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from trajforge.run_layout import batch_number
from trajforge.runner.state import recovery, store
from trajforge.runner.state.checkpoint import Checkpoint
from trajforge.runner.state.keys import key_of
from trajforge.runner.scheduling.rows import RunRows, Todo


@dataclass
class Plan:
    todo: Todo
    restored: recovery.Restored
    recovered: int  # samples the checkpoint called finished whose record is gone or unreadable
    problems: list[str] = field(default_factory=list)


def plan(rows: RunRows, checkpoint: Checkpoint) -> Plan:
    """The samples still to run: those with no readable record in a batch file and not discarded
    before (failed ones are retried). Records the checkpoint lacks are put back into it
    (runner.state.recovery), with their spend. bench/resume_plan.py and bench/scale.py time this."""
    problems: list[str] = []
    unreadable: set[str] = set()
    unsaved: list[store.LineRef] = []
    lost: set[int] = set()
    if checkpoint.needs_scan:
        _scan_all(checkpoint, problems, unreadable, unsaved, lost)
    else:
        _scan_tails(checkpoint, problems, unreadable, unsaved, lost)
    restored = recovery.restore(checkpoint, unsaved)
    unreadable_keys = {key_of(i) for i in unreadable}
    discarded = {key_of(i) for i in checkpoint.discarded()}
    done = checkpoint.done
    todo = rows.todo(done, discarded)
    gone = lost | unreadable_keys
    recovered = [i for i, r in todo.at if _key(rows, i, r) in gone] if gone else []
    if unreadable:
        checkpoint.forget(sorted(unreadable))
    return Plan(todo, restored, len(recovered), problems)


def _key(rows: RunRows, i: int, r: int) -> int:
    from trajforge.runner.state.keys import rollout_key

    return rollout_key(rows.keys[i], r)


def _scan_all(checkpoint: Checkpoint, problems: list[str], unreadable: set[str], unsaved: list[store.LineRef],
              lost: set[int]) -> None:
    """Every batch file read whole: the index is rebuilt from what they hold."""
    said_done = set(checkpoint.legacy_done)
    for path in checkpoint.layout.batch_files():
        batch = batch_number(path)
        end = 0
        for ref in store.scan_file(path, 0, problems, unreadable):
            end = ref.offset + ref.length
            if key_of(ref.identity) in checkpoint.done:
                continue  # a later record of a finished sample: the merge keeps the first
            if checkpoint.version < 2 and recovery.unsaved(checkpoint, ref.identity):
                unsaved.append(ref)  # a version 2 snapshot whose index is unusable saved them all
            else:
                checkpoint.finished(ref.identity, batch, ref.offset, ref.length, log=False)
        checkpoint.scanned(batch, end)
    gone = [i for i in said_done if key_of(i) not in checkpoint.done]
    lost.update(key_of(i) for i in gone)
    checkpoint.forget(gone)
    checkpoint.needs_scan = True  # the rebuilt index is saved whole by the next compaction


def _scan_tails(checkpoint: Checkpoint, problems: list[str], unreadable: set[str], unsaved: list[store.LineRef],
                lost: set[int]) -> None:
    """Only what each batch file holds past what the checkpoint knows. A file that shrank (a line
    cut or removed by hand) or went away is read whole: its index entries are made anew from the
    records it still holds, and its samples without one are forgotten (they run again)."""
    files = {batch_number(p): p for p in checkpoint.layout.batch_files()}
    done = checkpoint.done
    shrunk = {b for b, known in checkpoint.extents.items()
              if known and (b not in files or _size(files[b]) < known)}
    before: set[int] = set()
    if shrunk:
        before = {k for i, k in enumerate(done.keys) if done.location(i)[0] in shrunk}
        checkpoint.forget_keys(before)
        for batch in shrunk:
            checkpoint.extents.pop(batch, None)
    for batch, path in files.items():
        end = start = checkpoint.extents.get(batch, 0)
        for ref in store.scan_file(path, start, problems, unreadable):
            end = ref.offset + ref.length
            key = key_of(ref.identity)
            if key in done:
                continue
            if key in before:
                checkpoint.finished(ref.identity, batch, ref.offset, ref.length)  # the same record, moved
            elif recovery.unsaved(checkpoint, ref.identity):
                unsaved.append(ref)
        checkpoint.scanned(batch, end)
    lost.update(k for k in before if k not in done)


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0

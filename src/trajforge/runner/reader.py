"""A run directory read, never written: the one door into a run for view/, export/ and the tests.

The viewer, the exporter and the tests' helpers take what they read of a run from here and import
nothing else of the runner (tests/test_architecture.py checks it), so the way the runner keeps
its bookkeeping can change without them. A `RunReader` reads the run's records
(trajectories.jsonl, or the batch files the way the merge takes them), its bookkeeping as the
runner itself loads it (runner.state.checkpoint: the snapshot, its index and its journal, replayed by
the one replay there is), its configuration and statistics, its dataset's rows (with the run's own
rows.idx) and whether a process runs it now. Nothing here writes or locks: reading a live run
never gets in its way.

The module also hands on what readers compute the way the runner does: sample keys (`key_of`),
the figures (`Totals`, `run_pace`), the settings' history (`history`) and the discard reason of a
record that called a tool it was not offered (`HALLUCINATED`).
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson

from trajforge.run_layout import RunLayout
from trajforge.runner.state import store

if TYPE_CHECKING:
    from trajforge.config import RunConfig
    from trajforge.runner.state.checkpoint import Checkpoint
    from trajforge.runner.state.checkpoint_file import InvocationEntry, SampleEntry
    from trajforge.runner.scheduling.rows import RunRows

# What readers compute as the runner does, imported when first asked for (`trajforge export` of
# a file needs none of it, and a reader should start fast).
_HANDED_ON = {"InvocationEntry": "trajforge.runner.state.checkpoint_file",
              "SampleEntry": "trajforge.runner.state.checkpoint_file", "RunRows": "trajforge.runner.scheduling.rows",
              "Totals": "trajforge.runner.reporting.stats", "run_pace": "trajforge.runner.reporting.stats",
              "history": "trajforge.runner.reporting.settings", "key_of": "trajforge.runner.state.keys",
              "HALLUCINATED": "trajforge.sample.outcome"}
__all__ = ["RunLayout", "RunReader", "RunState", *_HANDED_ON]


def __getattr__(name: str) -> Any:
    if name in _HANDED_ON:
        return getattr(importlib.import_module(_HANDED_ON[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


@dataclass(frozen=True)
class RunState:
    """The run's bookkeeping as the runner loads it, to read."""

    samples: Mapping[str, SampleEntry]  # failed and discarded samples, by identity
    invocations: Sequence[InvocationEntry]
    finished: int  # samples known to be finished (with the index: all of them)
    version: int  # of checkpoint.json (0: none)


class RunReader:
    def __init__(self, root: Path) -> None:
        self.layout = RunLayout(root)

    def records(self) -> Iterator[dict[str, Any]]:
        """trajectories.jsonl's records, in its order (none when there is no such file)."""
        for line in self.lines():
            yield orjson.loads(line)

    def lines(self) -> list[bytes]:
        """trajectories.jsonl's lines, as saved (none when there is no such file)."""
        try:
            return self.layout.trajectories.read_bytes().splitlines(keepends=True)
        except FileNotFoundError:
            return []

    def batch_records(self) -> Iterator[dict[str, Any]]:
        """Every record of the batch files the merge would take: the first whole record of each
        sample, in the files' order (records the merge's filters drop included)."""
        seen: set[str] = set()
        firsts = (ref for ref in store.scan(self.layout) if not (ref.identity in seen or seen.add(ref.identity)))
        for _, line in store.read_at(self.layout, firsts, store.LineRef.location):
            yield orjson.loads(line)

    def state(self, *, index: bool = True) -> RunState:
        """The bookkeeping (runner.state.checkpoint). Without `index`, its finished samples are only
        those the journal added since the last snapshot (a million-sample run's index is not
        read). Raises RunStateError when the runner would refuse it."""
        ckpt = self._checkpoint(index)
        return RunState(dict(ckpt.samples), list(ckpt.invocations), len(ckpt.done) + len(ckpt.legacy_done),
                        ckpt.version)

    def outcomes(self) -> dict[str, SampleEntry]:
        """identity -> outcome of every sample that has one: finished ones (their identity read
        from their record; batch -1 for a version 1 checkpoint's), failed and discarded ones (a
        finished record that the merge dropped is discarded, not done)."""
        from trajforge.runner.state.checkpoint_file import SampleEntry

        ckpt = self._checkpoint(True)
        where = (ckpt.done.location(i) for i in range(len(ckpt.done)))
        out = {orjson.loads(line)["sample_id"]: SampleEntry(status="done", batch=at[0])
               for at, line in store.read_at(self.layout, where, lambda at: at)}
        out.update(dict.fromkeys(ckpt.legacy_done, SampleEntry(status="done", batch=-1)))
        out.update(ckpt.samples)
        return out

    def _checkpoint(self, index: bool) -> Checkpoint:
        from trajforge.runner.state.checkpoint import Checkpoint

        return Checkpoint.load(self.layout, self.layout.root.name, index=index)

    def statuses(self) -> dict[str, str]:
        return {k: e.status for k, e in self.outcomes().items()}

    def config(self) -> dict[str, Any]:
        """config.json ({} when it is missing or not a JSON object)."""
        return _json(self.layout.config)

    def statistics(self) -> dict[str, Any]:
        """statistics.json ({} when it is missing or not a JSON object)."""
        return _json(self.layout.statistics)

    def rows(self, config: RunConfig) -> RunRows:
        """The dataset `config` names, as the runner holds it, taken from the run's rows.idx when
        the file still begins with the bytes it came from. Raises DatasetError."""
        from trajforge.runner.scheduling.rows import RunRows

        return RunRows.read(config, self.layout.rows_cache)

    def live(self) -> bool:
        """Whether a process holds the run's lock (read from /proc/locks, so the reader never takes
        the lock itself and cannot get in a starting run's way)."""
        return lock_held(self.layout.lock)


def _json(path: Path) -> dict[str, Any]:
    try:
        data = orjson.loads(path.read_bytes())
    except (OSError, orjson.JSONDecodeError):
        return {}
    return data if isinstance(data, dict) else {}


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

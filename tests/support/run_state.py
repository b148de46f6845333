"""What a run directory says of its samples, read the way the runner reads it (runner.reader).

The tests' one reader of a run: its records (trajectories.jsonl, or the batch files as the merge
takes them), each sample's outcome and the bookkeeping (checkpoint.json with its index and
journal), all through `RunReader`, as the viewer and the exporter read a run.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from trajforge.runner.reader import RunReader, RunState, SampleEntry


def read_records(run: Path) -> list[dict[str, Any]]:
    """trajectories.jsonl's records, in order."""
    return list(RunReader(run).records())


def read_batch_records(run: Path) -> list[dict[str, Any]]:
    """The first whole record of each sample in the batch files."""
    return list(RunReader(run).batch_records())


def state(run: Path) -> RunState:
    return RunReader(run).state()


def outcomes(run: Path) -> dict[str, SampleEntry]:
    """identity -> entry of every sample with an outcome: done ones (batch from the index), failed
    and discarded ones."""
    return RunReader(run).outcomes()


def statuses(run: Path) -> dict[str, str]:
    return RunReader(run).statuses()

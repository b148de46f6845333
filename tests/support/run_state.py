"""What a run directory's bookkeeping says of each sample, read the way the runner reads it.

checkpoint.json is a snapshot; finished.idx and journal.jsonl hold the rest (runner.checkpoint),
and finished samples are known there by key only, so their identities come from the records the
index points at.
"""

from __future__ import annotations

from pathlib import Path

import orjson

from trajforge.runner.checkpoint import Checkpoint
from trajforge.runner.checkpoint_file import SampleEntry


def state(run: Path) -> Checkpoint:
    return Checkpoint.load(run / "checkpoint.json", run.name)


def outcomes(run: Path) -> dict[str, SampleEntry]:
    """identity -> entry of every sample with an outcome: done ones (batch from the index), failed
    and discarded ones."""
    ckpt = state(run)
    out: dict[str, SampleEntry] = {}
    for i in range(len(ckpt.done)):
        batch, offset, length = ckpt.done.location(i)
        with (run / f"batch_{batch}.jsonl").open("rb") as f:
            f.seek(offset)
            rec = orjson.loads(f.read(length))
        out[rec["sample_id"]] = SampleEntry(status="done", batch=batch)
    for identity in ckpt.legacy_done:
        out[identity] = SampleEntry(status="done", batch=-1)
    out.update(ckpt.samples)  # a discarded record (hallucinated tool) is discarded, not done
    return out


def statuses(run: Path) -> dict[str, str]:
    return {k: e.status for k, e in outcomes(run).items()}

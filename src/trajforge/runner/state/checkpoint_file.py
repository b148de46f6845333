"""The shape of a run's checkpoint.json (runner.state.checkpoint reads and writes it).

Every model allows fields it does not know (written by another version) and writes them back as
they were. A version 1 file listed every sample, finished ones too: `plain_done` takes those out
before validation, as a set of identities.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, model_validator

VERSION = 2


class _Entry(BaseModel):
    # extra="allow": fields written by another version (or another helper) are kept, and written
    # back as they were; only the fields a file holds, or that were set here, are written.
    model_config = ConfigDict(extra="allow", strict=True)


class SampleUsage(_Entry):
    """Tokens and USD of a discarded sample (a kept one has them in its record)."""

    prompt_tokens: int = 0
    completion_tokens: int = 0
    reasoning_tokens: int = 0
    cost: float = 0.0


class SampleEntry(_Entry):
    status: Literal["done", "discarded", "failed"]
    batch: int
    attempts: int = 1
    reason: str | None = None  # discard reason or failure class
    message: str | None = None  # a failure's detail, cut to 500 characters
    usage: SampleUsage | None = None
    api_calls: int = 0


class InvocationEntry(_Entry):
    started: float  # wall-clock time
    seconds: float = 0.0
    ran: int = 0  # samples it ended (kept up to date at every save, so a killed one says how many)
    interrupted: bool = False
    spent: float = 0.0  # USD (runner.scheduling.budget), the next invocation's prior spend
    spent_samples: int = 0  # samples whose spend that is
    # USD each sample in flight at the last save had spent on its current attempt, included in
    # `spent`: if the run is killed before the next save, its record also holds it (runner.state.recovery)
    in_flight: dict[str, float] = {}
    # Spend of samples an earlier, killed invocation finished after its last save, found in the
    # batch files when this one started (runner.state.recovery); part of the run's spend like `spent`
    recovered_spent: float = 0.0
    recovered_samples: int = 0
    # The model and the settings that shape its samples (runner.reporting.settings), and the dataset rows
    # --skip_invalid left out; written by invocations since version 2
    model: str | None = None
    settings: dict[str, Any] | None = None
    skipped_invalid: int | None = None


class IndexRef(_Entry):
    token: str
    entries: int


class CheckpointFile(_Entry):
    version: Literal[1, 2]
    run_name: str = ""
    updated: float | None = None
    journal: int = 0  # the generation of journal.jsonl that continues this snapshot
    finished: IndexRef | None = None  # the entries of finished.idx this snapshot vouches for
    extents: dict[str, int] = {}  # batch number -> bytes of its file whose records are all known
    samples: dict[str, SampleEntry] = {}  # version 2: failed and discarded samples only
    invocations: list[InvocationEntry] = []
    merge: dict[str, Any] | None = None  # runner.reporting.merge's state

    @model_validator(mode="after")
    def _whole(self) -> CheckpointFile:
        """Every writer of a version wrote these keys: a file without one (`{"version": 2}` alone, a
        hand-edited or half-copied one) is not a checkpoint, and used as one it would lose the
        run's failed and discarded samples and its spend without a word."""
        missing = [k for k in WRITTEN[self.version] if k not in self.model_fields_set]
        if missing:
            raise ValueError(f"no {', '.join(repr(k) for k in missing)}: every checkpoint.json of version "
                             f"{self.version} has {'them' if len(missing) > 1 else 'it'}")
        return self


# The keys every writer of each version wrote (runner.checkpoint's compact, for version 2).
WRITTEN: dict[int, tuple[str, ...]] = {
    1: ("samples", "invocations"),
    2: ("run_name", "journal", "finished", "extents", "samples", "invocations"),
}


def plain_done(data: Any) -> set[str]:
    """The done samples of a version 1 checkpoint whose entry holds nothing but what version 1
    wrote, taken out of `data` before it is validated: a million of them as pydantic models
    took ~600 MB for a set of identities."""
    samples = data.get("samples") if isinstance(data, dict) and data.get("version") == 1 else None
    if not isinstance(samples, dict):
        return set()
    done = {k for k, e in samples.items() if isinstance(e, dict) and e.get("status") == "done"
            and type(e.get("batch")) is int and type(e.get("attempts", 1)) is int and e.keys() <= _V1_DONE}
    for k in done:
        del samples[k]
    return done


_V1_DONE = {"status", "batch", "attempts"}

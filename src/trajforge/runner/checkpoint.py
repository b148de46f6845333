"""checkpoint.json: the outcome of every finished sample, and the history of invocations.

Batch files are the source of truth for kept trajectories; the checkpoint adds what they cannot
say: discarded samples (final, never re-run) and failed ones (retried on resume), plus each
invocation's duration and spend for cumulative statistics and the budget. It is replaced
atomically, at most about once a second while samples finish or spend grows (the interval grows
with the file's size) and always at the end. A run killed between two saves leaves records the
file lacks; the next start puts them back (runner.recovery).
A file read back is validated as a whole (`CheckpointFile`): one of the wrong shape is refused
like an unparsable one, with the file named, never half-used. The validated models are the
in-memory state too (SampleEntry, InvocationEntry), turned back into JSON only when saved.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import orjson
from pydantic import BaseModel, ConfigDict, ValidationError

from trajforge.errors import OutputError, RunStateError
from trajforge.jsonio import atomic_write_bytes
from trajforge.redact import REGISTRY
from trajforge.sample.outcome import Outcome

VERSION = 1


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
    ran: int = 0  # samples it ended
    interrupted: bool = False
    spent: float = 0.0  # USD (runner.budget), the next invocation's prior spend
    spent_samples: int = 0  # samples whose spend that is
    # USD each sample in flight at the last save had spent on its current attempt, included in
    # `spent`: if the run is killed before the next save, its record also holds it (runner.recovery)
    in_flight: dict[str, float] = {}
    # Spend of samples an earlier, killed invocation finished after its last save, found in the
    # batch files when this one started (runner.recovery); part of the run's spend like `spent`
    recovered_spent: float = 0.0
    recovered_samples: int = 0


class CheckpointFile(_Entry):
    version: Literal[1]
    run_name: str = ""
    updated: float | None = None
    samples: dict[str, SampleEntry] = {}
    invocations: list[InvocationEntry] = []


@dataclass
class Checkpoint:
    path: Path
    run_name: str
    samples: dict[str, SampleEntry] = field(default_factory=dict)  # by sample identity
    invocations: list[InvocationEntry] = field(default_factory=list)
    _last_save: float = 0.0
    _save_cost: float = 0.0
    _dirty: bool = False
    _current: InvocationEntry | None = None
    _invocation_t0: float = 0.0

    @classmethod
    def load(cls, path: Path, run_name: str) -> Checkpoint:
        """The checkpoint at `path` (empty when there is none). Raises RunStateError when the file
        cannot be read or is not a checkpoint as a whole."""
        if not path.exists():
            return cls(path, run_name)
        way_out = "move it away to rebuild it from the batch files, then run again with --resume"
        try:
            data = orjson.loads(path.read_bytes())
        except (OSError, orjson.JSONDecodeError) as e:
            raise RunStateError(f"{path}: checkpoint is unreadable ({e}); {way_out}") from None
        try:
            file = CheckpointFile.model_validate(data)
        except ValidationError as e:
            first = e.errors()[0]
            where = ".".join(str(p) for p in first["loc"]) or "top level"
            raise RunStateError(f"{path}: not a trajforge checkpoint (at {where}: {first['msg']}); {way_out}") from None
        return cls(path, run_name, file.samples, file.invocations)

    def status(self, identity: str) -> str | None:
        """The recorded status of a sample (done, discarded, failed), None when it has none."""
        entry = self.samples.get(identity)
        return None if entry is None else entry.status

    def discarded(self) -> set[str]:
        """Discarded samples are final: never run again (batch files tell what else is finished)."""
        return {k for k, v in self.samples.items() if v.status == "discarded"}

    def forget(self, identities: list[str]) -> None:
        """Drop entries that vouch for records the batch files no longer hold: the samples run again
        and their new outcome, even a failure, is what counts."""
        for identity in identities:
            if self.samples.pop(identity, None) is not None:
                self._dirty = True

    def mark_discarded(self, identity: str, reason: str) -> None:
        """A kept record that the final merge filters out (e.g. a hallucinated tool) is discarded."""
        entry = self.samples.get(identity)
        if entry is not None and (entry.status, entry.reason) != ("discarded", reason):
            entry.status, entry.reason = "discarded", reason
            self._dirty = True

    def changed(self) -> None:
        """Something held outside the sample entries (an invocation's spend) changed: save it next."""
        self._dirty = True

    def restore(self, identity: str, entry: SampleEntry) -> None:
        """Put back the entry of a sample whose record an invocation wrote but ended (killed, disk
        full) before saving here (runner.recovery)."""
        self.samples[identity] = entry
        self._dirty = True

    def record(self, o: Outcome) -> None:
        prev = self.samples.get(o.identity)
        if prev is not None and prev.status != "failed" and o.status == "failed":
            return  # a finished sample never becomes failed again
        entry = SampleEntry(status=o.status, batch=o.batch_num, attempts=o.attempts)
        if o.reason:
            entry.reason = o.reason
        if o.status == "failed" and o.message:
            entry.message = o.message[:500]
        if o.usage:
            entry.usage, entry.api_calls = SampleUsage.model_validate(o.usage), o.api_calls
        self.samples[o.identity] = entry
        self._dirty = True

    def begin_invocation(self, started_wall: float) -> InvocationEntry:
        """Record this invocation now, so its duration counts even if the process is killed."""
        entry = InvocationEntry(started=started_wall, seconds=0.0, ran=0, interrupted=False)
        self.invocations.append(entry)
        self._invocation_t0 = time.monotonic()
        self._current = entry
        return entry

    def save(self, *, force: bool = False) -> None:
        now = time.monotonic()
        if self._current is not None:
            self._current.seconds = round(now - self._invocation_t0, 3)
        if not force and (not self._dirty or now - self._last_save < max(1.0, 20 * self._save_cost)):
            return
        t0 = time.perf_counter()
        # model_construct: every part is typed already; what was set (or read) is what is written.
        body = CheckpointFile.model_construct(version=VERSION, run_name=self.run_name, updated=time.time(),
                                              samples=self.samples, invocations=self.invocations)
        try:
            atomic_write_bytes(self.path, REGISTRY.bytes(body.model_dump_json(exclude_unset=True).encode()))
        except OSError as e:
            raise OutputError(self.path, e) from None
        self._save_cost = time.perf_counter() - t0
        self._last_save = time.monotonic()
        self._dirty = False

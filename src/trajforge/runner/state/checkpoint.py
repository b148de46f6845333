"""The run's own bookkeeping: outcomes of samples, where finished records are, the invocations.

Batch files are the source of truth for kept trajectories; the checkpoint adds what they cannot
say: discarded samples (final, never re-run) and failed ones (retried on resume), plus each
invocation's settings, duration and spend for cumulative statistics and the budget, and the
state of the incremental merge (runner.reporting.merge). Three files hold it, each read as a whole:

- checkpoint.json: a snapshot (version 2): failed and discarded samples, invocations, the merge
  state, how far each batch file is known, and how many entries of finished.idx it vouches for.
- finished.idx (runner.state.finished): the location of every finished sample's record, 24 bytes each.
- journal.jsonl (runner.state.journal): what changed since the snapshot, appended as committed groups
  at most about once a second while samples finish or spend grows, and at the end.

So a save costs what changed, not the size of the run. `compact` folds the journal into a new
snapshot (at the start and end of every invocation, and when the journal grows past a few MB).
A run killed between two saves leaves records that neither file knows; the next start puts them
back (runner.state.recovery). A checkpoint.json of version 1 (every sample listed, done ones too) is read
as before and converted at the start of the next invocation. A file read back is validated as a
whole (checkpoint_file.py): one of the wrong shape is refused like an unparsable one, with the file
named, never half-used.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import orjson
from pydantic import ValidationError

from trajforge.errors import OutputError, RunStateError
from trajforge.jsonio import atomic_write_bytes
from trajforge.redact import REGISTRY
from trajforge.runner.state import journal
from trajforge.run_layout import RunLayout
from trajforge.runner.state.checkpoint_file import (
    VERSION,
    CheckpointFile,
    IndexRef,
    InvocationEntry,
    SampleEntry,
    SampleUsage,
    plain_done,
)
from trajforge.runner.state.finished import Finished
from trajforge.runner.state.keys import key_of
from trajforge.sample.outcome import Outcome

COMPACT_BYTES = 8 << 20  # journal size past which a save compacts it
SAVE_EVERY = 1.0  # seconds between two saves while outcomes arrive


@dataclass
class Checkpoint:
    layout: RunLayout  # checkpoint.json, finished.idx and journal.jsonl
    run_name: str
    samples: dict[str, SampleEntry] = field(default_factory=dict)  # failed and discarded, by identity
    invocations: list[InvocationEntry] = field(default_factory=list)
    done: Finished = field(default_factory=Finished)  # finished samples: where their record is
    extents: dict[int, int] = field(default_factory=dict)  # batch -> bytes whose records `done` knows
    merge: dict[str, Any] | None = None
    generation: int = 0
    # True when `done` cannot be trusted to list every record (a version 1 checkpoint, none at all,
    # an index its snapshot does not vouch for): the next start scans every batch file
    needs_scan: bool = True
    legacy_done: set[str] = field(default_factory=set)  # samples a version 1 checkpoint called done
    version: int = 0  # of the snapshot read (0: none)
    _journal: journal.Journal | None = None
    _journal_end: int | None = None
    _last_save: float = 0.0
    _dirty: bool = False
    _current: InvocationEntry | None = None
    _invocation_t0: float = 0.0

    @classmethod
    def load(cls, layout: RunLayout, run_name: str, *, index: bool = True) -> Checkpoint:
        """The run's checkpoint with its index and journal (empty when there is none); without
        `index`, `done` holds only what the journal adds (a reader that wants the outcomes of
        samples with no record and the invocations need not read a million entries). Raises
        RunStateError when the snapshot or the journal cannot be read or is not one as a whole."""
        ckpt = cls(layout, run_name)
        path = layout.checkpoint
        way_out = "move it away to rebuild it from the batch files, then run again with --resume"
        if path.exists():
            try:
                data = orjson.loads(path.read_bytes())
            except (OSError, orjson.JSONDecodeError) as e:
                raise RunStateError(f"{path}: checkpoint is unreadable ({e}); {way_out}") from None
            legacy_done = plain_done(data)
            try:
                file = CheckpointFile.model_validate(data)
            except ValidationError as e:
                first = e.errors()[0]
                where = ".".join(str(p) for p in first["loc"]) or "top level"
                raise RunStateError(f"{path}: not a trajforge checkpoint (at {where}: {first['msg']}); "
                                    f"{way_out}") from None
            ckpt.invocations, ckpt.generation, ckpt.merge = file.invocations, file.journal, file.merge
            ckpt.version = file.version
            ckpt.samples = {k: e for k, e in file.samples.items() if e.status != "done"}
            ckpt.legacy_done = legacy_done | {k for k, e in file.samples.items() if e.status == "done"}
            if file.finished is not None and index:
                done = Finished.read(layout.finished_index, file.finished.token, file.finished.entries)
                if done is not None:
                    ckpt.done, ckpt.needs_scan = done, False
                    ckpt.extents = {int(b): n for b, n in file.extents.items()}
        elif not layout.journal.exists():
            ckpt.needs_scan = False  # a new run, or one that never saved: the scan finds nothing to trust
        replay = journal.read(layout.journal, ckpt.generation)
        if replay is not None:
            ckpt._journal_end = replay.end
            try:
                for group in replay.groups:
                    for line in group:
                        ckpt._apply(line)
            except (ValidationError, KeyError, TypeError, ValueError) as e:
                raise RunStateError(f"{layout.journal}: not a trajforge journal ({str(e).splitlines()[0]}); "
                                    f"{way_out}") from None
        return ckpt

    def _apply(self, line: dict[str, Any]) -> None:
        """One journal line (runner.state.journal), as `record`, `forget`... wrote it."""
        if "done" in line:
            identity, batch = line["done"], int(line["batch"])
            self.samples.pop(identity, None)
            self.done.add(key_of(identity), batch, int(line["at"]), int(line["len"]))
            self.extents[batch] = max(self.extents.get(batch, 0), int(line["at"]) + int(line["len"]))
        elif "sample" in line:
            fields = {k: v for k, v in line.items() if k != "sample"}
            self.samples[line["sample"]] = SampleEntry.model_validate(fields)
        elif "forget" in line:
            self._forget([line["forget"]])
        elif "forget_keys" in line:
            self._drop(set(line["forget_keys"]))
        elif "scanned" in line:
            batch = int(line["scanned"])
            self.extents[batch] = max(self.extents.get(batch, 0), int(line["to"]))
        elif "merged" in line:
            self.merge = line["merged"]  # None: the next merge is a whole one
        elif journal.COMMIT in line and line[journal.COMMIT] is not None:
            i = int(line[journal.COMMIT])
            entry = InvocationEntry.model_validate({k: v for k, v in line.items() if k != journal.COMMIT})
            if i < len(self.invocations):
                self.invocations[i] = entry
            else:
                self.invocations.append(entry)

    def _log(self, line: dict[str, Any]) -> None:
        if self._journal is None:
            self._journal = journal.Journal(self.layout.journal, self.generation, self._journal_end)
        self._journal.add(line)
        self._dirty = True

    def status(self, identity: str) -> str | None:
        """The recorded status of a sample (done, discarded, failed), None when it has none."""
        entry = self.samples.get(identity)
        if entry is not None and entry.status == "discarded":
            return "discarded"
        if key_of(identity) in self.done or identity in self.legacy_done:
            return "done"
        return None if entry is None else entry.status

    def discarded(self) -> set[str]:
        """Discarded samples are final: never run again (batch files tell what else is finished)."""
        return {k for k, v in self.samples.items() if v.status == "discarded"}

    def _forget(self, identities: list[str]) -> list[str]:
        keys = {key_of(i) for i in identities}
        found = [i for i in identities if self.samples.pop(i, None) is not None or i in self.legacy_done
                 or key_of(i) in self.done]
        self.legacy_done.difference_update(identities)
        self._drop(keys)
        return found

    def _drop(self, keys: set[int]) -> None:
        """Remove index entries; the incremental merge, which counts entries, then starts over."""
        if any(k in self.done for k in keys):
            self.done.remove(keys)
            self.merge = None

    def forget_keys(self, keys: set[int]) -> None:
        """`forget` for samples known only by key (index entries whose record is gone)."""
        if keys:
            self._drop(keys)
            self._log({"forget_keys": sorted(keys)})

    def forget(self, identities: list[str]) -> None:
        """Drop entries that vouch for records the batch files no longer hold: the samples run again
        and their new outcome, even a failure, is what counts."""
        for identity in self._forget(identities):
            self._log({"forget": identity})

    def mark_discarded(self, identity: str, reason: str) -> None:
        """A kept record that the final merge filters out (e.g. a hallucinated tool) is discarded."""
        entry = self.samples.get(identity)
        if entry is not None and (entry.status, entry.reason) == ("discarded", reason):
            return
        batch = entry.batch if entry is not None else 0
        self._put(identity, SampleEntry(status="discarded", batch=batch, reason=reason))

    def _put(self, identity: str, entry: SampleEntry) -> None:
        self.samples[identity] = entry
        self._log({"sample": identity, **entry.model_dump(exclude_unset=True)})

    def changed(self) -> None:
        """Something held outside the sample entries (an invocation's spend) changed: save it next."""
        self._dirty = True

    def finished(self, identity: str, batch: int, offset: int, length: int, *, log: bool = True) -> None:
        """The sample's record is at `offset` (`length` bytes) in batch_<batch>.jsonl: it is done.
        Also how runner.state.recovery puts back a record an invocation wrote but never saved here.
        `log` False: a full scan is rebuilding the index, which `compact` then saves whole."""
        if self.samples.pop(identity, None) is not None and not log:
            self._dirty = True
        self.legacy_done.discard(identity)
        if self.done.add(key_of(identity), batch, offset, length):
            self.extents[batch] = max(self.extents.get(batch, 0), offset + length)
            if log:
                self._log({"done": identity, "batch": batch, "at": offset, "len": length})

    def scanned(self, batch: int, size: int) -> None:
        """Every record of batch_<batch>.jsonl's first `size` bytes is known (a scan read them)."""
        if size > self.extents.get(batch, 0):
            self.extents[batch] = size
            self._log({"scanned": batch, "to": size})

    def set_merge(self, state: dict[str, Any]) -> None:
        self.merge = state
        self._log({"merged": state})

    def record(self, o: Outcome, location: tuple[int, int] | None = None) -> None:
        """The outcome of a sample; `location`: (offset, length) of a done sample's record."""
        prev = self.status(o.identity)
        if prev in ("done", "discarded") and o.status == "failed":
            return  # a finished sample never becomes failed again
        if o.status == "done":
            assert location is not None, "a done sample has a record"
            self.finished(o.identity, o.batch_num, *location)
            return
        entry = SampleEntry(status=o.status, batch=o.batch_num, attempts=o.attempts)
        if o.reason:
            entry.reason = o.reason
        if o.status == "failed" and o.message:
            entry.message = o.message[:500]
        if o.usage:
            entry.usage, entry.api_calls = SampleUsage.model_validate(o.usage), o.api_calls
        self._put(o.identity, entry)

    def begin_invocation(self, started_wall: float, **fields: Any) -> InvocationEntry:
        """Record this invocation now, so its duration counts even if the process is killed."""
        entry = InvocationEntry(started=started_wall, seconds=0.0, ran=0, interrupted=False, **fields)
        self.invocations.append(entry)
        self._invocation_t0 = time.monotonic()
        self._current = entry
        self._dirty = True
        return entry

    def end_invocation(self) -> None:
        """The invocation's duration is final (statistics.json is made from it): the saves and the
        compaction that follow keep it as it is."""
        self._current = None

    def save(self, *, force: bool = False) -> None:
        """Commit what changed to the journal (at most every SAVE_EVERY seconds unless `force`);
        compact it once it is large. Raises OutputError."""
        now = time.monotonic()
        if self._current is not None:
            self._current.seconds = round(now - self._invocation_t0, 3)
        if not force and (not self._dirty or now - self._last_save < SAVE_EVERY):
            return
        if self._journal is None:
            self._log({"run_name": self.run_name})
        assert self._journal is not None
        if self._current is None:
            self._journal.commit({journal.COMMIT: None})
        else:
            self._journal.commit({journal.COMMIT: len(self.invocations) - 1,
                                  **self._current.model_dump(exclude_unset=True)})
        self._last_save, self._dirty = time.monotonic(), False
        if self._journal.size > COMPACT_BYTES:
            self.compact()

    def compact(self) -> None:
        """Fold everything into a new snapshot: finished.idx first, then checkpoint.json, then an
        empty journal of the next generation. A kill between any two steps leaves a state that
        loads as the same one (see runner.state.journal and runner.state.finished). Raises OutputError."""
        if self._current is not None:
            self._current.seconds = round(time.monotonic() - self._invocation_t0, 3)
        self.done.save(self.layout.finished_index)
        body = CheckpointFile.model_construct(
            version=VERSION, run_name=self.run_name, updated=time.time(), journal=self.generation + 1,
            finished=IndexRef(token=self.done.token, entries=len(self.done)),
            extents={str(b): n for b, n in sorted(self.extents.items())},
            samples=dict(sorted(self.samples.items())),  # in one order whatever order they ended in
            invocations=self.invocations, merge=self.merge)
        try:
            data = REGISTRY.bytes(body.model_dump_json(exclude_unset=True).encode())
            atomic_write_bytes(self.layout.checkpoint, data)
        except OSError as e:
            raise OutputError(self.layout.checkpoint, e) from None
        self.generation += 1
        self.legacy_done.clear()
        self.needs_scan = False
        if self._journal is None:
            self._journal = journal.Journal(self.layout.journal, self.generation, None)
        self._journal.rotate(self.generation)
        self._journal_end = None
        self._last_save, self._dirty = time.monotonic(), False

    def close(self) -> None:
        if self._journal is not None:
            self._journal.close()

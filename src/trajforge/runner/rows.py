"""The dataset as the runner holds it: one streaming pass, then a few bytes a row.

A run of a million rows must not keep a million Sample objects (~600 MB, 6 s to build) to run the
thousand that are left. `RunRows.read` reads the file once: every row is validated (dataset,
verification and container checks, as before, all while the rows stream by) and only its key
(runner.keys), occurrence number and byte offset are kept, with a digest of the whole file. The
samples to run are then read back by offset (`Todo`), lazily and in order, so a fresh run of a
million rows does not hold them all either.
"""

from __future__ import annotations

import hashlib
from array import array
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path

from trajforge.config import RunConfig
from trajforge.dataset import Sample, iter_samples, rollout_identity, sample_at, split_rollout
from trajforge.errors import DatasetError
from trajforge.runner.keys import key_of, rollout_key, row_key
from trajforge.verify.verifier import check_row_verification


@dataclass
class RunRows:
    path: Path
    k: int  # --samples_per_prompt
    keys: array = field(default_factory=lambda: array("Q"))  # each valid row's key (its rollout 0)
    offsets: array = field(default_factory=lambda: array("q"))
    lines: array = field(default_factory=lambda: array("L"))
    occurrences: array = field(default_factory=lambda: array("L"))  # among identical rows before it
    skipped: list[str] = field(default_factory=list)  # problems of rows --skip_invalid left out
    fingerprint: str = ""  # the file's content and the settings that choose its samples
    with_image: int = 0  # rows naming a container image
    first_bare: int | None = None  # line of the first row without one
    rubric: bool = False  # some row asks a judge
    verified: bool = False  # some row asks for verification
    host_cwd: bool = True  # rows without an image run on this host's system view (dataset._check_row)

    @classmethod
    def read(cls, config: RunConfig) -> RunRows:
        """Validate the dataset in one pass (DatasetError on bad rows) and keep its keys."""
        assert config.dataset_file is not None
        rows = cls(config.dataset_file, config.samples_per_prompt, host_cwd=config.sandbox != "container")
        digest = hashlib.blake2b(digest_size=16)
        stream = iter_samples(config.dataset_file, rows.skipped, skip_invalid=config.skip_invalid,
                              max_samples=config.max_samples, digest=digest, host_cwd=rows.host_cwd)
        rows.rubric, rows.verified = check_row_verification(config, config.dataset_file, rows._keep(stream))
        digest.update(f"|{config.max_samples}|{config.skip_invalid}".encode())
        rows.fingerprint = digest.hexdigest()
        return rows

    def _keep(self, stream: Iterator[Sample]) -> Iterator[Sample]:
        for s in stream:
            head, _, occ = s.identity.partition(":")
            self.keys.append(row_key(bytes.fromhex(head[:16]), int(occ)))
            self.offsets.append(s.offset)
            self.lines.append(s.line)
            self.occurrences.append(int(occ))
            if s.image is not None:
                self.with_image += 1
            elif self.first_bare is None:
                self.first_bare = s.line
            yield s

    def __len__(self) -> int:
        """Samples: rows times rollouts."""
        return len(self.keys) * self.k

    def sample_keys(self) -> Iterator[tuple[int, int, int]]:
        """(row, rollout, key) of every sample, in dataset order."""
        for i, key in enumerate(self.keys):
            yield i, 0, key
            for r in range(1, self.k):
                yield i, r, rollout_key(key, r)

    def positions(self, wanted: set[int]) -> dict[int, tuple[int, int]]:
        """key -> (row, rollout) for the keys of `wanted` that are samples of this dataset."""
        if not wanted:
            return {}
        return {key: (i, r) for i, r, key in self.sample_keys() if key in wanted}

    def key_set(self) -> set[int]:
        return {key for _, _, key in self.sample_keys()}

    def todo(self, finished: Callable[[int], bool]) -> Todo:
        """The samples whose key `finished` does not know, in dataset order."""
        return Todo(self, [(i, r) for i, r, key in self.sample_keys() if not finished(key)])

    def sample(self, i: int, r: int = 0, f=None) -> Sample:  # type: ignore[no-untyped-def]
        """Row `i`'s rollout `r`, read back from the file."""
        s = sample_at(f or self.path, self.offsets[i], i, self.lines[i], self.occurrences[i],
                      host_cwd=self.host_cwd)
        if key_of(s.identity) != self.keys[i]:  # another valid row now stands at that offset
            raise DatasetError(f"{self.path}:{s.line}: the row changed while the run read it")
        return s if r == 0 else replace(s, identity=rollout_identity(s.identity, r), rollout=r)


@dataclass
class Todo:
    """The samples left to run: a sized, re-iterable sequence read from the dataset as it goes."""

    rows: RunRows
    at: list[tuple[int, int]]  # (row, rollout)
    seen: dict[str, str | None] | None = None  # row identity -> task type, of the rows handed out

    def __len__(self) -> int:
        return len(self.at)

    def __bool__(self) -> bool:
        return bool(self.at)

    def __iter__(self) -> Iterator[Sample]:
        with self.rows.path.open("rb") as f:
            for i, r in self.at:
                s = self.rows.sample(i, r, f)
                if self.seen is not None and s.task_type is not None:
                    self.seen[split_rollout(s.identity)[0]] = s.task_type
                yield s

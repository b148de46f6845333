"""The dataset as the runner holds it: one streaming pass, then a few bytes a row.

A run of a million rows must not keep a million Sample objects (~600 MB, 6 s to build) to run the
thousand that are left. `RunRows.read` reads the file once: every row is validated (dataset,
verification and container checks, as before, all while the rows stream by) and only its key
(runner.state.keys), occurrence number, line and byte offset are kept, with a digest of the file. The
samples to run are then read back by offset (`Todo`), lazily and in order, so a fresh run of a
million rows does not hold them all either.

A resume reads even less: the rows of the last invocation's pass are in the run directory
(runner.state.rowcache), and when the dataset file still begins with the bytes they came from, only
what follows is read. Rows taken from there are checked again when read back to run.
"""

from __future__ import annotations

import contextlib
import hashlib
from array import array
from collections.abc import Container, Iterator
from itertools import repeat
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, BinaryIO

import orjson

from trajforge.catalog.sandboxes import runs_on_host
from trajforge.config import RunConfig
from trajforge.dataset import (
    LoadedDataset, PassState, Sample, extra_at, iter_samples, listed, rollout_identity, sample_at, split_rollout,
)
from trajforge.errors import DatasetError
from trajforge.runner.state import rowcache
from trajforge.runner.state.keys import key_of, rollout_key, row_key
from trajforge.verify.verifier import check_row_verification


@dataclass
class RunRows:
    path: Path
    k: int  # --samples_per_prompt
    keys: array = field(default_factory=lambda: array("Q"))  # each valid row's key (its rollout 0)
    offsets: array = field(default_factory=lambda: array("q"))
    lines: array = field(default_factory=lambda: array("I"))
    occurrences: array = field(default_factory=lambda: array("I"))  # among identical rows before it
    task_type: array = field(default_factory=lambda: array("H"))  # task_names[n]: its task_type (0: none)
    task_names: list[str | None] = field(default_factory=lambda: [None])
    skipped: list[str] = field(default_factory=list)  # problems of rows --skip_invalid left out
    with_image: int = 0  # rows naming a container image
    first_bare: int | None = None  # line of the first row without one
    rubric: bool = False  # some row asks a judge
    verified: bool = False  # some row asks for verification
    host_cwd: bool = True  # rows without an image run on this host's system view (dataset._check_row)
    settings: str = ""  # rowcache.settings: what besides the bytes decides the rows and what rows.idx says of them
    places_by: str = ""  # rowcache.row_settings, as text: what besides the bytes decides the rows' places
    state: PassState = field(default_factory=PassState)  # where the pass stood after its last whole line
    digest: str = ""  # blake2b of the dataset's bytes up to state.offset
    size: int = 0  # bytes the pass read (a last line without a newline too)
    whole: str = ""  # blake2b of all of them
    cached: int = 0  # rows taken from rows.idx (not validated by this pass: `check_cached`)
    saved: tuple[int, str] | None = None  # (bytes, digest) of the prefix rows.idx vouched for
    kept: list[Sample] | None = None  # the samples themselves, when held whole (`held`: the tasks of --tasks)
    _last_image: bool = False

    @classmethod
    def read(cls, config: RunConfig, cache: Path | None = None) -> RunRows:
        """Validate the dataset in one pass (DatasetError on bad rows) and keep its keys; with
        `cache` (the run's rows.idx), only what follows the bytes it covers when they match."""
        assert config.dataset_file is not None
        path = config.dataset_file
        rows = cls(path, config.samples_per_prompt, host_cwd=runs_on_host(config.sandbox),
                   settings=rowcache.settings(config), places_by=_places_by(config))
        saved = rowcache.load(cache, rows.settings) if cache is not None else None
        digest = saved.matches(path) if saved is not None else None
        if saved is not None and digest is not None:
            rows._adopt(saved)
        else:
            digest = hashlib.blake2b(digest_size=16)
        stream = iter_samples(path, rows.skipped, skip_invalid=config.skip_invalid, max_samples=config.max_samples,
                              digest=digest, host_cwd=rows.host_cwd, state=rows.state)
        rubric, verified = check_row_verification(config, path, rows._keep(stream))
        rows.rubric, rows.verified = rows.rubric or rubric, rows.verified or verified
        rows.state.prior = None
        rows.digest = digest.hexdigest()
        rows.size, whole = rows.state.offset, digest.copy()
        with path.open("rb") as f:  # a last line without a newline: not in `digest`, in `whole`
            f.seek(rows.state.offset)
            tail = f.read()
        rows.size += len(tail)
        whole.update(tail)
        rows.whole = whole.hexdigest()
        return rows

    @classmethod
    def held(cls, config: RunConfig, loaded: LoadedDataset) -> RunRows:
        """Samples loaded whole (the tasks of --tasks: a few hundred directories, each read and
        hashed), held as they are; the same interface as a dataset's rows."""
        rows = cls(loaded.path, config.samples_per_prompt, skipped=list(loaded.skipped), kept=list(loaded.samples),
                   settings=rowcache.settings(config), places_by=_places_by(config))
        rows.rubric, rows.verified = check_row_verification(config, loaded.path, rows.kept or [])
        for s in loaded.samples:
            rows.keys.append(key_of(s.identity))
            rows.offsets.append(-1)
            rows.lines.append(s.line)
            rows.occurrences.append(int(s.identity.rpartition(":")[2]))
            rows.task_type.append(rows._task_number(s.task_type))
            if s.image is not None:
                rows.with_image += 1
            elif rows.first_bare is None:
                rows.first_bare = s.line
        rows.whole = hashlib.blake2b("\n".join(s.identity for s in loaded.samples).encode(), digest_size=16).hexdigest()
        rows.size = -1
        return rows

    @contextlib.contextmanager
    def reader(self) -> Iterator[BinaryIO | None]:
        """The dataset file open for `sample` (None when the samples are held)."""
        if self.kept is not None:
            yield None
        else:
            with self.path.open("rb") as f:
                yield f

    def _adopt(self, saved: rowcache.Saved) -> None:
        self.keys, self.offsets, self.lines, self.occurrences = saved.keys, saved.offsets, saved.line_of, \
            saved.occurrences
        self.task_type, self.task_names = saved.task_type, list(saved.task_names)
        self.skipped = list(saved.skipped)
        self.with_image, self.first_bare = saved.with_image, saved.first_bare
        self.rubric, self.verified = saved.rubric, saved.verified
        self.state = PassState(saved.offset, saved.lines, saved.rows, saved.count, len(saved.skipped), saved.prior)
        self.cached, self.saved = len(saved.keys), (saved.offset, saved.digest)

    def _keep(self, stream: Iterator[Sample]) -> Iterator[Sample]:
        for s in stream:
            head, _, occ = s.identity.partition(":")
            self.keys.append(row_key(bytes.fromhex(head[:16]), int(occ)))
            self.offsets.append(s.offset)
            self.lines.append(s.line)
            self.occurrences.append(int(occ))
            self.task_type.append(self._task_number(s.task_type))
            self._last_image = s.image is not None
            if s.image is not None:
                self.with_image += 1
            elif self.first_bare is None:
                self.first_bare = s.line
            yield s

    def _task_number(self, name: str | None) -> int:
        if name is None:
            return 0
        try:
            return self.task_names.index(name)  # a handful of task types in any dataset
        except ValueError:
            self.task_names.append(name)
            return len(self.task_names) - 1

    def task_type_of(self, i: int) -> str | None:
        return self.task_names[self.task_type[i]]

    def save_cache(self, path: Path) -> None:
        """Write rows.idx for the next invocation (nothing when it has nothing new to say).
        Raises OutputError."""
        st = self.state
        if self.kept is not None or self.saved == (st.offset, self.digest):
            return
        n = st.count  # a last line without a newline is not saved: it is read again next time
        tail = len(self.keys) > n
        with_image = self.with_image - (1 if tail and self._last_image else 0)
        first_bare = self.first_bare if self.first_bare is not None and self.first_bare <= st.lines else None
        rowcache.save(path, rowcache.Saved(
            self.settings, st.offset, self.digest, st.lines, st.rows, n, self.skipped[:st.skipped], with_image,
            first_bare, self.rubric, self.verified, self.keys[:n], self.offsets[:n], self.lines[:n],
            self.occurrences[:n], self.task_type[:n], self.task_names))

    def identity(self) -> dict[str, Any]:
        """What the incremental merge keeps of the dataset it merged against (runner.reporting.merge)."""
        return {"settings": self.places_by, "k": self.k, "bytes": self.size, "digest": self.whole}

    def extends(self, before: dict[str, Any] | None) -> bool:
        """Whether this dataset is the one `before` (an `identity`) describes, or that one with
        rows appended: every row of it is here, at the same index."""
        if not isinstance(before, dict) or before.get("settings") != self.places_by or before.get("k") != self.k:
            return False
        size, digest = before.get("bytes"), before.get("digest")
        known = {self.size: self.whole, self.state.offset: self.digest, **dict([self.saved] if self.saved else [])}
        if size in known or not isinstance(size, int) or not 0 <= size <= self.state.offset or self.kept is not None:
            return known.get(size) == digest  # type: ignore[arg-type]
        prefix = rowcache.prefix_digest(self.path, size)  # a pass that read all of it kept no digest there
        return prefix is not None and prefix.hexdigest() == digest

    def check_cached(self, todo: Todo, skip_invalid: bool) -> None:
        """Check again the rows to run that rows.idx gave: a bad one raises DatasetError (listing
        every one), or with --skip_invalid is left out of `todo` and counted as skipped."""
        if not self.cached:
            return
        problems: dict[int, str] = {}
        with self.reader() as f:
            for i in sorted({i for i, _ in todo.at if i < self.cached}):
                try:
                    self.sample(i, 0, f)
                except DatasetError as e:
                    problems[i] = str(e)
        if problems and not skip_invalid:
            raise DatasetError(f"{self.path}: {len(problems)} invalid line(s); fix them or pass --skip_invalid to "
                               "skip them", listed(list(problems.values())))
        todo.at = [(i, r) for i, r in todo.at if i not in problems]
        self.skipped += problems.values()

    def __len__(self) -> int:
        """Samples: rows times rollouts."""
        return len(self.keys) * self.k

    def sample_keys(self) -> Iterator[tuple[int, int, int]]:
        """(row, rollout, key) of every sample, in dataset order."""
        if self.k == 1:
            yield from zip(range(len(self.keys)), repeat(0), self.keys)
            return
        for i, key in enumerate(self.keys):
            yield i, 0, key
            for r in range(1, self.k):
                yield i, r, rollout_key(key, r)

    def places(self) -> dict[int, int]:
        """key -> row * k + rollout, for every sample (the whole merge's map: ~100 MB at a million)."""
        if self.k == 1:
            return dict(zip(self.keys, range(len(self.keys))))
        return {key: i * self.k + r for i, r, key in self.sample_keys()}

    def positions(self, wanted: set[int]) -> dict[int, tuple[int, int]]:
        """key -> (row, rollout) for the keys of `wanted` that are samples of this dataset."""
        if not wanted:
            return {}
        return {key: (i, r) for i, r, key in self.sample_keys() if key in wanted}

    def todo(self, *finished: Container[int]) -> Todo:
        """The samples whose key none of `finished` holds, in dataset order."""
        if self.k == 1 and len(finished) <= 2:  # a million rows: ~0.2 s instead of ~1 s
            a, b = (*finished, (), ())[:2]
            return Todo(self, [(i, 0) for i, key in enumerate(self.keys) if key not in a and key not in b])
        return Todo(self, [(i, r) for i, r, key in self.sample_keys() if not any(key in f for f in finished)])

    def extra(self, i: int, f: BinaryIO | None) -> tuple[int, dict[str, Any]]:
        """(line, extra fields) of row `i`, read back without checking it again (the merge's `fit`)."""
        if self.kept is not None:
            return self.kept[i].line, self.kept[i].extra
        assert f is not None
        return self.lines[i], extra_at(f, self.offsets[i])

    def sample(self, i: int, r: int = 0, f=None) -> Sample:  # type: ignore[no-untyped-def]
        """Row `i`'s rollout `r`, read back from the file (`f`: the file, open)."""
        if self.kept is not None:
            s = self.kept[i]
            return s if r == 0 else replace(s, identity=rollout_identity(s.identity, r), rollout=r)
        s = sample_at(f or self.path, self.offsets[i], i, self.lines[i], self.occurrences[i],
                      host_cwd=self.host_cwd)
        if key_of(s.identity) != self.keys[i]:  # another valid row now stands at that offset
            raise DatasetError(f"{self.path}:{s.line}: not the row this run read there (the file changed under it)")
        return s if r == 0 else replace(s, identity=rollout_identity(s.identity, r), rollout=r)


def _places_by(config: RunConfig) -> str:
    return orjson.dumps(rowcache.row_settings(config), option=orjson.OPT_SORT_KEYS).decode()


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
        with self.rows.reader() as f:
            for i, r in self.at:
                s = self.rows.sample(i, r, f)
                if self.seen is not None and s.task_type is not None:
                    self.seen[split_rollout(s.identity)[0]] = s.task_type
                yield s

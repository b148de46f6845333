"""rows.idx: a resume takes the rows of the last pass over the dataset and reads only what follows.

Whatever the cache holds, the rows a resume ends up with are the ones a whole pass over the file
gives (keys, offsets, lines, occurrences, what --skip_invalid left out); a file that does not
begin with the bytes the cache came from, other settings, or a cache file that is torn or another
run's, are misses. Rows it gave that are about to run are checked again.
"""

from __future__ import annotations

import json
import os
import sysconfig
from pathlib import Path

import pytest

from trajforge.config import RunConfig
from trajforge.errors import DatasetError
from trajforge.run_layout import RunLayout
from trajforge.runner.state import rowcache
from trajforge.runner.scheduling.rows import RunRows, Todo


def write(path: Path, rows: list[object], *, end: bytes = b"\n") -> Path:
    path.write_bytes(b"\n".join(r if isinstance(r, bytes) else json.dumps(r).encode() for r in rows) + end)
    return path


def config(ds: Path, **kw: object) -> RunConfig:
    return RunConfig(dataset_file=ds, run_name="r", **kw)  # type: ignore[arg-type]


def fields(rows: RunRows) -> tuple[object, ...]:
    return (list(rows.keys), list(rows.offsets), list(rows.lines), list(rows.occurrences), len(rows.skipped),
            [rows.task_type_of(i) for i in range(len(rows.keys))], rows.with_image, rows.first_bare, rows.rubric,
            rows.verified, rows.whole)


def cached_then_whole(ds: Path, cache: Path, **kw: object) -> tuple[RunRows, RunRows]:
    return RunRows.read(config(ds, **kw), cache), RunRows.read(config(ds, **kw))


ROWS = [{"prompt": "a"}, {"prompt": "b", "image": "img:1", "task_type": "t1"}, {"prompt": "a"},
        {"prompt": "c", "expected": "x"}]


def test_appended_rows_are_read_on_from_the_cache_with_their_occurrences(tmp_path: Path) -> None:
    ds, cache = write(tmp_path / "d.jsonl", ROWS), RunLayout(tmp_path).rows_cache
    first = RunRows.read(config(ds), cache)
    assert first.cached == 0
    first.save_cache(cache)
    # the same file: every row from the cache, nothing read again
    again, whole = cached_then_whole(ds, cache)
    assert again.cached == 4 and fields(again) == fields(whole)
    # rows appended, among them more of "a" (occurrences 2 and 3) and of "b"
    write(ds, [*ROWS, {"prompt": "a"}, {"prompt": "d", "task_type": "t2"}, {"prompt": "b", "image": "img:1", "task_type": "t1"},
               {"prompt": "a"}])
    grown, whole = cached_then_whole(ds, cache)
    assert grown.cached == 4 and fields(grown) == fields(whole)
    assert list(grown.occurrences) == [0, 0, 1, 0, 2, 0, 1, 3]
    assert [grown.task_type_of(i) for i in range(8)] == [None, "t1", None, None, None, "t2", "t1", None]
    assert grown.extends(first.identity()) and not first.extends(grown.identity())
    assert whole.extends(first.identity())  # without the cache too: the prefix is hashed again


def test_a_changed_prefix_other_settings_or_a_bad_cache_file_read_the_whole_file(tmp_path: Path) -> None:
    ds, cache = write(tmp_path / "d.jsonl", ROWS), RunLayout(tmp_path).rows_cache
    first = RunRows.read(config(ds), cache)
    first.save_cache(cache)
    write(ds, [{"prompt": "A"}, *ROWS[1:]])  # a row edited: same length, other bytes
    edited, whole = cached_then_whole(ds, cache)
    assert edited.cached == 0 and fields(edited) == fields(whole) and not edited.extends(first.identity())
    write(ds, ROWS)
    assert RunRows.read(config(ds, max_samples=3), cache).cached == 0
    assert RunRows.read(config(ds, sandbox="container"), cache).cached == 0
    good = cache.read_bytes()
    for bad in (good[:-3], good + b"\0", b"not a cache\n", b""):
        cache.write_bytes(bad)
        rows, whole = cached_then_whole(ds, cache)
        assert rows.cached == 0 and fields(rows) == fields(whole)


def test_a_last_line_without_a_newline_is_read_again(tmp_path: Path) -> None:
    ds, cache = write(tmp_path / "d.jsonl", ROWS, end=b""), RunLayout(tmp_path).rows_cache
    RunRows.read(config(ds), cache).save_cache(cache)
    write(ds, [*ROWS, {"prompt": "a"}], end=b"")  # the last row got its newline and one more row
    rows, whole = cached_then_whole(ds, cache)
    assert rows.cached == 3 and fields(rows) == fields(whole) and list(rows.lines) == [1, 2, 3, 4, 5]


def test_skipped_rows_are_remembered_and_only_new_ones_are_reported(tmp_path: Path) -> None:
    ds, cache = write(tmp_path / "d.jsonl", [ROWS[0], b"{torn", ROWS[1]]), RunLayout(tmp_path).rows_cache
    RunRows.read(config(ds, skip_invalid=True), cache).save_cache(cache)
    write(ds, [ROWS[0], b"{torn", ROWS[1], {"prompt": ""}, ROWS[2]])
    rows, whole = cached_then_whole(ds, cache, skip_invalid=True)
    assert rows.cached == 2 and fields(rows) == fields(whole)
    assert [p.split(": ", 1)[0] for p in rows.skipped] == [f"{ds}:2", f"{ds}:4"]
    with pytest.raises(DatasetError, match="2 invalid line"):  # without --skip_invalid the cache is not used
        RunRows.read(config(ds), cache)


def test_a_cached_row_to_run_is_checked_again(tmp_path: Path) -> None:
    """A row's cwd that led nowhere when it was cached, and now leads to the runtime through a link."""
    place = tmp_path / "place"
    ds = write(tmp_path / "d.jsonl", [{"prompt": "fine"}, {"prompt": "p", "cwd": f"{place}/link/sub"}])
    cache = RunLayout(tmp_path).rows_cache
    RunRows.read(config(ds), cache).save_cache(cache)
    place.mkdir()
    os.symlink(sysconfig.get_paths()["stdlib"], place / "link")
    rows = RunRows.read(config(ds), cache)
    assert rows.cached == 2
    rows.check_cached(Todo(rows, [(0, 0)]), skip_invalid=False)  # the other row is finished: never runs
    with pytest.raises(DatasetError) as info:
        rows.check_cached(Todo(rows, [(0, 0), (1, 0)]), skip_invalid=False)
    assert f"{ds}:2: field 'cwd'" in "\n".join(info.value.problems)
    todo = Todo(rows, [(0, 0), (1, 0)])
    rows.check_cached(todo, skip_invalid=True)
    assert todo.at == [(0, 0)] and len(rows.skipped) == 1
    with pytest.raises(DatasetError):  # and a whole pass refuses it too
        RunRows.read(config(ds))


def test_a_sample_key_is_the_same_from_its_record_and_from_its_row_whatever_the_identity() -> None:
    """A dataset row's identity, a task's (32 hex digits) and a hand-written one: the key a
    record's sample_id gives is the one the rows give that sample, rollouts included."""
    from trajforge.dataset import rollout_identity
    from trajforge.runner.state.keys import key_of, rollout_key

    for row in ("0123456789abcdef01234567:3", "ab" * 16 + ":0", "hand-written"):
        assert len({key_of(rollout_identity(row, r)) for r in range(3)}) == 3
        for r in range(3):
            assert key_of(rollout_identity(row, r)) == rollout_key(key_of(row), r)

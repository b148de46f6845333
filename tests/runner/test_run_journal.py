"""The checkpoint's journal, index and incremental merge at each point a kill can cut them.

A kill is simulated where it can land between two writes (the writes before it done, the ones
after never made): a group half written, an index appended but no snapshot, a snapshot but no new
journal, an append to trajectories.jsonl whose state was never saved. Each time the state read
back is the one before or the one after, nothing lost, nothing counted twice.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from tests.support.run_state import read_records

from trajforge.runner.state import journal
from trajforge.runner.state.checkpoint import Checkpoint
from trajforge.run_layout import RunLayout
from trajforge.runner.state.finished import Finished
from trajforge.runner.state.keys import key_of
from trajforge.config import RunConfig
from trajforge.runner.reporting.append import append_new
from trajforge.runner.reporting.merge import MergeResult, merge_state
from trajforge.runner.scheduling.rows import RunRows
from trajforge.runner.reporting.stats import Totals
from trajforge.sample.outcome import Outcome


def batch(run: Path, n: int, ids: list[str]) -> list[tuple[int, int]]:
    """Write batch_<n>.jsonl with a record per identity; their (offset, length)."""
    where, data = [], b""
    for i, s in enumerate(ids):
        line = json.dumps({"prompt_index": i, "sample_id": s, "usage": {"cost": 0.5}}).encode() + b"\n"
        where.append((len(data), len(line)))
        data += line
    (run / f"batch_{n}.jsonl").write_bytes(data)
    return where


def started(run: Path) -> Checkpoint:
    ckpt = Checkpoint.load(RunLayout(run), "r")
    ckpt.begin_invocation(1.0, model="m")
    return ckpt


def done(ckpt: Checkpoint, ids: list[str], where: list[tuple[int, int]]) -> None:
    for s, at in zip(ids, where):
        ckpt.record(Outcome(0, s, 0, "done"), at)


def view(ckpt: Checkpoint) -> tuple[dict[str, str | None], int, list[int]]:
    ids = ["a", "b", "c", "d", "x"]
    return {s: ckpt.status(s) for s in ids}, len(ckpt.done), [i.ran for i in ckpt.invocations]


def test_only_committed_groups_count_and_a_torn_tail_is_cut_before_the_next(tmp_path: Path) -> None:
    where = batch(tmp_path, 0, ["a", "b", "c"])
    ckpt = started(tmp_path)
    done(ckpt, ["a"], where[:1])
    ckpt.invocations[-1].ran = 1
    ckpt.save(force=True)
    path = RunLayout(tmp_path).journal
    committed = path.read_bytes()
    # a group cut by a kill: an outcome line, no commit line, then half a line
    with path.open("ab") as f:
        f.write(json.dumps({"done": "b", "batch": 0, "at": where[1][0], "len": where[1][1]}).encode() + b"\n")
        f.write(b'{"sample": "x", "sta')
    back = Checkpoint.load(RunLayout(tmp_path), "r")
    assert view(back) == ({"a": "done", "b": None, "c": None, "d": None, "x": None}, 1, [1])
    back.begin_invocation(2.0)
    done(back, ["c"], where[2:])
    back.save(force=True)
    assert path.read_bytes().startswith(committed) and b'"x"' not in path.read_bytes()
    again = Checkpoint.load(RunLayout(tmp_path), "r")
    assert view(again)[:2] == ({"a": "done", "b": None, "c": "done", "d": None, "x": None}, 2)


@pytest.mark.parametrize("cut", ["after_index", "after_snapshot"])
def test_a_compaction_cut_at_any_point_reads_back_as_the_same_state(tmp_path: Path, cut: str,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    where = batch(tmp_path, 0, ["a", "b", "c", "d"])
    ckpt = started(tmp_path)
    done(ckpt, ["a", "b"], where[:2])
    ckpt.compact()
    done(ckpt, ["c", "d"], where[2:])
    ckpt.record(Outcome(0, "x", 0, "failed", reason="timeout"))
    ckpt.invocations[-1].ran = 5
    ckpt.save(force=True)
    expected = view(Checkpoint.load(RunLayout(tmp_path), "r"))
    assert expected == ({"a": "done", "b": "done", "c": "done", "d": "done", "x": "failed"}, 4, [5])

    class Killed(BaseException):
        pass

    def kill(*_a: object, **_k: object) -> None:
        raise Killed
    if cut == "after_index":  # finished.idx appended, checkpoint.json not written
        monkeypatch.setattr("trajforge.runner.state.checkpoint.atomic_write_bytes", kill)
    else:  # checkpoint.json written, the journal not rotated
        monkeypatch.setattr(journal.Journal, "rotate", kill)
    with pytest.raises(Killed):
        ckpt.compact()
    monkeypatch.undo()
    back = Checkpoint.load(RunLayout(tmp_path), "r")
    assert view(back) == expected
    assert sorted(back.done.keys) == sorted(key_of(s) for s in "abcd")  # each once
    back.begin_invocation(3.0)
    back.compact()  # and the next compaction starts from it cleanly
    assert view(Checkpoint.load(RunLayout(tmp_path), "r"))[:2] == expected[:2]


def test_an_index_the_snapshot_does_not_vouch_for_is_not_used(tmp_path: Path) -> None:
    where = batch(tmp_path, 0, ["a", "b"])
    ckpt = started(tmp_path)
    done(ckpt, ["a", "b"], where)
    ckpt.compact()
    assert not Checkpoint.load(RunLayout(tmp_path), "r").needs_scan
    (RunLayout(tmp_path).finished_index).write_bytes((RunLayout(tmp_path).finished_index).read_bytes()[:-5])  # torn
    assert Checkpoint.load(RunLayout(tmp_path), "r").needs_scan  # every batch file is read again
    other = Finished()
    other.add(key_of("z"), 0, 0, 1)
    other.save(RunLayout(tmp_path).finished_index)  # another token: a rewrite its snapshot never saw
    assert Checkpoint.load(RunLayout(tmp_path), "r").needs_scan


def test_a_journal_of_another_generation_is_not_replayed(tmp_path: Path) -> None:
    (RunLayout(tmp_path).journal).write_bytes(journal.header(7) + b'{"sample": "x", "status": "failed", "batch": 0}\n'
                                          + b'{"invocation": null}\n')
    assert Checkpoint.load(RunLayout(tmp_path), "r").status("x") is None
    (RunLayout(tmp_path).journal).write_bytes(journal.header(0) + b'{"sample": "x", "status": "failed", "batch": 0}\n'
                                          + b'{"invocation": null}\n')
    assert Checkpoint.load(RunLayout(tmp_path), "r").status("x") == "failed"


def rows_of(tmp_path: Path, n: int, name: str = "p") -> tuple[RunRows, list[str]]:
    """A dataset of `n` rows, as the runner reads it, and its samples' identities."""
    ds = tmp_path / f"{name}.jsonl"
    ds.write_text("".join(json.dumps({"prompt": f"{name}{i}"}) + "\n" for i in range(n)))
    rows = RunRows.read(RunConfig(dataset_file=ds, run_name="r"))
    return rows, [rows.sample(i).identity for i in range(n)]


def merged(run: Path, rows: RunRows, written: list[str], entries: int, last: tuple[int, int]) -> dict:
    """trajectories.jsonl holding the records of `written` (from batch_0), and a merge state for it."""
    data = (run / "batch_0.jsonl").read_bytes().splitlines(keepends=True)
    by_id = {json.loads(line)["sample_id"]: line for line in data}
    (run / "trajectories.jsonl").write_bytes(b"".join(by_id[s] for s in written))
    st = (run / "trajectories.jsonl").stat()
    return merge_state(MergeResult(len(written), 0, 0, [], []), Totals(), dataset=rows.identity(), keep_passed=False,
                       entries=entries, inode=st.st_ino, size=st.st_size, last=last)


def test_an_append_whose_state_was_never_saved_is_made_again_not_twice(tmp_path: Path) -> None:
    rows, ids = rows_of(tmp_path, 3)
    where = batch(tmp_path, 0, ids)
    ckpt = started(tmp_path)
    done(ckpt, ids[:1], where[:1])
    state = merged(tmp_path, rows, ids[:1], 1, (0, 0))
    done(ckpt, ids[1:], where[1:])
    for n in range(2):  # the second time: as after a kill before the first one's state was saved
        if n:  # and one that was cut in the middle of a longer write than this one
            with (tmp_path / "trajectories.jsonl").open("ab") as f:
                f.write(b'{"torn": "' + b"x" * 10_000)
        out = append_new(RunLayout(tmp_path), state, ckpt.done, rows, Totals(), keep_passed=False)
        assert out is not None and out.result.written == 3 and out.state["entries"] == 3
        got = [r["sample_id"] for r in read_records(tmp_path)]
        assert got == ids
    other, _ = rows_of(tmp_path, 3, "q")
    assert append_new(RunLayout(tmp_path), {**state, "dataset": other.identity()}, ckpt.done, rows, Totals(),
                      keep_passed=False) is None  # another dataset: a whole merge


def test_records_before_the_last_written_one_rewrite_a_small_file_and_are_appended_to_a_large_one(
        tmp_path: Path) -> None:
    rows, ids = rows_of(tmp_path, 3)
    where = batch(tmp_path, 0, ids)
    ckpt = started(tmp_path)
    done(ckpt, [ids[0], ids[2]], [where[0], where[2]])
    state = merged(tmp_path, rows, [ids[0], ids[2]], 2, (2, 0))
    done(ckpt, [ids[1]], [where[1]])
    args = (RunLayout(tmp_path), state, ckpt.done, rows, Totals())
    assert append_new(*args, keep_passed=False) is None  # small: rewritten in order
    out = append_new(*args, keep_passed=False, rewrite_limit=0)
    assert out is not None and out.state["out_of_order"] == 1
    got = [r["sample_id"] for r in read_records(tmp_path)]
    assert got == [ids[0], ids[2], ids[1]]


@pytest.mark.parametrize("drop", ["samples", "invocations", "finished", "journal", "run_name", "extents"])
def test_a_snapshot_missing_a_key_every_writer_writes_is_refused_naming_it(tmp_path: Path, drop: str) -> None:
    # `{"version": 2}` alone used to load as an empty checkpoint: the run's failed and discarded
    # samples and its spend were lost without a word. Checkpoint.load refuses it like a corrupt file.
    from trajforge.errors import RunStateError

    ckpt = started(tmp_path)
    ckpt.compact()
    ckpt.close()
    data = json.loads((tmp_path / "checkpoint.json").read_text())
    assert Checkpoint.load(RunLayout(tmp_path), "r").version == 2  # as written: fine
    del data[drop]
    (tmp_path / "checkpoint.json").write_text(json.dumps(data))
    with pytest.raises(RunStateError, match=f"not a trajforge checkpoint .*'{drop}'.*move it away"):
        Checkpoint.load(RunLayout(tmp_path), "r")


@pytest.mark.parametrize("text", ['{"version": 2}', '{"version": 1}', '{"version": 1, "samples": {}}'])
def test_a_bare_version_is_not_a_checkpoint(tmp_path: Path, text: str) -> None:
    from trajforge.errors import RunStateError

    (tmp_path / "checkpoint.json").write_text(text)
    with pytest.raises(RunStateError, match="not a trajforge checkpoint"):
        Checkpoint.load(RunLayout(tmp_path), "r")

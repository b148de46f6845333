"""The dataset contract (issue 2 item 4): JSONL reading, every bad-input case, sample identity."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from trajforge.dataset import MAX_LISTED_PROBLEMS, Sample, content_hash, load_dataset
from trajforge.errors import DatasetError


def write(path: Path, *lines: str | bytes) -> Path:
    path.write_bytes(b"".join((ln if isinstance(ln, bytes) else ln.encode()) + b"\n" for ln in lines))
    return path


def row(**fields: object) -> str:
    return json.dumps(fields)


def problems_of(path: Path, **kw: object) -> list[str]:
    with pytest.raises(DatasetError) as info:
        load_dataset(path, **kw)  # type: ignore[arg-type]
    return info.value.problems


def test_reads_valid_rows_with_optional_fields(tmp_path: Path) -> None:
    ds = write(tmp_path / "ds.jsonl",
               row(prompt="Write a palindrome finder"),
               row(prompt="Install numpy", image="python:3.11-slim"),
               row(prompt="Set up Express", docker_image="node:20-alpine", cwd="/app"),
               row(prompt="Eval code", task_type="code_eval", source="gsm8k", difficulty=3))
    loaded = load_dataset(ds)
    assert loaded.path == ds and loaded.skipped == []
    s = loaded.samples
    assert [x.index for x in s] == [0, 1, 2, 3] and [x.line for x in s] == [1, 2, 3, 4]
    assert s[0].prompt == "Write a palindrome finder" and (s[0].image, s[0].cwd, s[0].task_type) == (None,) * 3
    assert s[1].image == "python:3.11-slim"
    assert (s[2].image, s[2].cwd) == ("node:20-alpine", "/app")
    assert s[3].task_type == "code_eval" and s[3].extra == {"source": "gsm8k", "difficulty": 3}
    assert all(isinstance(x, Sample) and x.identity.endswith(":0") for x in s)


def test_blank_lines_are_ignored_and_line_numbers_stay_true(tmp_path: Path) -> None:
    ds = write(tmp_path / "ds.jsonl", "", row(prompt="a"), "   ", "\t", row(prompt="b"), "", "{oops")
    problems = problems_of(ds)
    assert problems == [f"{ds}:7: invalid JSON at column 2: unexpected character, expected a string key"]
    loaded = load_dataset(ds, skip_invalid=True)
    assert [(x.prompt, x.line, x.index) for x in loaded.samples] == [("a", 2, 0), ("b", 5, 1)]


def test_crlf_line_endings_and_a_utf8_bom_are_accepted(tmp_path: Path) -> None:
    ds = tmp_path / "win.jsonl"
    ds.write_bytes(b'\xef\xbb\xbf{"prompt": "caf\xc3\xa9"}\r\n{"prompt": "two"}\r\n')
    assert [x.prompt for x in load_dataset(ds).samples] == ["café", "two"]


@pytest.mark.parametrize(("line", "problem"), [
    (b"{not json", "invalid JSON at column 2"),
    (b'{"prompt": "a"} trailing', "invalid JSON at column"),
    (b"[1, 2]", "expected a JSON object, got list"),
    (b'"just a string"', "expected a JSON object, got str"),
    (b"42", "expected a JSON object, got int"),
    (b"null", "expected a JSON object, got NoneType"),
    (b'{"text": "no prompt"}', "field 'prompt' is missing"),
    (b'{"prompt": ""}', "field 'prompt' is empty"),
    (b'{"prompt": "   \\n "}', "field 'prompt' is empty"),
    (b'{"prompt": 7}', "field 'prompt' must be a string, got int"),
    (b'{"prompt": null}', "field 'prompt' must be a string, got NoneType"),
    (b'{"prompt": ["a"]}', "field 'prompt' must be a string, got list"),
    (b'{"prompt": "caf\xe9"}', "invalid UTF-8 at byte 15"),
    (b'{"prompt": "x", "image": ""}', "field 'image' must be a non-empty string"),
    (b'{"prompt": "x", "docker_image": 3}', "field 'docker_image' must be a non-empty string"),
    (b'{"prompt": "x", "image": "a:1", "docker_image": "b:2"}', "fields 'image' and 'docker_image' disagree"),
    (b'{"prompt": "x", "cwd": 5}', "field 'cwd' must be a non-empty string"),
    (b'{"prompt": "x", "task_type": ""}', "field 'task_type' must be a non-empty string"),
    (b'{"prompt": "x", "image": "a:1", "cwd": "rel/dir"}', "field 'cwd' must be an absolute path"),
])
def test_every_bad_row_names_file_and_line(tmp_path: Path, line: bytes, problem: str) -> None:
    ds = write(tmp_path / "bad.jsonl", row(prompt="fine"), "", line, row(prompt="also fine"))
    with pytest.raises(DatasetError) as info:
        load_dataset(ds)
    err = info.value
    assert str(err).startswith(f"{ds}: 1 invalid line(s); fix them or pass --skip_invalid")
    assert len(err.problems) == 1 and err.problems[0].startswith(f"{ds}:3: {problem}"), err.problems
    assert err.problems[0] in str(err)
    loaded = load_dataset(ds, skip_invalid=True)  # the same row is skipped and counted instead
    assert [x.prompt for x in loaded.samples] == ["fine", "also fine"]
    assert [x.index for x in loaded.samples] == [0, 1] and [x.line for x in loaded.samples] == [1, 4]
    assert loaded.skipped == err.problems


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(DatasetError, match=r"nope\.jsonl: dataset file not found"):
        load_dataset(tmp_path / "nope.jsonl")


def test_directory_instead_of_file(tmp_path: Path) -> None:
    with pytest.raises(DatasetError, match="is a directory"):
        load_dataset(tmp_path)


def test_unreadable_file(tmp_path: Path) -> None:
    # A path through a regular file fails to open even for root (file modes would not).
    not_a_dir = write(tmp_path / "plain.txt", "x")
    with pytest.raises(DatasetError, match=r"plain\.txt/ds\.jsonl: cannot read dataset file: Not a directory"):
        load_dataset(not_a_dir / "ds.jsonl")


@pytest.mark.parametrize("content", [b"", b"\n\n  \n"])
def test_empty_file_is_an_error(tmp_path: Path, content: bytes) -> None:
    ds = tmp_path / "empty.jsonl"
    ds.write_bytes(content)
    for skip in (False, True):
        with pytest.raises(DatasetError, match=r"empty\.jsonl: no samples: the file is empty"):
            load_dataset(ds, skip_invalid=skip)


def test_every_line_invalid_with_skip_invalid_is_still_an_error(tmp_path: Path) -> None:
    ds = write(tmp_path / "all_bad.jsonl", "{", "[]")
    with pytest.raises(DatasetError, match="all 2 line") as info:
        load_dataset(ds, skip_invalid=True)
    assert [p.split(": ")[0] for p in info.value.problems] == [f"{ds}:1", f"{ds}:2"]


def test_more_than_20_problems_lists_20_and_counts_the_rest(tmp_path: Path) -> None:
    ds = write(tmp_path / "many.jsonl", *[row(prompt="ok")] * 3, *["{bad"] * 27)
    problems = problems_of(ds)
    assert len(problems) == MAX_LISTED_PROBLEMS + 1 == 21
    assert problems[0].startswith(f"{ds}:4: invalid JSON")
    assert problems[19].startswith(f"{ds}:23: invalid JSON")
    assert problems[20] == "... and 7 more"
    with pytest.raises(DatasetError, match="27 invalid line"):
        load_dataset(ds)
    assert len(load_dataset(ds, skip_invalid=True).skipped) == 27


def test_max_samples_keeps_the_first_n_valid_samples(tmp_path: Path) -> None:
    ds = write(tmp_path / "ds.jsonl", row(prompt="a"), "{bad", row(prompt="b"), row(prompt="c"), row(prompt="d"))
    loaded = load_dataset(ds, skip_invalid=True, max_samples=2)
    assert [x.prompt for x in loaded.samples] == ["a", "b"] and len(loaded.skipped) == 1
    assert len(load_dataset(ds, skip_invalid=True, max_samples=10).samples) == 4
    # Invalid rows after the first N are still reported: the file is checked whole.
    assert problems_of(ds, max_samples=1) == [f"{ds}:2: invalid JSON at column 2: "
                                              "unexpected character, expected a string key"]


def test_duplicate_prompts_stay_distinct_samples(tmp_path: Path) -> None:
    ds = write(tmp_path / "dup.jsonl", row(prompt="same"), row(prompt="other"), row(prompt="same"),
               row(prompt="same", note="extra fields do not change the content"))
    s = load_dataset(ds).samples
    same = [x.identity for x in s if x.prompt == "same"]
    h = content_hash("same", None, None, None)
    assert same == [f"{h}:0", f"{h}:1", f"{h}:2"]
    assert s[1].identity == f"{content_hash('other', None, None, None)}:0"
    assert len({x.identity for x in s}) == 4


def test_identity_does_not_depend_on_row_order(tmp_path: Path) -> None:
    rows = [row(prompt=f"p{i % 7}", cwd="/w" if i % 2 else None) for i in range(40)]
    ids = {x.identity for x in load_dataset(write(tmp_path / "a.jsonl", *rows)).samples}
    random.Random(3).shuffle(rows)
    shuffled = load_dataset(write(tmp_path / "b.jsonl", *rows)).samples
    assert {x.identity for x in shuffled} == ids and len(ids) == 40
    for x in shuffled:  # the hash part is a pure function of the running content
        assert x.identity.split(":")[0] == content_hash(x.prompt, x.image, x.cwd, x.task_type)


def test_identity_ignores_extra_fields_and_key_order(tmp_path: Path) -> None:
    a = load_dataset(write(tmp_path / "a.jsonl", '{"prompt": "x", "cwd": "/a", "id": 1}')).samples[0]
    b = load_dataset(write(tmp_path / "b.jsonl", '{"meta": {"k": 2}, "cwd": "/a", "prompt": "x"}')).samples[0]
    assert a.identity == b.identity


def test_identity_changes_with_what_changes_how_a_sample_runs() -> None:
    base = content_hash("p", None, None, None)
    variants = [content_hash("p ", None, None, None), content_hash("p", "python:3.11", None, None),
                content_hash("p", None, "/app", None), content_hash("p", None, None, "code_eval"),
                content_hash("p", "python:3.12", None, None)]
    assert len({base, *variants}) == 6


def test_image_and_docker_image_are_the_same_field(tmp_path: Path) -> None:
    ds = write(tmp_path / "img.jsonl", row(prompt="x", image="rust:1.75"), row(prompt="x", docker_image="rust:1.75"),
               row(prompt="x", image="rust:1.75", docker_image="rust:1.75"))
    s = load_dataset(ds).samples
    assert [x.image for x in s] == ["rust:1.75"] * 3
    assert [x.identity.split(":")[1] for x in s] == ["0", "1", "2"]  # one content, three occurrences
    assert all(x.extra == {} for x in s)


def test_content_hash_is_pinned() -> None:
    """Resume matches finished work by this hash: changing it orphans every existing run."""
    assert content_hash("hello", None, None, None) == "3f0b71390a7354ef350c9558"
    assert content_hash("hello", "python:3.11-slim", "/app", "code_eval") == "760f5c0164f9da9f7542aad4"


def test_a_large_file_streams(tmp_path: Path) -> None:
    ds = tmp_path / "big.jsonl"
    with ds.open("w") as f:
        for i in range(20_000):
            f.write(row(prompt=f"prompt number {i % 5000}") + "\n")
    s = load_dataset(ds).samples
    assert len(s) == 20_000 and s[-1].index == 19_999
    assert s[5000].identity.endswith(":1") and s[19_999].identity.endswith(":3")

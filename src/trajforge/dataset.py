"""The dataset contract: streaming JSONL reading, validation, and stable sample identity.

A sample's identity is a hash of the content that decides how it runs (prompt, container image,
cwd, task_type) plus its occurrence number among identical rows. Resume matches finished work by
identity, so a reordered dataset resumes correctly and duplicate prompts stay distinct samples.

`iter_samples` reads the file in one streaming pass and keeps nothing per row but the occurrence
count of content hashes that repeat (a set of 8-byte digests): the runner keeps only what it needs
of a million rows (runner.scheduling.rows); `load_dataset` is the list of them for smaller readers.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

import orjson

from trajforge.errors import DatasetError
from trajforge.sandbox.cwd_policy import problem as cwd_problem
from trajforge.task_spec import TaskSpec
from trajforge.verify.spec import ROW_FIELDS as VERIFY_FIELDS
from trajforge.verify.spec import VerifySpec, parse_row

MAX_LISTED_PROBLEMS = 20
_RUN_FIELDS = ("image", "cwd", "task_type")


@dataclass(frozen=True, slots=True)
class Sample:
    index: int  # position among the valid samples: the prompt_index of its trajectory
    line: int  # 1-based line number in the dataset file
    prompt: str
    identity: str  # "<content hash>:<occurrence>"
    image: str | None = None
    cwd: str | None = None
    task_type: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    verify: VerifySpec | None = None  # the row's check/expected/rubric fields (never shown to the model)
    rollout: int = 0  # which of --samples_per_prompt rollouts of the row this sample is
    task: TaskSpec | None = None  # a Harbor-format task (--tasks, trajforge.tasks): prompt is its instruction
    offset: int = -1  # byte offset of its line in the dataset file (read back by runner.scheduling.rows)


ROLLOUT_SEP = "#"


def rollout_identity(row_identity: str, rollout: int) -> str:
    """Rollout 0 keeps the row's identity, so a run with one rollout per prompt (and its resume)
    matches runs made before rollouts existed; rollout k > 0 is "<row identity>#k"."""
    return row_identity if rollout == 0 else f"{row_identity}{ROLLOUT_SEP}{rollout}"


def split_rollout(identity: str) -> tuple[str, int]:
    """(row identity, rollout number) of a sample identity."""
    row, sep, k = identity.partition(ROLLOUT_SEP)
    return (row, int(k)) if sep and k.isdigit() else (identity, 0)


@dataclass(slots=True)
class LoadedDataset:
    path: Path
    samples: list[Sample]
    skipped: list[str]  # problems of rows skipped with --skip_invalid


def content_hash(prompt: str, image: str | None, cwd: str | None, task_type: str | None) -> str:
    return content_digest(prompt, image, cwd, task_type).hex()


def content_digest(prompt: str, image: str | None, cwd: str | None, task_type: str | None) -> bytes:
    canon = orjson.dumps({"cwd": cwd, "image": image, "prompt": prompt, "task_type": task_type})  # keys sorted
    return hashlib.blake2b(canon, digest_size=12).digest()


def _check_row(obj: Any, host_cwd: bool = True) -> tuple[str | None, dict[str, Any]]:
    """Return (problem, run fields) for one decoded row. `host_cwd`: rows without an image run on
    this host's system view, where a cwd may not cover the runtime (sandbox/cwd_policy.py)."""
    if not isinstance(obj, dict):
        return f"expected a JSON object, got {type(obj).__name__}", {}
    if "prompt" not in obj:
        return "field 'prompt' is missing", {}
    prompt = obj["prompt"]
    if not isinstance(prompt, str):
        return f"field 'prompt' must be a string, got {type(prompt).__name__}", {}
    if not prompt.strip():
        return "field 'prompt' is empty", {}
    if "image" in obj and "docker_image" in obj and obj["image"] != obj["docker_image"]:
        return "fields 'image' and 'docker_image' disagree; give one", {}
    fields = {"image": obj.get("image", obj.get("docker_image")), "cwd": obj.get("cwd"),
              "task_type": obj.get("task_type")}
    for name, value in fields.items():
        if value is not None and (not isinstance(value, str) or not value.strip()):
            shown = "docker_image" if name == "image" and "docker_image" in obj else name
            return f"field '{shown}' must be a non-empty string", {}
    if fields["cwd"] is not None and not fields["cwd"].startswith("/") and fields["image"] is not None:
        return "field 'cwd' must be an absolute path inside the image", {}
    if fields["cwd"] is not None:
        why = cwd_problem(fields["cwd"], host=host_cwd and fields["image"] is None)
        if why is not None:
            return f"field 'cwd' {why}", {}
    return None, fields


@dataclass
class PassState:
    """Where a streaming pass over the dataset stands after its last whole line (one that ends with
    a newline): a later pass over a file that begins with the same bytes can go on from there
    instead of reading them again (runner.state.rowcache). `iter_samples` starts from it and moves it on."""

    offset: int = 0  # bytes of whole lines read
    lines: int = 0  # lines among them
    rows: int = 0  # non-blank ones
    count: int = 0  # valid samples among them (not those max_samples left out)
    skipped: int = 0  # problems of invalid rows among them
    # occurrences of a content digest among the samples before `offset` (None: there are none)
    prior: Callable[[bytes], int] | None = None


def _rows(path: Path, state: PassState, digest: Any = None) -> Iterator[tuple[int, Any, str | None, int, bool]]:
    """(line number, decoded object or None, problem, byte offset, whole) of every non-blank line
    from `state.offset` on; `digest` is fed every whole line, and `state` moves past it once the
    caller is done with it."""
    try:
        f = path.open("rb")
    except FileNotFoundError:
        raise DatasetError(f"{path}: dataset file not found") from None
    except OSError as e:
        raise DatasetError(f"{path}: cannot read dataset file: {e.strerror or e}") from None
    offset = state.offset
    with f:
        f.seek(offset)
        for lineno, raw in enumerate(f, start=state.lines + 1):
            start, offset = offset, offset + len(raw)
            whole = raw.endswith(b"\n")
            if whole and digest is not None:
                digest.update(raw)
            if lineno == 1:
                raw = raw.removeprefix(b"\xef\xbb\xbf")  # editors on Windows write a UTF-8 BOM
            if raw.strip():
                try:
                    raw.decode("utf-8")
                except UnicodeDecodeError as e:
                    yield lineno, None, f"invalid UTF-8 at byte {e.start}", start, whole
                else:
                    try:
                        obj = orjson.loads(raw)
                    except orjson.JSONDecodeError as e:
                        # orjson counts lines within this one line: report the column only.
                        yield lineno, None, f"invalid JSON at column {e.colno}: {e.msg}", start, whole
                    else:
                        yield lineno, obj, None, start, whole
            if whole:
                state.offset, state.lines = offset, lineno


def load_dataset(path: Path, *, skip_invalid: bool = False, max_samples: int | None = None,
                 host_cwd: bool = True) -> LoadedDataset:
    """Read and validate the whole dataset, assigning identities; raise DatasetError on bad input.
    `host_cwd`: False when every row runs in a container (`--sandbox container`)."""
    problems: list[str] = []
    samples = list(iter_samples(path, problems, skip_invalid=skip_invalid, max_samples=max_samples,
                                host_cwd=host_cwd))
    return LoadedDataset(path, samples, problems)


def iter_samples(path: Path, problems: list[str], *, skip_invalid: bool = False,
                 max_samples: int | None = None, digest: Any = None, host_cwd: bool = True,
                 state: PassState | None = None) -> Iterator[Sample]:
    """Yield the valid samples of the dataset one at a time, in file order, validating every row
    (also past `max_samples`, so a bad file is reported whole). Problems of invalid rows go to
    `problems`; once the file is read, DatasetError is raised when there are any (and not
    `skip_invalid`) or when no sample was valid. `digest` (a hashlib object) is fed every whole
    line. `host_cwd`: as for load_dataset. `state`: where to start (the file's beginning when
    None); it is moved on past every whole line as the samples are taken."""
    if path.is_dir():
        raise DatasetError(f"{path}: is a directory, expected a JSONL file")
    state = state if state is not None else PassState()
    seen: set[bytes] = set()  # content digests seen in this pass; repeats counted in `again`
    again: dict[bytes, int] = {}  # digest -> the last occurrence number given
    rows, count = state.rows, state.count
    for lineno, obj, problem, offset, whole in _rows(path, state, digest):
        rows += 1
        if problem is None:
            problem, fields = _check_row(obj, host_cwd)
        if problem is None:
            problem, verify = parse_row(obj)
        if problem is not None:
            problems.append(f"{path}:{lineno}: {problem}")
        elif max_samples is None or count < max_samples:  # past it: still validated, so a bad file is reported whole
            d = content_digest(obj["prompt"], fields["image"], fields["cwd"], fields["task_type"])
            if d in seen:
                occurrence = again[d] = again.get(d, 0) + 1
            else:
                seen.add(d)
                occurrence = state.prior(d) if state.prior is not None else 0
                if occurrence:
                    again[d] = occurrence
            yield _sample(obj, fields, verify, count, lineno, f"{d.hex()}:{occurrence}", offset)
            count += 1
        if whole:
            state.rows, state.count, state.skipped = rows, count, len(problems)
    if problems and not skip_invalid:
        raise DatasetError(f"{path}: {len(problems)} invalid line(s); fix them or pass --skip_invalid to skip them",
                           listed(problems))
    if not rows:
        raise DatasetError(f"{path}: no samples: the file is empty (blank lines are ignored)")
    if not count:
        raise DatasetError(f"{path}: no samples: all {rows} line(s) are invalid", listed(problems))


def sample_at(source: Path | BinaryIO, offset: int, index: int, line: int, occurrence: int, *,
              host_cwd: bool = True) -> Sample:
    """The sample whose row starts at byte `offset` (as iter_samples gave it, with its index, line
    and occurrence): read back by the runner for the rows it runs, so a million-row dataset is
    never held in memory. `source`: the file's path, or the file open for reading. A row that does
    not pass the checks (again: the file changed, or the checks did) raises DatasetError
    "<path>:<line>: <problem>"."""
    if isinstance(source, Path):
        with source.open("rb") as f:
            f.seek(offset)
            raw = f.readline()
    else:
        source.seek(offset)
        raw = source.readline()
    name = source if isinstance(source, Path) else getattr(source, "name", "dataset")
    try:
        obj = orjson.loads(raw.removeprefix(b"\xef\xbb\xbf") if offset == 0 else raw)
    except orjson.JSONDecodeError as e:
        raise DatasetError(f"{name}:{line}: invalid JSON at column {e.colno}: {e.msg}") from None
    problem, fields = _check_row(obj, host_cwd)
    if problem is None:
        problem, verify = parse_row(obj)
    if problem is not None:
        raise DatasetError(f"{name}:{line}: {problem}")
    d = content_digest(obj["prompt"], fields["image"], fields["cwd"], fields["task_type"])
    return _sample(obj, fields, verify, index, line, f"{d.hex()}:{occurrence}", offset)


def extra_at(f: BinaryIO, offset: int) -> dict[str, Any]:
    """The extra fields of the row at byte `offset` of the open dataset file `f` (a row the pass
    checked: it is not checked again)."""
    f.seek(offset)
    raw = f.readline()
    obj = orjson.loads(raw.removeprefix(b"\xef\xbb\xbf") if offset == 0 else raw)
    return _extra(obj, has_verify=any(k in obj for k in VERIFY_FIELDS))


def _extra(obj: dict[str, Any], *, has_verify: bool) -> dict[str, Any]:
    extra = {k: v for k, v in obj.items() if k not in ("prompt", "image", "docker_image", *_RUN_FIELDS)}
    if has_verify:  # verification fields are not "extra" row data: they never reach a record
        for k in VERIFY_FIELDS:
            extra.pop(k, None)
    return extra


def _sample(obj: dict[str, Any], fields: dict[str, Any], verify: VerifySpec | None, index: int, line: int,
            identity: str, offset: int) -> Sample:
    extra = _extra(obj, has_verify=verify is not None)
    return Sample(index, line, obj["prompt"], identity, extra=extra, verify=verify, offset=offset, **fields)


def listed(problems: list[str]) -> list[str]:
    """The first MAX_LISTED_PROBLEMS problems, and a count of the rest."""
    shown = problems[:MAX_LISTED_PROBLEMS]
    if len(problems) > len(shown):
        shown.append(f"... and {len(problems) - len(shown)} more")
    return shown

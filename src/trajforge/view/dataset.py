"""The run's dataset, when it can still be found: prompts, indexes and task types by identity.

A failed sample has no record, so its prompt and position are only in the dataset; task_type is
a dataset field records do not carry. config.json names the dataset file as it was given to
`trajforge run` (often relative to the directory the run was started in), so it is looked for
there (derived from the run directory and output_dir) and then relative to the current directory.
A dataset that is gone or no longer valid just leaves those fields empty. A run of `--tasks`
reads its task directories the same way (trajforge.tasks.load).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import orjson

from trajforge.dataset import load_dataset
from trajforge.errors import DatasetError
from trajforge.view.summary import PROMPT_CAP


@dataclass(slots=True)
class Row:
    index: int
    task_type: str | None
    prompt: str


def _config(run_dir: Path) -> dict:
    try:
        config = orjson.loads((run_dir / "config.json").read_bytes())
    except (OSError, orjson.JSONDecodeError):
        return {}
    return config if isinstance(config, dict) else {}


def find_dataset(run_dir: Path) -> tuple[Path | None, int | None]:
    """(dataset path, max_samples) from the run's config.json, or (None, None); the tasks'
    directory for a run of --tasks."""
    config = _config(run_dir)
    if not config:
        return None, None
    tasks = isinstance(config.get("tasks"), str)
    name, out = config.get("tasks" if tasks else "dataset_file"), config.get("output_dir") or "data"
    if not isinstance(name, str) or not isinstance(out, str):
        return None, None
    limit = config.get("max_samples") if isinstance(config.get("max_samples"), int) else None
    given = Path(name)
    exists = Path.is_dir if tasks else Path.is_file
    if given.is_absolute():
        return (given if exists(given) else None), limit
    started_in = run_dir.resolve().parent  # output_dir/run_name -> the directory the run started in
    if not Path(out).is_absolute():
        for _ in Path(out).parts:
            started_in = started_in.parent
    for candidate in (started_in / given, Path.cwd() / given):
        if exists(candidate):
            return candidate, limit
    return None, limit


def load_rows(run_dir: Path) -> tuple[dict[str, Row], str | None]:
    """identity -> Row, and a note when the dataset could not be used."""
    path, limit = find_dataset(run_dir)
    if path is None:
        return {}, "the run's dataset file was not found: failed samples show no prompt"
    try:
        if isinstance(_config(run_dir).get("tasks"), str):
            from trajforge.tasks.load import load_tasks

            oracle = _config(run_dir).get("agent") == "oracle"
            ds = load_tasks(path, skip_invalid=True, max_samples=limit, with_solution=oracle)
        else:
            ds = load_dataset(path, skip_invalid=True, max_samples=limit)
    except DatasetError as e:
        return {}, f"{path}: cannot be read as the run's dataset ({str(e).splitlines()[0]})"
    return {s.identity: Row(s.index, s.task_type, s.prompt[:PROMPT_CAP]) for s in ds.samples}, None

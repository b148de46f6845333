"""The run's dataset, when it can still be found: prompts, indexes and task types by identity.

A failed sample has no record, so its prompt and position are only in the dataset; task_type is
a dataset field records do not carry. config.json names the dataset file as it was given to
`trajforge run` (often relative to the directory the run was started in), so it is looked for
there (derived from the run directory and output_dir) and then relative to the current directory.
A dataset that is gone or no longer valid just leaves those fields empty. A run of `--tasks`
reads its task directories the same way (trajforge.tasks.load).

The rows are held as the runner holds them (runner.scheduling.rows: a few bytes a row, read back by
offset), taken from the run's own rows.idx when the file has not changed since, so a
million-row dataset costs ~30 MB and, usually, no pass over the file.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from pydantic import ValidationError

from trajforge.config import RunConfig
from trajforge.dataset import split_rollout
from trajforge.errors import DatasetError
from trajforge.runner.reader import RunReader, RunRows, key_of
from trajforge.view.summary import PROMPT_CAP

# config.json keys that decide which rows a dataset has (runner.state.rowcache.settings)
_ROW_SETTINGS = ("skip_invalid", "max_samples", "sandbox", "task_types", "check_timeout", "judge_threshold",
                 "samples_per_prompt", "agent")


@dataclass(slots=True)
class Row:
    index: int
    task_type: str | None
    prompt: str


def find_dataset(run_dir: Path) -> tuple[Path | None, int | None]:
    """(dataset path, max_samples) from the run's config.json, or (None, None); the tasks'
    directory for a run of --tasks."""
    config = RunReader(run_dir).config()
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


class DatasetRows:
    """The run's rows, and a way to find the ones the viewer needs: a record's row is where its
    prompt_index says (when the key there is its own), a sample without a record is looked for in
    one pass over the keys for all such samples at once (no index over a million keys is kept)."""

    def __init__(self, rows: RunRows) -> None:
        self.rows = rows

    def __len__(self) -> int:
        """Samples: rows times rollouts."""
        return len(self.rows)

    def task_type_by_key(self, row_key: int, hint: int) -> str | None:
        """The task type of the row with key `row_key`, if it is at `hint` (its record's prompt_index)."""
        keys = self.rows.keys
        return self.rows.task_type_of(hint) if 0 <= hint < len(keys) and keys[hint] == row_key else None

    def rows_of(self, identities: Iterable[str]) -> dict[str, Row]:
        """identity -> its row (index, task type, prompt read back), for those of `identities` here."""
        wanted: dict[int, list[str]] = {}
        for identity in identities:
            wanted.setdefault(key_of(split_rollout(identity)[0]), []).append(identity)
        found: dict[str, Row] = {}
        if not wanted:
            return found
        with self.rows.reader() as f:
            for i, key in enumerate(self.rows.keys):
                if key in wanted:
                    try:
                        s = self.rows.sample(i, 0, f)
                        task_type, prompt = s.task_type, s.prompt[:PROMPT_CAP]
                    except (OSError, DatasetError):
                        task_type, prompt = None, ""  # the file changed since: its row, no prompt to show
                    for identity in wanted[key]:
                        found[identity] = Row(i, task_type, prompt)
        return found


def load_rows(run_dir: Path) -> tuple[DatasetRows | None, str | None]:
    """The run's dataset rows, and a note when the dataset could not be used. Reads nothing of the
    run directory but config.json and rows.idx, and writes nothing."""
    path, limit = find_dataset(run_dir)
    if path is None:
        return None, "the run's dataset file was not found: failed samples show no prompt"
    reader = RunReader(run_dir)
    raw = reader.config()
    try:
        config = RunConfig.model_validate({**{k: raw[k] for k in _ROW_SETTINGS if k in raw},
                                           "dataset_file" if not isinstance(raw.get("tasks"), str) else "tasks": path,
                                           "run_name": run_dir.name})
    except ValidationError:
        config = RunConfig(dataset_file=path, run_name=run_dir.name, skip_invalid=True, max_samples=limit)
    try:
        if config.tasks is not None:
            from trajforge.tasks.load import load_tasks

            rows = RunRows.held(config, load_tasks(path, skip_invalid=True, max_samples=limit,
                                                   with_solution=config.agent == "oracle"))
        else:
            try:
                rows = reader.rows(config)
            except DatasetError:  # the dataset changed since the run: what is still valid of it
                rows = RunRows.read(config.model_copy(update={"skip_invalid": True}))
    except (DatasetError, OSError) as e:
        return None, f"{path}: cannot be read as the run's dataset ({str(e).splitlines()[0]})"
    return DatasetRows(rows), None

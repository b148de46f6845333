"""What an export reads: a run directory or a trajectories JSONL file, streamed line by line.

A run directory contributes its `trajectories.jsonl` plus `statistics.json` and `config.json`
(for the dataset card); a file named `trajectories.jsonl` inside a run directory does too. Lines
may be saved ShareGPT records or lines of an earlier `openai` export, which are converted back to
records, so every format can be made from either. A bad line stops the export with one message
naming the file, the line and the problem.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from trajforge.errors import InputError, UsageError
from trajforge.export.convert import ConversionError, to_record
from trajforge.export.filters import record_task_type, row_identity
from trajforge.jsonio import dumps, not_regular
from trajforge.run_layout import RunLayout
from trajforge.runner.reader import RunReader


def as_record(obj: dict[str, Any]) -> dict[str, Any]:
    """A saved record as it is, or the record a line of an `openai` export came from (the viewer
    reads both too). Raises ValueError saying what the line is not."""
    if "conversations" in obj:
        return obj
    if "messages" not in obj:
        raise ValueError("field 'conversations' is missing (not a trajectory record, nor an openai export line)")
    try:
        return to_record(obj)
    except (ConversionError, KeyError, TypeError, AttributeError) as e:
        raise ValueError(f"not an openai export line: {_reason(e)}") from None


@dataclass
class Source:
    path: Path  # the JSONL file read
    run_dir: Path | None = None
    statistics: dict[str, Any] | None = None
    config: dict[str, Any] | None = None
    line: int = 0  # line number of the last record read
    _task_types: dict[str, str | None] | None = field(default=None, repr=False)

    def records(self) -> Iterator[tuple[bytes, dict[str, Any]]]:
        """(the saved line, its decoded record) for every non-blank line, in file order."""
        try:
            f = self.path.open("rb")
        except OSError as e:
            raise InputError(f"{self.path}: cannot read: {e.strerror or e}") from None
        with f:
            for self.line, raw in enumerate(f, start=1):
                if not raw.strip():
                    continue
                try:
                    obj = orjson.loads(raw)
                except orjson.JSONDecodeError as e:
                    raise self.error(f"invalid JSON at column {e.colno}: {e.msg}") from None
                if not isinstance(obj, dict):
                    raise self.error(f"a line must be a JSON object, not {type(obj).__name__}")
                if "conversations" not in obj:
                    try:
                        obj = as_record(obj)  # a line of an earlier openai export
                    except ValueError as e:
                        raise self.error(str(e)) from None
                    raw = dumps(obj) + b"\n"
                yield (raw if raw.endswith(b"\n") else raw + b"\n"), obj

    def error(self, message: str) -> InputError:
        return InputError(f"{self.path}:{self.line}: {message}")

    def task_type(self, record: dict[str, Any], dataset_file: Path | None) -> str | None:
        """A record's task type: from the record, else from its row of the run's dataset."""
        own = record_task_type(record)
        if own is not None:
            return own
        if self._task_types is None:
            self._task_types = _dataset_task_types(dataset_file or self._config_dataset())
        return self._task_types.get(row_identity(str(record.get("sample_id"))))

    def _config_dataset(self) -> Path:
        name = (self.config or {}).get("dataset_file")
        if not name:
            raise UsageError("--task_type: the records carry no task type and no run config names the "
                             "dataset; pass --dataset_file")
        return Path(name)


def _reason(e: Exception) -> str:
    return str(e) if isinstance(e, ConversionError) else f"{type(e).__name__}: {e}"


def _dataset_task_types(path: Path) -> dict[str, str | None]:
    from trajforge.dataset import load_dataset
    from trajforge.errors import DatasetError

    if not path.is_file():
        raise UsageError(f"--task_type: dataset {path} (to look up task types) does not exist; pass --dataset_file")
    try:
        ds = load_dataset(path, skip_invalid=True)
    except DatasetError as e:
        raise InputError(f"--task_type: cannot read task types from {path}: {e}") from None
    return {s.identity: s.task_type for s in ds.samples}


def open_source(path: Path) -> Source:
    if path.is_dir():
        run_dir, file = path, RunLayout(path).trajectories
        if (kind := not_regular(file, follow_symlinks=True)) is not None:
            raise InputError(f"{file}: {kind}, not a regular file")
        if not file.is_file():
            raise InputError(f"{path}: no {file.name} in this directory (is it a run directory? "
                             "a run that never finished its merge can be completed with --resume)")
    elif path.is_file():
        file = path
        beside = RunLayout(path.parent)
        run_dir = beside.root if path == beside.trajectories and beside.config.exists() else None
    elif (kind := not_regular(path, follow_symlinks=True)) is not None:
        raise InputError(f"{path}: {kind}, not a regular file or a run directory")
    else:
        raise InputError(f"{path}: no such file or directory")
    src = Source(file, run_dir)
    if run_dir is not None:  # without them the card says a figure is unknown; the trajectories are what matters
        reader = RunReader(run_dir)
        src.statistics, src.config = reader.statistics() or None, reader.config() or None
    return src

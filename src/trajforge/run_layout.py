"""Every path of a run directory: each file name of a run is spelled here and nowhere else.

A run directory (`--output_dir`/`--run_name`) holds:

- the data: batch_N.jsonl, every record as it was written (runner.state.store);
- what the end of each invocation makes from it: trajectories.jsonl (and any other run output,
  runner.reporting.outputs) and statistics.json; config.json, the configuration of the last invocation;
- the runner's bookkeeping: checkpoint.json, finished.idx and journal.jsonl (runner.state.checkpoint),
  rows.idx (runner.state.rowcache), and .lock, held by the process running it (runner.state.rundir);
- what samples leave: workspaces/ (--keep_workspaces), builds/ (image build logs) and verifier_logs/
  (what a task's tests wrote to /logs/verifier, capped per sample).

Temporary files of atomic writes are `.NAME.XXXX.tmp` beside their target (trajforge.jsonio).
A leaf: it imports nothing of trajforge, so the runner, the executors, the viewer, the exporter
and the compressor all take their paths from it. Reading a run is runner.reader's.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

TRAJECTORIES = "trajectories.jsonl"
BATCHES = "batch_*.jsonl"  # the batch files' names, as a glob
_BATCH = re.compile(r"batch_(\d+)\.jsonl")


@dataclass(frozen=True)
class RunLayout:
    root: Path

    @property
    def checkpoint(self) -> Path:
        return self.root / "checkpoint.json"

    @property
    def finished_index(self) -> Path:
        return self.root / "finished.idx"

    @property
    def journal(self) -> Path:
        return self.root / "journal.jsonl"

    @property
    def rows_cache(self) -> Path:
        return self.root / "rows.idx"

    @property
    def trajectories(self) -> Path:
        return self.root / TRAJECTORIES

    @property
    def statistics(self) -> Path:
        return self.root / "statistics.json"

    @property
    def config(self) -> Path:
        return self.root / "config.json"

    @property
    def lock(self) -> Path:
        return self.root / ".lock"

    @property
    def workspaces(self) -> Path:
        return self.root / "workspaces"

    @property
    def builds(self) -> Path:
        return self.root / "builds"

    @property
    def verifier_logs(self) -> Path:
        return self.root / "verifier_logs"

    @property
    def service_rows(self) -> Path:
        """The rollout service's dataset: every accepted group's row, once per rollout, appended."""
        return self.root / "service_rows.jsonl"

    @property
    def service_lanes(self) -> Path:
        """The rollout service's other lanes (groups with a policy of their own): a run directory each."""
        return self.root / "lanes"

    @property
    def service_tasks(self) -> Path:
        """A rollout service's task lane's --tasks: one link per rollout to its group's task copy."""
        return self.root / "service_tasks"

    @property
    def service_task_copies(self) -> Path:
        """A rollout service's task lane's copies of the accepted tasks, one per group."""
        return self.root / "service_task_copies"

    @property
    def service_state(self) -> Path:
        """The rollout service's groups, their rollouts, the stream's cursor and the acks (sqlite3)."""
        return self.root / "service.sqlite"

    def output(self, name: str) -> Path:
        """A run output by its file name (runner.reporting.outputs.RUN_OUTPUTS)."""
        return self.root / name

    def batch(self, n: int) -> Path:
        return self.root / f"batch_{n}.jsonl"

    def batch_files(self) -> list[Path]:
        """Every batch_N.jsonl, by N."""
        files = [p for p in self.root.glob(BATCHES) if _BATCH.fullmatch(p.name)]
        return sorted(files, key=batch_number)

    def results(self) -> tuple[Path, ...]:
        """The files an invocation's end leaves (the batch files aside)."""
        return self.checkpoint, self.trajectories, self.statistics, self.config

    def state(self) -> tuple[Path, ...]:
        """The rest of the bookkeeping: checkpoint.json's index and journal, the dataset pass."""
        return self.finished_index, self.journal, self.rows_cache

    def has_results(self) -> bool:
        """Whether a run wrote anything here: a batch file, checkpoint.json or trajectories.jsonl."""
        return bool(self.batch_files()) or self.checkpoint.exists() or self.trajectories.exists()

    def temporaries(self) -> list[Path]:
        """Temporary files of atomic writes (`.NAME.XXXX.tmp`)."""
        return list(self.root.glob(".*.tmp"))


def batch_number(path: Path) -> int:
    """N of a batch_N.jsonl path (RunLayout.batch_files lists only such paths)."""
    m = _BATCH.fullmatch(path.name)
    assert m is not None, path
    return int(m.group(1))

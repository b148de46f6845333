"""The run directory: exclusive lock, refusal to mix runs, --overwrite, saved configuration.

One process owns a run directory at a time (an flock on `.lock`, released by the kernel if the
process dies). A directory that already holds results is only reused with --resume, or wiped
with --overwrite.
"""

from __future__ import annotations

import fcntl
import os
import shutil
from pathlib import Path
from typing import Any

from trajforge.errors import RunStateError
from trajforge.jsonio import atomic_write_json
from trajforge.runner.store import batch_files

RESULT_FILES = ("checkpoint.json", "trajectories.jsonl", "statistics.json", "config.json")


class RunDir:
    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock_fd: int | None = None

    def has_results(self) -> bool:
        return bool(batch_files(self.path)) or any((self.path / f).exists() for f in RESULT_FILES[:2])

    def acquire(self, *, resume: bool, overwrite: bool) -> None:
        """Lock the directory, then check it may be used as asked. Raises RunStateError."""
        try:
            self.path.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise RunStateError(f"{self.path}: cannot create run directory: {e.strerror or e}") from None
        fd = os.open(self.path / ".lock", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise RunStateError(f"{self.path}: another trajforge process is running this run; "
                                "wait for it to finish or use another --run_name") from None
        self._lock_fd = fd
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        if self.has_results() and not resume:
            if not overwrite:
                self.release()
                raise RunStateError(f"{self.path} already holds results of run '{self.path.name}': "
                                    "pass --resume to continue it, or --overwrite to delete it and start over")
            self._wipe()

    def _wipe(self) -> None:
        for p in batch_files(self.path):
            p.unlink()
        for name in RESULT_FILES:
            (self.path / name).unlink(missing_ok=True)
        shutil.rmtree(self.path / "workspaces", ignore_errors=True)

    def save_config(self, masked: dict[str, Any]) -> None:
        atomic_write_json(self.path / "config.json", masked)

    def release(self) -> None:
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None

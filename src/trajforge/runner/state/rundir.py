"""The run directory: exclusive lock, refusal to mix runs, --overwrite, saved configuration.

One process owns a run directory at a time (an flock on `.lock`, released by the kernel if the
process dies). A directory that already holds results is only reused with --resume, or wiped
with --overwrite. Temporary files of atomic writes that a killed process left behind (a SIGKILL
during the final merge leaves a partial `.trajectories.jsonl.*.tmp` of many MB) are removed
once the lock is held, so they can never belong to a live writer. A start refused after the lock
was taken (a distribution none of whose toolsets can be offered here) leaves no directory behind
that this invocation made (`release(discard=True)`).
"""

from __future__ import annotations

import fcntl
import os
import shutil
from pathlib import Path
from typing import Any

from trajforge.errors import OutputError, RunStateError
from trajforge.jsonio import atomic_write_bytes, dumps_pretty
from trajforge.redact import REGISTRY
from trajforge.run_layout import RunLayout


class RunDir:
    def __init__(self, layout: RunLayout) -> None:
        self.layout = layout
        self.path = layout.root
        self._lock_fd: int | None = None
        self._made: list[Path] = []  # directories this invocation created, deepest last

    def acquire(self, *, resume: bool, overwrite: bool) -> None:
        """Lock the directory, then check it may be used as asked. Raises RunStateError."""
        self._made = [d for d in (self.path.parent, self.path) if not d.exists()]
        try:
            self.path.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise RunStateError(f"{self.path}: cannot create run directory: {e.strerror or e}") from None
        lock = self.layout.lock
        try:
            fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as e:
            raise OutputError(lock, e) from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise RunStateError(f"{self.path}: another trajforge process is running this run; "
                                "wait for it to finish or use another --run_name") from None
        self._lock_fd = fd
        try:
            os.ftruncate(fd, 0)
            os.write(fd, f"{os.getpid()}\n".encode())
        except OSError as e:
            self.release()
            raise OutputError(lock, e) from None
        if self.layout.has_results() and not resume:
            if not overwrite:
                self.release()
                raise RunStateError(f"{self.path} already holds results of run '{self.path.name}': "
                                    "pass --resume to continue it, or --overwrite to delete its results and start over")
            self._wipe()

    def _wipe(self) -> None:
        for p in self.layout.batch_files():
            p.unlink()
        for p in (*self.layout.results(), *self.layout.state()):
            p.unlink(missing_ok=True)
        shutil.rmtree(self.layout.workspaces, ignore_errors=True)

    def remove_leftovers(self) -> int:
        """Delete temporary files of atomic writes (`.NAME.XXXX.tmp`) left by a killed process.
        Call with the lock held. Returns how many were removed."""
        removed = 0
        for p in self.layout.temporaries():
            try:
                p.unlink()
                removed += 1
            except FileNotFoundError:
                pass
            except OSError as e:
                raise OutputError(p, e) from None
        return removed

    def save_config(self, masked: dict[str, Any]) -> None:
        path = self.layout.config
        try:
            atomic_write_bytes(path, REGISTRY.bytes(dumps_pretty(masked)))
        except OSError as e:
            raise OutputError(path, e) from None

    def release(self, *, discard: bool = False) -> None:
        """Unlock; with `discard`, also remove the directories this invocation made if they hold
        nothing but the lock (a refused start)."""
        if discard and self._lock_fd is not None and self._made and os.listdir(self.path) == [self.layout.lock.name]:
            self.layout.lock.unlink()
            for d in reversed(self._made):
                try:
                    d.rmdir()  # only when empty: anything else in it is someone's
                except OSError:
                    break
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None

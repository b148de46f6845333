"""checkpoint.json: the outcome of every finished sample, and the history of invocations.

Batch files are the source of truth for kept trajectories; the checkpoint adds what they cannot
say: discarded samples (final, never re-run) and failed ones (retried on resume), plus each
invocation's duration for cumulative statistics. It is replaced atomically, at most about once a
second while samples finish (the interval grows with the file's size) and always at the end.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from trajforge.errors import RunStateError
from trajforge.jsonio import atomic_write_bytes
from trajforge.runner.outcome import Outcome

VERSION = 1


@dataclass
class Checkpoint:
    path: Path
    run_name: str
    samples: dict[str, dict[str, Any]] = field(default_factory=dict)  # identity -> outcome summary
    invocations: list[dict[str, Any]] = field(default_factory=list)
    _last_save: float = 0.0
    _save_cost: float = 0.0
    _dirty: bool = False
    _current: dict[str, Any] | None = None
    _invocation_t0: float = 0.0

    @classmethod
    def load(cls, path: Path, run_name: str) -> Checkpoint:
        if not path.exists():
            return cls(path, run_name)
        try:
            data = orjson.loads(path.read_bytes())
        except (OSError, orjson.JSONDecodeError) as e:
            raise RunStateError(f"{path}: checkpoint is unreadable ({e}); move it away to rebuild from batch files") from None
        if not isinstance(data, dict) or data.get("version") != VERSION:
            raise RunStateError(f"{path}: unsupported checkpoint format")
        return cls(path, run_name, data.get("samples", {}), data.get("invocations", []))

    def discarded(self) -> set[str]:
        """Discarded samples are final: never run again (batch files tell what else is finished)."""
        return {k for k, v in self.samples.items() if v["status"] == "discarded"}

    def record(self, o: Outcome) -> None:
        entry: dict[str, Any] = {"status": o.status, "batch": o.batch_num, "attempts": o.attempts}
        if o.reason:
            entry["reason"] = o.reason
        if o.status == "failed" and o.message:
            entry["message"] = o.message[:500]
        if o.usage:
            entry["usage"] = o.usage
            entry["api_calls"] = o.api_calls
        prev = self.samples.get(o.identity)
        if prev is not None and prev["status"] != "failed" and o.status == "failed":
            return  # a finished sample never becomes failed again
        self.samples[o.identity] = entry
        self._dirty = True

    def begin_invocation(self, started_wall: float) -> dict[str, Any]:
        """Record this invocation now, so its duration counts even if the process is killed."""
        entry: dict[str, Any] = {"started": started_wall, "seconds": 0.0, "ran": 0, "interrupted": False}
        self.invocations.append(entry)
        self._invocation_t0 = time.monotonic()
        self._current = entry
        return entry

    def save(self, *, force: bool = False) -> None:
        now = time.monotonic()
        if self._current is not None:
            self._current["seconds"] = round(now - self._invocation_t0, 3)
        if not force and (not self._dirty or now - self._last_save < max(1.0, 20 * self._save_cost)):
            return
        t0 = time.perf_counter()
        body = {"version": VERSION, "run_name": self.run_name, "updated": time.time(),
                "samples": self.samples, "invocations": self.invocations}
        atomic_write_bytes(self.path, orjson.dumps(body))
        self._save_cost = time.perf_counter() - t0
        self._last_save = time.monotonic()
        self._dirty = False

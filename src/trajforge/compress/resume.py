"""Durable, resumable output: `<output>.partial`, its checkpoint, and the final atomic rename.

While a run works, whole output lines go to `<output>.partial` and per-trajectory metrics to
`<output>.partial.metrics.jsonl`. Every couple of seconds both are fsynced and then the
checkpoint `<output>.partial.state.json` is replaced atomically; it records how far the input was
consumed (byte offset, line, trajectory number), the byte length of both files at that moment,
the run totals, and a fingerprint of the input and settings. Anything after the recorded lengths
(a line being written when the process died) is cut off on resume, so a killed run continues
with every input line written exactly once and in order. The final output only ever appears by
os.replace of a complete `.partial`, so the output path never holds a partial file. An exclusive
lock on the partial file keeps two runs from writing the same output.
"""

from __future__ import annotations

import fcntl
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import orjson

from trajforge.compress.metrics import Totals
from trajforge.compress.records import Position
from trajforge.errors import RunStateError
from trajforge.jsonio import atomic_write_json

COMMIT_SECONDS = 2.0
STATE_VERSION = 1
_WRITE_BUFFER = 1 << 20


@dataclass(frozen=True, slots=True)
class Paths:
    output: Path
    partial: Path
    details: Path
    state: Path

    @classmethod
    def for_output(cls, output: Path) -> Paths:
        return cls(output, output.with_name(output.name + ".partial"),
                   output.with_name(output.name + ".partial.metrics.jsonl"),
                   output.with_name(output.name + ".partial.state.json"))


@dataclass(slots=True)
class Resumed:
    position: Position
    output_lines: int
    totals: Totals


def fingerprint(input_file: Path, settings: dict[str, Any]) -> dict[str, Any]:
    st = input_file.stat()
    return {"input": str(input_file.resolve()), "size": st.st_size, "mtime_ns": st.st_mtime_ns,
            "settings": orjson.loads(orjson.dumps(settings, option=orjson.OPT_SORT_KEYS))}


class DurableWriter:
    """Appends output and detail lines; commits checkpoints; finishes with an atomic rename."""

    def __init__(self, paths: Paths) -> None:
        self.paths = paths
        self._out: BinaryIO | None = None
        self._details: BinaryIO | None = None
        self._fp: dict[str, Any] = {}
        self.position = Position()
        self.output_lines = 0
        self.totals = Totals()
        self._last_commit = 0.0

    def open(self, fp: dict[str, Any], fresh: bool) -> Resumed | None:
        """Open (or resume) the partial files; returns what was already done, None when starting anew."""
        self._fp = fp
        p = self.paths
        p.partial.parent.mkdir(parents=True, exist_ok=True)
        # A checkpoint without its partial file is left over from a run that had already published
        # its output (killed between the rename and the clean-up): nothing to resume.
        had_partial = p.partial.exists()
        out = p.partial.open("a+b", buffering=_WRITE_BUFFER)
        try:
            fcntl.flock(out.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            out.close()
            raise RunStateError(f"another compressor is writing {p.output} (lock held on {p.partial})") from None
        self._out = out
        try:
            return self._restore(None if fresh or not had_partial else self._read_state())
        except BaseException:
            self.close()
            raise

    def _restore(self, state: dict[str, Any] | None) -> Resumed | None:
        p = self.paths
        assert self._out is not None
        if state is not None and state["fingerprint"] != self._fp:
            raise RunStateError(
                f"{p.partial} holds an unfinished run over a different input or different settings; "
                "re-run with the same input and flags to continue it, or pass --fresh to start over")
        out_bytes = state["output_bytes"] if state else 0
        det_bytes = state["details_bytes"] if state else 0
        self._details = p.details.open("a+b", buffering=_WRITE_BUFFER)
        for f, size, path in ((self._out, out_bytes, p.partial), (self._details, det_bytes, p.details)):
            if f.seek(0, os.SEEK_END) < size:
                raise RunStateError(f"{path} is shorter than its checkpoint says; pass --fresh to start over")
            f.truncate(size)  # drop lines written after the last checkpoint
            f.seek(size)
        resumed = None
        if state is not None:
            self.position = Position(**state["position"])
            self.output_lines = state["output_lines"]
            self.totals = Totals.from_dict(state["totals"])
            resumed = Resumed(self.position, self.output_lines, self.totals)
        self.commit(force=True)
        return resumed

    def _read_state(self) -> dict[str, Any] | None:
        try:
            state = orjson.loads(self.paths.state.read_bytes())
        except FileNotFoundError:
            return None
        except (OSError, orjson.JSONDecodeError):
            raise RunStateError(f"{self.paths.state} is unreadable; pass --fresh to start over") from None
        if not isinstance(state, dict) or state.get("version") != STATE_VERSION:
            raise RunStateError(f"{self.paths.state} is from another version; pass --fresh to start over")
        return state

    @property
    def is_open(self) -> bool:
        return self._out is not None

    def write(self, output: bytes | None, detail: bytes, position: Position) -> None:
        """Record one consumed input line: its output line (None: nothing written) and its metrics."""
        assert self._out is not None and self._details is not None
        if output is not None:
            self._out.write(output)
            self.output_lines += 1
        self._details.write(detail)
        self.position = position
        self.commit()

    def skip(self, position: Position) -> None:
        """Record an input line that produces nothing (not in the sample)."""
        self.position = position
        self.commit()

    def commit(self, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - self._last_commit < COMMIT_SECONDS:
            return
        assert self._out is not None and self._details is not None
        for f in (self._out, self._details):
            f.flush()
            os.fsync(f.fileno())
        atomic_write_json(self.paths.state, {
            "version": STATE_VERSION, "fingerprint": self._fp, "position": _pos(self.position),
            "output_lines": self.output_lines, "output_bytes": self._out.tell(),
            "details_bytes": self._details.tell(), "totals": self.totals.as_dict()})
        self._last_commit = now

    def finish(self, write_report: Any) -> None:
        """Commit, let `write_report(details_path)` write the metrics, then publish the output."""
        self.commit(force=True)
        write_report(self.paths.details)
        os.replace(self.paths.partial, self.paths.output)
        self.close()
        for leftover in (self.paths.state, self.paths.details):
            leftover.unlink(missing_ok=True)

    def close(self) -> None:
        for f in (self._details, self._out):
            if f is not None:
                f.close()
        self._out = self._details = None


def _pos(p: Position) -> dict[str, int]:
    return {"offset": p.offset, "line_no": p.line_no, "ordinal": p.ordinal}

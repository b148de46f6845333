"""Run `trajforge` and hold it at a named point of its bookkeeping, for a test to SIGKILL it there.

`python tests/support/crash_at.py POINT ARGS...` runs `trajforge ARGS...` with one function of
the run wrapped: when the run reaches POINT, the process prints `at POINT` on stdout and waits,
writing nothing more, until it is killed. The test reads that line (the event the code writes at
the exact point: no sleep, no timing) and sends SIGKILL, so the files are left exactly as a kill
between those two writes leaves them. Points, in the order a resume reaches them:

- batch-appended: a record is in its batch file; the checkpoint's journal does not have it.
- journal-torn: half of a journal group holding a finished sample is written, the rest never.
- index-appended: a compaction appended new entries to finished.idx; checkpoint.json is the old one.
- snapshot-written: a compaction wrote checkpoint.json; journal.jsonl is the old generation's.
- trajectories-torn: half of the records the merge appends to trajectories.jsonl are written.
- trajectories-appended: the merge appended and fsynced; its state is not in the checkpoint yet.
- merged-anew: a whole merge replaced trajectories.jsonl; its state is not in the checkpoint yet.
- ran-N: the journal committed an invocation entry that says it ended N samples or more.
"""

from __future__ import annotations

import os
import signal
import sys
from typing import Any

import orjson

from trajforge.redact import REGISTRY
from trajforge.runner.reporting import append, report
from trajforge.runner.state import journal
from trajforge.runner import invocation
from trajforge.runner.state.finished import Finished
from trajforge.runner.state.store import BatchStore


def hold(point: str) -> None:
    sys.stdout.write(f"at {point}\n")
    sys.stdout.flush()
    while True:  # until SIGKILL (the run's own SIGINT/SIGTERM handlers may return from pause)
        signal.pause()


def after(owner: Any, name: str, point: str, when: Any = lambda *a, **k: True) -> None:
    original = getattr(owner, name)

    def wrapped(*args: Any, **kwargs: Any) -> Any:
        go = when(*args, **kwargs)
        result = original(*args, **kwargs)
        if go:
            hold(point)
        return result

    setattr(owner, name, wrapped)


def torn_journal() -> None:
    original = journal.Journal.commit

    def commit(self: journal.Journal, line: dict[str, Any]) -> None:
        data = REGISTRY.bytes(b"\n".join([*self._pending, orjson.dumps(line)]) + b"\n")
        if b'"done"' in data:
            f = self._open()
            os.write(f.fileno(), data[: len(data) // 2])
            os.fsync(f.fileno())
            hold("journal-torn")
        original(self, line)

    journal.Journal.commit = commit  # type: ignore[method-assign]


def torn_append() -> None:
    def write_all(f: Any, data: bytes) -> None:
        if data:
            os.write(f.fileno(), data[: len(data) // 2])
            os.fsync(f.fileno())
            hold("trajectories-torn")

    append._write_all = write_all  # type: ignore[assignment]


def install(point: str) -> None:
    if point == "batch-appended":
        after(BatchStore, "append", point)
    elif point == "journal-torn":
        torn_journal()
    elif point == "index-appended":  # a compaction with new entries, of an index saved before
        after(Finished, "save", point, lambda self, path: self.saved and len(self.keys) > self.saved)
    elif point == "snapshot-written":  # in the compaction after the merge
        finish, rotate = invocation.finish, journal.Journal.rotate
        merged: list[bool] = []

        def finished(*args: Any, **kwargs: Any) -> Any:
            result = finish(*args, **kwargs)
            merged.append(True)
            return result

        def rotated(self: journal.Journal, generation: int) -> None:
            if merged:
                hold(point)
            rotate(self, generation)

        invocation.finish = finished  # type: ignore[assignment]
        journal.Journal.rotate = rotated  # type: ignore[method-assign]
    elif point == "trajectories-torn":
        torn_append()
    elif point == "trajectories-appended":
        after(append, "_append", point)
    elif point == "merged-anew":
        after(report, "merge", point)
    elif point.startswith("ran-"):
        n = int(point.removeprefix("ran-"))
        after(journal.Journal, "commit", point, lambda self, line: line.get("ran", 0) >= n)
    else:
        raise SystemExit(f"crash_at: no point {point!r}")


if __name__ == "__main__":
    install(sys.argv[1])
    sys.argv = ["trajforge", *sys.argv[2:]]
    from trajforge.cli import entry

    entry()

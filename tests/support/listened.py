"""A test-only outcome listener: one file; tests register it with one line (OUTCOME_LISTENERS).

It appends the line of every record it is told trajectories.jsonl will hold to `<run>.listened`
beside the run directory (a file the run itself never reads), the way a trainer's stream would
send it on, and writes each failure message it hears of through the scrubber it was given.
"""

from __future__ import annotations

from typing import BinaryIO

from trajforge.runner.listeners import Ended, ListenerContext


class Listened:
    def __init__(self, context: ListenerContext) -> None:
        self.scrubber = context.scrubber
        self.path = context.run_dir.with_name(context.run_dir.name + ".listened")
        self._f: BinaryIO = self.path.open("ab")
        self.closed = False

    def on_outcome(self, ended: Ended) -> None:
        assert not self.closed
        if ended.kept:
            assert ended.line is not None and ended.location is not None  # saved before any listener of ours
            self._f.write(ended.line)
        elif ended.outcome.message:
            self._f.write(b"# " + self.scrubber.bytes(ended.outcome.message.encode()).replace(b"\n", b" ") + b"\n")

    def close(self) -> None:
        self.closed = True
        self._f.close()


def make(context: ListenerContext) -> Listened:
    return Listened(context)

"""Progress of a compression run on stderr: a rich bar on a terminal, else a status line now and then.

Logs and CI output get one plain line every STATUS_SECONDS instead of a redrawn bar, so they stay
readable. Nothing here affects the run.
"""

from __future__ import annotations

import sys
import time
from typing import Any, TextIO

from trajforge.compress.metrics import Totals

STATUS_SECONDS = 10.0


def _status(t: Totals) -> str:
    return (f"{t.compressed} compressed, {t.skipped_under_target} under budget, {t.over_limit} over limit, "
            f"{t.failed} failed")


class Progress:
    def __init__(self, total: int, done: int, stream: TextIO | None = None) -> None:
        self._stream = stream or sys.stderr
        self._total = total
        self._done = done
        self._bar: Any = None
        self._task: Any = None
        self._last = time.monotonic()
        if self._stream.isatty():
            from rich.console import Console
            from rich.progress import BarColumn, MofNCompleteColumn, Progress as RichProgress, TextColumn, \
                TimeElapsedColumn, TimeRemainingColumn

            self._bar = RichProgress(TextColumn("compressing"), BarColumn(), MofNCompleteColumn(),
                                     TimeElapsedColumn(), TimeRemainingColumn(), TextColumn("{task.description}"),
                                     console=Console(file=self._stream), transient=False)
            self._task = self._bar.add_task("", total=total, completed=done)
            self._bar.start()

    def advance(self, totals: Totals) -> None:
        self._done += 1
        if self._bar is not None:
            self._bar.update(self._task, completed=self._done, description=_status(totals))
            return
        now = time.monotonic()
        if now - self._last >= STATUS_SECONDS:
            self._last = now
            print(f"compress: {self._done}/{self._total} trajectories; {_status(totals)}",
                  file=self._stream, flush=True)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.stop()
            self._bar = None

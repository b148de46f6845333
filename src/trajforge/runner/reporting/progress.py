"""Progress by sample: a live rich bar on a terminal, a periodic one-line status otherwise.

Updates are cheap counter bumps; rendering happens on rich's own refresh thread (a few times a
second) or, without a terminal, at most once per `interval` seconds, so progress costs nothing
per sample at high throughput.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import Any, TextIO

from trajforge.runner.reporting.figures import usd
from trajforge.sample.outcome import Outcome


class Progress:
    def __init__(self, total: int, *, already: int = 0, interval: float = 10.0,
                 stream: TextIO | None = None, live: bool | None = None) -> None:
        self.total = total
        self.already = already
        self.done = self.failed = self.discarded = 0
        self.tokens = 0
        self.cost = 0.0
        self.interval = interval
        self.stream = stream or sys.stderr
        self.live = self.stream.isatty() if live is None else live
        self._start = time.monotonic()
        self._last_line = self._start
        self._bar: Any = None
        self._task: Any = None
        self.extra: Callable[[], str] | None = None  # more status (runner.reporting.monitor: spend, model traffic)

    def __enter__(self) -> Progress:
        if self.live:
            from rich.console import Console
            from rich.progress import BarColumn, MofNCompleteColumn, Progress as Bar, TextColumn, TimeRemainingColumn

            self._bar = Bar(TextColumn("[bold]samples"), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn(),
                            TextColumn("{task.fields[info]}"), console=Console(file=self.stream),
                            refresh_per_second=4)
            self._bar.__enter__()
            self._task = self._bar.add_task("run", total=self.total, completed=self.already, info="")
        return self

    def __exit__(self, *exc: object) -> None:
        if self._bar is not None:
            self._bar.__exit__(None, None, None)
        else:
            self._emit()

    def update(self, o: Outcome, *, dropped: bool = False) -> None:
        """`dropped`: a finished record the merge will drop (runner.reporting.merge.calls_unknown_tools),
        counted as discarded here, as the end-of-run table counts it."""
        if o.status == "done" and not dropped:
            self.done += 1
            if o.record:
                u = o.record.get("usage", {})
                self.tokens += u.get("prompt_tokens", 0) + u.get("completion_tokens", 0)
                self.cost += u.get("cost", 0.0)
        elif o.status == "failed":
            self.failed += 1
        else:  # a dropped record's usage is not counted, as in the table (runner.reporting.report)
            self.discarded += 1
            if o.usage:
                self.tokens += o.usage.get("prompt_tokens", 0) + o.usage.get("completion_tokens", 0)
                self.cost += o.usage.get("cost", 0.0)
        if self._bar is not None:
            self._bar.update(self._task, advance=1, info=self._info())
        elif time.monotonic() - self._last_line >= self.interval:
            self._emit()

    def skip(self, n: int) -> None:
        """`n` samples will never run (rollouts of a solved row): they leave the total."""
        self.total -= n
        if self._bar is not None:
            self._bar.update(self._task, total=self.total)

    def tick(self) -> None:
        """Called periodically: without a terminal, print the status line when it is due."""
        if not self.live and time.monotonic() - self._last_line >= self.interval:
            self._emit()

    def _info(self) -> str:
        elapsed = max(time.monotonic() - self._start, 1e-9)
        rate = (self.done + self.failed + self.discarded) / elapsed
        return (f"failed {self.failed} discarded {self.discarded} | {rate:.1f}/s | "
                f"{self.tokens:,} tok | samples' cost {usd(self.cost)}" + (f" | {self.extra()}" if self.extra else ""))

    def line(self) -> str:
        n = self.already + self.done + self.failed + self.discarded
        elapsed = time.monotonic() - self._start
        processed = n - self.already
        # No sample finished yet in this invocation: no rate to extrapolate from, so no estimate.
        eta = f"{(self.total - n) * elapsed / processed:.0f}s" if processed else "-"
        return f"progress {n}/{self.total} done {self.done} {self._info()} | eta {eta}"

    def _emit(self) -> None:
        self._last_line = time.monotonic()
        print(self.line(), file=self.stream, flush=True)

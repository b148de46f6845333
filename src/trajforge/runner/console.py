"""The run's stdout and stderr: scrubbed of secrets, and never fatal to write to.

Status output is a courtesy; the run's product is its files. So a reader that went away
(`trajforge run ... | head -1`, a closed terminal) or a full pipe error must not stop the run
before it writes trajectories.jsonl and statistics.json: writes that fail are dropped, and the
dead descriptor is pointed at /dev/null so the interpreter's final flush does not fail either.
Every line also passes through the secret scrubber (trajforge.redact) on its way out. A stream
that was closed before the process started (`2>&-`, `>&-`: Python then sets it to None) is a
SafeStream that drops everything from the start.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator
from typing import Any, TextIO

from trajforge.redact import REGISTRY, Scrubber


class SafeStream:
    """A text stream wrapper: scrubs what is written and drops it when the write fails."""

    def __init__(self, inner: TextIO | None, scrubber: Scrubber = REGISTRY) -> None:
        self._inner = inner
        self._scrubber = scrubber
        self.broken = inner is None  # started without that stream: nothing to write to

    def write(self, s: str) -> int:
        if not self.broken:
            try:
                self._inner.write(self._scrubber.text(s))
            except (OSError, ValueError):  # EPIPE, EIO, a closed file
                self._break()
        return len(s)

    def flush(self) -> None:
        if not self.broken:
            try:
                self._inner.flush()
            except (OSError, ValueError):
                self._break()

    def _break(self) -> None:
        self.broken = True
        # Point the descriptor at /dev/null: whatever else writes to it (the interpreter's
        # final flush, a library holding the raw stream) then succeeds silently.
        with contextlib.suppress(OSError, ValueError, AttributeError):
            fd = self._inner.fileno()
            null = os.open(os.devnull, os.O_WRONLY)
            os.dup2(null, fd)
            os.close(null)

    def isatty(self) -> bool:
        try:
            return self._inner is not None and self._inner.isatty()
        except (OSError, ValueError):
            return False

    def __getattr__(self, name: str) -> Any:  # encoding, fileno, errors... of the real stream
        if self._inner is None:
            raise AttributeError(f"{name} (the process has no such stream)")
        return getattr(self._inner, name)


@contextlib.contextmanager
def safe_std_streams() -> Iterator[None]:
    """Replace sys.stdout and sys.stderr by SafeStreams for the duration of a run."""
    saved = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = SafeStream(saved[0]), SafeStream(saved[1])  # type: ignore[assignment]
    try:
        yield
    finally:
        for wrapper in (sys.stdout, sys.stderr):
            wrapper.flush()
        sys.stdout, sys.stderr = saved

"""A sample's working time: the part of its wall-clock time that its `--timeout` counts.

The per-sample limit is there to cut a sample that is stuck (a hung model call, a command that
never ends), not one the run keeps waiting: a turn at the model gate, a run-wide Retry-After
pause, an empty token bucket, a retry's backoff, a free local model instance or a sandbox being
made are the run's pressure, and under a provider that refuses often they can add up to more than
the limit for a sample that is perfectly healthy. So code that waits wraps the wait in
`waiting()`: while any wait of the sample is in progress its clock stands still and the limit's
deadline moves out by as much (asyncio.Timeout.reschedule). Concurrent waits of one sample (a
tool's parallel model calls) stop it once: the clock runs again when the last one ends.

The running sample's clock is found through a context variable, as model.spend finds its meter,
so a tool's auxiliary model call made deep inside a toolset stops the same clock without being
handed it; code that runs outside a sample (the compressor, the client's own tests) has none and
`waiting()` does nothing there. The wall-clock limit (`--sample_wall_timeout`) is a plain
asyncio.timeout beside this one: it never stops. `observe` tells another part of the sample when
it starts and stops waiting (the sample layer: a sample parked at the gate is no demand for a
sandbox made ahead of time, sandbox/lazy.py).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from contextvars import ContextVar

from trajforge.model import ctxvar


class WorkingClock:
    """Wall and working seconds of one sample since it was made, and the limit it moves."""

    def __init__(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._started = self._loop.time()
        self._waits = 0  # waits in progress
        self._since = 0.0  # when the clock stopped (valid while _waits > 0)
        self._waited = 0.0  # seconds stood still, ended waits only
        self._limit: asyncio.Timeout | None = None
        self._left: float | None = None  # seconds the limit had left when the clock stopped
        self._observers: list[Callable[[bool], None]] = []

    @property
    def wall(self) -> float:
        return self._loop.time() - self._started

    @property
    def working(self) -> float:
        now = self._loop.time()
        waiting = now - self._since if self._waits else 0.0
        return now - self._started - self._waited - waiting

    @contextmanager
    def limiting(self, limit: asyncio.Timeout) -> Iterator[None]:
        """Move `limit` (entered, not yet exited) with this clock while the block runs."""
        self._limit = limit
        if self._waits:  # already waiting: the limit starts stopped
            self._hold(self._loop.time())
        try:
            yield
        finally:
            self._limit, self._left = None, None

    def observe(self, observer: Callable[[bool], None]) -> None:
        """Call `observer(True)` whenever the sample starts waiting, `observer(False)` when it goes on."""
        self._observers.append(observer)

    def stop(self) -> None:
        self._waits += 1
        if self._waits == 1:
            self._since = now = self._loop.time()
            self._hold(now)
            for observer in self._observers:
                observer(True)

    def go(self) -> None:
        self._waits -= 1
        if self._waits:
            return
        for observer in self._observers:
            observer(False)
        now = self._loop.time()
        self._waited += now - self._since
        limit, left, self._left = self._limit, self._left, None
        # An expired limit is cancelling the sample already: nothing to move.
        if limit is not None and left is not None and not limit.expired():
            limit.reschedule(now + left)

    def _hold(self, now: float) -> None:
        limit = self._limit
        if limit is None or limit.expired() or (deadline := limit.when()) is None:
            return
        self._left = max(0.0, deadline - now)
        limit.reschedule(None)


_CURRENT: ContextVar[WorkingClock | None] = ContextVar("trajforge_working_clock", default=None)


def bound(clock: WorkingClock) -> AbstractContextManager[WorkingClock]:
    """Stop `clock` for the waits of this task (and of tasks it starts)."""
    return ctxvar.bound(_CURRENT, clock)


@contextmanager
def waiting() -> Iterator[None]:
    """A wait the running sample's working time does not count (nothing outside a sample)."""
    clock = _CURRENT.get()
    if clock is None:
        yield
        return
    clock.stop()
    try:
        yield
    finally:
        clock.go()

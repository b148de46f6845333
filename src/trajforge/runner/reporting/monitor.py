"""What the run's spend and model traffic look like, now (progress) and over time (statistics).

Every `every` seconds it reads the model gate's counters and the budget, derives per-minute rates
from the change since the previous reading and keeps the point; a long run's series is thinned
(every other point dropped, the interval doubled) so statistics.json stays small. With Ray there
is no gate at the driver (each actor has its own), so only spend is shown and recorded.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from trajforge.model.gate import GateSnapshot, ModelGate
from trajforge.runner.scheduling.budget import Budget
from trajforge.runner.reporting.figures import (
    ConcurrencyFigures, ConcurrencyNote, GatePoint, SeriesPoint, SpendFigures, usd,
)

MAX_POINTS = 720


class RunMonitor:
    def __init__(self, gate: ModelGate | None, budget: Budget, *, every: float = 2.5,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.gate = gate
        self.budget = budget
        self.every = every
        self.series: list[SeriesPoint] = []
        self._clock = clock
        self._t0 = clock()
        self._last: tuple[float, GateSnapshot] | None = (self._t0, gate.snapshot()) if gate else None
        self._rates = (0.0, 0.0, 0.0)  # requests, tokens, 429s per minute over the last interval
        self._record_every = every
        self._last_record = -every
        self.min_limit = gate.ceiling if gate else 0

    def tick(self) -> None:
        now = self._clock()
        gate: GatePoint | None = None
        if self.gate is not None and self._last is not None:
            snap = self.gate.snapshot()
            then, prev = self._last
            per_min = 60.0 / max(now - then, 1e-6)
            self._rates = ((snap.ok - prev.ok) * per_min, (snap.tokens - prev.tokens) * per_min,
                           (snap.overloaded - prev.overloaded) * per_min)
            self._last = (now, snap)
            self.min_limit = min(self.min_limit, snap.limit)
            gate = GatePoint(limit=snap.limit, in_flight=snap.in_flight, waiting=snap.waiting,
                             requests_per_min=round(self._rates[0], 1), tokens_per_min=round(self._rates[1]),
                             rate_limited_per_min=round(self._rates[2], 1))
        if now - self._t0 - self._last_record >= self._record_every:
            self._last_record = now - self._t0
            self.series.append(SeriesPoint(round(now - self._t0, 1), round(self.budget.spent, 6), gate))
            if len(self.series) > MAX_POINTS:
                self.series = self.series[::2]
                self._record_every *= 2

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self.every)
            self.tick()

    def progress_text(self) -> str:
        b = self.budget
        parts = []
        if self.gate is not None:
            snap = self.gate.snapshot()
            parts.append(f"model {snap.in_flight} in flight, limit {snap.limit}/{snap.ceiling}"
                         f"{' (paused: Retry-After)' if snap.paused else ''}, {self._rates[0]:.0f} req/min, "
                         f"{self._rates[2]:.0f} 429s/min")
        projected = b.projected_total()
        spend = f"spent {usd(b.spent)} (every call)" + (f", ~{usd(projected)} projected"
                                                        if projected is not None else "")
        parts.append(spend + (f" of {usd(b.limit)} budget" if b.limit is not None else ""))
        return " | ".join(parts)

    def spend(self) -> SpendFigures:
        """The `spend` section of statistics.json."""
        b = self.budget
        average = b.average()
        return SpendFigures(spent=round(b.spent, 6), this_invocation=round(b.spent_now, 6), max_cost=b.limit,
                            budget_reached=b.reached,
                            average_per_sample=None if average is None else round(average or 0, 6))

    def concurrency(self) -> ConcurrencyFigures | ConcurrencyNote:
        """The `concurrency` section of statistics.json."""
        if self.gate is None:
            return ConcurrencyNote("not collected: with --executor ray each actor adapts on its own")
        snap = self.gate.snapshot()
        return ConcurrencyFigures(adaptive=self.gate.adaptive, ceiling=snap.ceiling, final_limit=snap.limit,
                                  min_limit=self.min_limit, requests=snap.requests, ok=snap.ok,
                                  rate_limited=snap.overloaded, series=self.series)

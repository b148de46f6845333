"""The decisions behind model-call admission, as plain objects fed outcomes and clock values.

- `AimdLimiter`: how many requests to one endpoint may be in flight. It starts at the ceiling
  (`--num_workers`: a healthy provider loses no throughput to a slow start) and grows by about
  one per round trip while the limit is the bottleneck and calls succeed. A 429/503 at once
  lowers the limit to the requests still in flight: they are what the provider accepted, and a
  slot freed by a refusal must not go straight to the next waiter, which would be refused too
  (a storm of instant 429s). Within one round trip that cut stops at half the limit the round
  trip began with; at its end, a round trip that saw refusals leaves the limit at most 0.9 of
  that, one that saw latency climb well above the best seen (the provider queues us) takes 0.9
  of it. Decisions are per round trip because one overshoot comes back as a burst of 429s.
- `TokenBucket`: requests or tokens per minute. A call may start once the bucket holds what it
  needs (its estimate, at most the bucket's size) and may drive it negative; corrections after
  the reply (the real token count) are debited or refunded, so the long-run rate holds.

No asyncio and no clock reads: model.gate owns waiting and time.
"""

from __future__ import annotations

from dataclasses import dataclass, field

DEFAULT_WINDOW = 1.0  # seconds per decision before any latency is measured
MIN_WINDOW = 0.05


@dataclass
class AimdLimiter:
    ceiling: int
    floor: int = 1
    adaptive: bool = True
    latency_tolerance: float = 2.0  # shrink when recent latency exceeds the best seen by this factor
    latency_backoff: float = 0.9
    limit: float = field(init=False)
    window_start: float | None = field(default=None, init=False)
    ok: int = field(default=0, init=False)  # successes in the current window
    overloaded: int = field(default=0, init=False)  # 429/503 replies in the current window
    latency: float | None = field(default=None, init=False)  # EWMA of successful calls' seconds
    best_latency: float | None = field(default=None, init=False)
    decreases: int = field(default=0, init=False)
    window_limit: float = field(init=False)  # the limit when the current window began

    def __post_init__(self) -> None:
        self.ceiling = max(self.floor, self.ceiling)
        self.limit = self.window_limit = float(self.ceiling)

    @property
    def value(self) -> int:
        """Requests that may be in flight now."""
        return max(self.floor, min(self.ceiling, int(self.limit)))

    def window(self) -> float:
        return max(MIN_WINDOW, self.latency if self.latency is not None else DEFAULT_WINDOW)

    def on_success(self, now: float, seconds: float, *, saturated: bool) -> None:
        """A call succeeded after `seconds`; `saturated`: the limit was what held calls back."""
        if not self.adaptive:
            return
        self._roll(now)
        self.ok += 1
        self.latency = seconds if self.latency is None else 0.8 * self.latency + 0.2 * seconds
        if self.best_latency is None or self.latency < self.best_latency:
            self.best_latency = self.latency
        if saturated and not self.overloaded and not self._slow():
            self.limit = min(float(self.ceiling), self.limit + 1.0 / max(self.limit, 1.0))

    def on_overload(self, now: float, in_flight: int) -> None:
        """The provider answered 429 (or 503) while `in_flight` other requests were out."""
        if not self.adaptive:
            return
        self._roll(now)
        self.overloaded += 1
        lowest = max(float(self.floor), 0.5 * self.window_limit)
        if in_flight < self.limit:
            self.limit = max(lowest, float(in_flight))

    def on_other(self, now: float) -> None:
        """A failure that says nothing about load (timeout, 4xx, dropped connection)."""
        if self.adaptive:
            self._roll(now)

    def _slow(self) -> bool:
        return (self.latency is not None and self.best_latency is not None
                and self.latency > self.latency_tolerance * self.best_latency)

    def _roll(self, now: float) -> None:
        """Close the current window if it is over: one decrease decision per round trip."""
        if self.window_start is None:
            self.window_start = now
            return
        if now - self.window_start < self.window():
            return
        if self.overloaded:
            self.limit = max(float(self.floor), min(self.limit, 0.9 * self.window_limit))
            self.decreases += 1
        elif self._slow():
            self.limit = max(float(self.floor), self.limit * self.latency_backoff)
            self.decreases += 1
            # Latency shifts for good (longer conversations answer slower): forget part of the
            # best figure each time it triggers, so a new normal stops shrinking the limit.
            assert self.best_latency is not None and self.latency is not None
            self.best_latency += 0.25 * (self.latency - self.best_latency)
        self.window_start, self.ok, self.overloaded, self.window_limit = now, 0, 0, self.limit


@dataclass
class TokenBucket:
    """`per_minute` units refill continuously; the bucket holds at most `burst_seconds` of them."""

    per_minute: float
    burst_seconds: float = 10.0
    level: float = field(init=False)
    updated: float | None = field(default=None, init=False)

    def __post_init__(self) -> None:
        self.level = self.capacity

    @property
    def rate(self) -> float:
        return self.per_minute / 60.0

    @property
    def capacity(self) -> float:
        return max(1.0, self.rate * self.burst_seconds)

    def _refill(self, now: float) -> None:
        if self.updated is not None:
            self.level = min(self.capacity, self.level + (now - self.updated) * self.rate)
        self.updated = now

    def wait(self, now: float, amount: float) -> float:
        """Seconds until a call needing `amount` may start (0: now)."""
        self._refill(now)
        need = min(amount, self.capacity)
        return 0.0 if self.level >= need else (need - self.level) / self.rate

    def take(self, now: float, amount: float) -> None:
        self._refill(now)
        self.level -= amount

    def adjust(self, now: float, amount: float) -> None:
        """Debit (positive) or refund (negative) the difference between estimate and use."""
        self._refill(now)
        self.level = min(self.capacity, self.level - amount)

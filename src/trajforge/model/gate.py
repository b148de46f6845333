"""The run-wide gate every model request passes: concurrency, Retry-After pauses, rate budgets.

One `ModelGate` per run (per Ray actor with --executor ray), bound to the run's tasks through a
context variable so that every OpenAI-compatible client of the run, tools' auxiliary clients
included, goes through it without being handed it (see model.spend for why a context variable).
A client without a bound gate (trajforge compress, the tests of the client) calls directly.

Per endpoint (base URL) it holds an AimdLimiter on the requests in flight and a pause: a
Retry-After from the provider stops every new request to that endpoint until it ends, instead of
the one request that heard it. Run-wide, optional token buckets bound requests and tokens per
minute. Waiters are served first come, first served; a waiter blocked by time (a pause, an empty
bucket) is woken by a timer at the exact moment, one blocked by concurrency by the next release.
A wait here does not count as the waiting sample's working time (model.working).
The decisions live in model.limiter; this module only waits.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable
from contextlib import AbstractContextManager
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Literal

from trajforge.model import ctxvar, working
from trajforge.model.limiter import AimdLimiter, TokenBucket

Result = Literal["ok", "overload", "other"]


@dataclass(slots=True)
class Ticket:
    endpoint: str
    started: float
    estimate: float  # tokens debited from the tokens-per-minute bucket at admission


@dataclass
class _Endpoint:
    limiter: AimdLimiter
    in_flight: int = 0
    requests: int = 0
    paused_until: float = 0.0
    waiters: deque[tuple[asyncio.Future[Ticket], float]] = field(default_factory=deque)
    timer: asyncio.TimerHandle | None = None


@dataclass(frozen=True, slots=True)
class GateSnapshot:
    limit: int  # requests allowed in flight to the busiest endpoint
    ceiling: int
    in_flight: int
    waiting: int
    requests: int  # admitted so far (retries included)
    ok: int
    overloaded: int  # 429/503 replies
    tokens: int  # prompt + completion tokens of successful calls
    paused: bool


class ModelGate:
    def __init__(self, ceiling: int, *, adaptive: bool = True, requests_per_minute: float | None = None,
                 tokens_per_minute: float | None = None, retry_after_cap: float = 60.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.ceiling = ceiling
        self.adaptive = adaptive
        self._rpm = TokenBucket(requests_per_minute) if requests_per_minute else None
        self._tpm = TokenBucket(tokens_per_minute) if tokens_per_minute else None
        self._cap = retry_after_cap
        self._clock = clock
        self._endpoints: dict[str, _Endpoint] = {}
        self.ok = self.overloaded = self.tokens = 0

    def _endpoint(self, url: str) -> _Endpoint:
        ep = self._endpoints.get(url)
        if ep is None:
            ep = self._endpoints[url] = _Endpoint(AimdLimiter(self.ceiling, adaptive=self.adaptive))
        return ep

    async def acquire(self, endpoint: str, estimate: float = 0.0) -> Ticket:
        """Wait until a request to `endpoint` (about `estimate` tokens) may be sent."""
        ep = self._endpoint(endpoint)
        now = self._clock()
        if not ep.waiters and self._blocked(ep, now, estimate) == 0.0:
            return self._admit(endpoint, ep, now, estimate)
        fut: asyncio.Future[Ticket] = asyncio.get_running_loop().create_future()
        ep.waiters.append((fut, estimate))
        self._pump(endpoint)
        try:
            with working.waiting():  # the run holds it back: not the sample's working time
                return await fut
        except asyncio.CancelledError:
            if fut.done() and not fut.cancelled():  # admitted in the same instant it was cancelled
                self.release(fut.result(), "other")
            raise

    def release(self, ticket: Ticket, result: Result, *, retry_after: float | None = None,
                tokens: int | None = None) -> None:
        """The request of `ticket` ended: feed the limiter, settle the token estimate, wake waiters."""
        ep = self._endpoint(ticket.endpoint)
        now = self._clock()
        saturated = bool(ep.waiters) or ep.in_flight >= ep.limiter.value
        ep.in_flight -= 1
        if result == "ok":
            self.ok += 1
            self.tokens += tokens or 0
            ep.limiter.on_success(now, now - ticket.started, saturated=saturated)
        elif result == "overload":
            self.overloaded += 1
            ep.limiter.on_overload(now, ep.in_flight)
        else:
            ep.limiter.on_other(now)
        if self._tpm is not None:  # a failed call used no tokens: refund the estimate
            self._tpm.adjust(now, (tokens or 0) - ticket.estimate if result == "ok" else -ticket.estimate)
        if retry_after is not None and retry_after > 0:
            ep.paused_until = max(ep.paused_until, now + min(retry_after, self._cap))
        self._pump(ticket.endpoint)

    def _blocked(self, ep: _Endpoint, now: float, estimate: float) -> float | None:
        """0: may start now; seconds: blocked until then; None: blocked until a request ends."""
        if ep.in_flight >= ep.limiter.value:
            return None
        wait = max(0.0, ep.paused_until - now)
        if self._rpm is not None:
            wait = max(wait, self._rpm.wait(now, 1))
        if self._tpm is not None:
            wait = max(wait, self._tpm.wait(now, estimate))
        return wait

    def _admit(self, endpoint: str, ep: _Endpoint, now: float, estimate: float) -> Ticket:
        ep.in_flight += 1
        ep.requests += 1
        if self._rpm is not None:
            self._rpm.take(now, 1)
        if self._tpm is not None:
            self._tpm.take(now, estimate)
        return Ticket(endpoint, now, estimate)

    def _pump(self, endpoint: str) -> None:
        ep = self._endpoints[endpoint]
        if ep.timer is not None:
            ep.timer.cancel()
            ep.timer = None
        now = self._clock()
        while ep.waiters:
            fut, estimate = ep.waiters[0]
            if fut.done():  # its task was cancelled while waiting
                ep.waiters.popleft()
                continue
            blocked = self._blocked(ep, now, estimate)
            if blocked is None:
                return
            if blocked > 0:
                ep.timer = asyncio.get_running_loop().call_later(blocked, self._pump, endpoint)
                return
            ep.waiters.popleft()
            fut.set_result(self._admit(endpoint, ep, now, estimate))

    def snapshot(self) -> GateSnapshot:
        eps = list(self._endpoints.values())
        busiest = max(eps, key=lambda e: e.requests, default=None)
        now = self._clock()
        return GateSnapshot(
            limit=busiest.limiter.value if busiest else self.ceiling, ceiling=self.ceiling,
            in_flight=sum(e.in_flight for e in eps),
            waiting=sum(1 for e in eps for f, _ in e.waiters if not f.done()),
            requests=sum(e.requests for e in eps), ok=self.ok, overloaded=self.overloaded, tokens=self.tokens,
            paused=any(e.paused_until > now for e in eps))


_GATE: ContextVar[ModelGate | None] = ContextVar("trajforge_model_gate", default=None)


def current() -> ModelGate | None:
    return _GATE.get()


def bound(gate: ModelGate | None) -> AbstractContextManager[ModelGate | None]:
    """Send this task's model requests (and those of tasks it starts) through `gate`."""
    return ctxvar.bound(_GATE, gate)

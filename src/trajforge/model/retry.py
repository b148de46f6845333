"""The retry policy of every model call, declared once.

A failed call that may succeed later (429, 5xx, timeouts, dropped connections; for the
summariser also an unusable reply) is retried up to `max_retries` times, waiting the server's
Retry-After when it gives one (capped) and otherwise exponential backoff with full jitter. The
run's agent and judge (model.client), the tools' own model calls (vision, mixture of agents,
image generation, whose SDK retries are off) and the compressor's summariser all use it; a tool
call takes fewer retries (`for_tool`) because the agent waits on it and can act on a failure.
"""

from __future__ import annotations

import asyncio
import dataclasses
import email.utils
import logging
import random
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import TypeVar

from trajforge.model import working

log = logging.getLogger("trajforge.model")
T = TypeVar("T")
TOOL_RETRIES = 2  # a tool call waits on these retries; a couple is enough before the model hears of the failure


def parse_retry_after(headers: Mapping[str, str]) -> float | None:
    """Seconds the server asks us to wait (retry-after-ms, Retry-After seconds or HTTP date)."""
    for name, scale in (("retry-after-ms", 1000.0), ("retry-after", 1.0)):
        value = headers.get(name)
        if value is None:
            continue
        try:
            return max(0.0, float(value) / scale)
        except ValueError:
            pass
    value = headers.get("retry-after")
    if value:
        parsed = email.utils.parsedate_tz(value)
        if parsed is not None:
            return max(0.0, email.utils.mktime_tz(parsed) - time.time())
    return None


def backoff_delay(attempt: int, retry_after: float | None, *, base: float, maximum: float,
                  retry_after_cap: float, rng: random.Random) -> float:
    """Seconds to wait before retry number `attempt + 1` (attempt counts from 0).

    The server's Retry-After wins (capped); otherwise exponential backoff with full jitter,
    uniform in [0, min(maximum, base * 2**attempt)].
    """
    if retry_after is not None:
        wait = min(retry_after, retry_after_cap)
        # A little jitter so a thousand callers told "1s" do not all come back in the same instant.
        return wait + rng.uniform(0, 0.1 * wait)
    return rng.uniform(0, min(maximum, base * 2 ** attempt))


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    max_retries: int = 5  # --max_retries
    base: float = 1.0  # seconds: the first backoff's upper bound, doubled each retry
    maximum: float = 30.0  # seconds: no backoff waits longer
    retry_after_cap: float = 60.0  # seconds: the longest Retry-After obeyed

    @property
    def attempts(self) -> int:
        return self.max_retries + 1

    def delay(self, attempt: int, retry_after: float | None, rng: random.Random) -> float:
        return backoff_delay(attempt, retry_after, base=self.base, maximum=self.maximum,
                             retry_after_cap=self.retry_after_cap, rng=rng)

    def for_tool(self) -> RetryPolicy:
        return dataclasses.replace(self, max_retries=min(self.max_retries, TOOL_RETRIES))

    async def run(self, attempt: Callable[[], Awaitable[T]], retryable: Callable[[Exception], bool], *,
                  what: str, rng: random.Random | None = None) -> T:
        """`await attempt()` until it returns, raises something not `retryable`, or the retries run out
        (then its last exception propagates)."""
        rng = rng or random.Random()
        for n in range(self.attempts):
            try:
                return await attempt()
            except Exception as e:
                if n + 1 >= self.attempts or not retryable(e):
                    raise
                wait = self.delay(n, None, rng)
                log.warning("%s failed (%s); retry %d/%d in %.1fs", what, e, n + 1, self.max_retries, wait)
                with working.waiting():  # not the waiting sample's working time
                    await asyncio.sleep(wait)
        raise AssertionError("unreachable: the loop returns or raises")

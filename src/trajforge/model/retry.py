"""The pure half of the model client's retry policy: how long to wait before the next attempt.

The client (model.client) decides what is retried; this module only says when: the server's
Retry-After (in any of its forms) when it sent one, else exponential backoff with full jitter.
"""

from __future__ import annotations

import email.utils
import random
import time
from collections.abc import Mapping


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

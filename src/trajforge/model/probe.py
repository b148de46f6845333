"""Whether a model endpoint answers at all, asked once before a run spends anything on it.

A mistyped or down `--base_url` (connection refused, a host name that does not resolve, TLS that
fails) otherwise shows only after every sample has spent its retries on it. One `GET
{base_url}/models` (what OpenAI-compatible servers list their models at; it costs nothing and is
no chat request) tells: any HTTP answer, an error status included, proves the endpoint is there,
whatever it says about that path or the key. A failure is tried again a few times, briefly, so
a one-off blip does not stop a run. Goes through the same proxy and TLS settings as the model
client's transport (model.transport).
"""

from __future__ import annotations

import asyncio
import random
import ssl
from typing import Any

from trajforge import __version__
from trajforge.model.retry import RetryPolicy
from trajforge.model.transport import env_proxy

# A few quick tries, with the run's backoff (up to ~1 s, then ~2 s), ride out a blip; only the
# last failure is said (by the caller), not each retry.
POLICY = RetryPolicy(max_retries=2, base=1.0, maximum=2.0)
AGENT = f"trajforge/{__version__} (endpoint probe)"  # its User-Agent: a server's logs tell it from calls
ATTEMPT_SECONDS = 10.0  # at most, per attempt (a host that drops packets answers nothing at all)


async def unreachable(base_url: str, *, timeout: float = ATTEMPT_SECONDS, policy: RetryPolicy = POLICY) -> str | None:
    """None when `base_url` answers over HTTP; else why not, from the last attempt."""
    import aiohttp

    url = base_url.rstrip("/") + "/models"
    ssl_context: Any = ssl.create_default_context() if url.startswith("https:") else None  # as the transport's
    rng = random.Random()
    why = ""
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=ssl_context),
                                     timeout=aiohttp.ClientTimeout(total=timeout)) as session:
        for n in range(policy.attempts):
            if n:
                await asyncio.sleep(policy.delay(n - 1, None, rng))
            try:
                async with session.get(url, proxy=env_proxy(url), allow_redirects=False,
                                       headers={"User-Agent": AGENT}):
                    return None  # any status: the endpoint is there
            except aiohttp.ClientError as exc:  # said without its request_info: no header leaks
                why = f"{type(exc).__name__}: {exc}"
            except TimeoutError:
                why = f"no answer within {timeout:g} s"
    return why

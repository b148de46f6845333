"""What a model call used and cost: the provider's own figure when it reports one, else the price table.

OpenRouter reports the charge of every call in `usage.cost`; other OpenAI-compatible servers
(OpenAI, vLLM, llama.cpp, most proxies) report only tokens. For those the run's config carries a
price table (`pricing: {model: {prompt, completion, cached_prompt}}`, USD per million tokens), and
the client prices each call itself. A budget is only as good as its prices, so `price_known`
tells the runner, before anything starts, whether a model's spend can be counted at all.

Pure: no I/O, no clock.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

from trajforge.model.types import PER_TOKENS, Price, Usage

__all__ = ["PER_TOKENS", "Price", "call_usage", "price_known", "reports_cost", "usage_from"]
# Hosts whose replies carry the charged cost of each call in usage.cost (OpenRouter always does:
# https://openrouter.ai/docs/use-cases/usage-accounting).
COST_REPORTING_HOSTS = ("openrouter.ai",)


def reports_cost(base_url: str | None) -> bool:
    """Whether this endpoint reports each call's cost itself."""
    host = urlsplit(base_url or "").hostname or ""
    return any(host == h or host.endswith("." + h) for h in COST_REPORTING_HOSTS)


def price_known(model: str, base_url: str, table: Mapping[str, Price] | None) -> bool:
    """Whether calls to `model` at `base_url` can be costed: a table entry, or a reporting host.
    The in-process local model costs nothing."""
    return model == "local" or model.startswith("local:") or model in (table or {}) or reports_cost(base_url)


# A count or cost no call can have: a provider's bogus value (2**64 tokens, a negative or NaN
# cost) counts as 0 instead of ending the run where the record is saved (orjson refuses
# integers past 64 bits) or wrecking the run's budget.
_MOST = 10**12


def _number(value: Any, kind: type[int | float]) -> Any:
    if isinstance(value, bool):
        return kind(0)
    try:
        n = kind(value or 0)
    except (TypeError, ValueError, OverflowError):
        return kind(0)
    return n if 0 <= n <= _MOST else kind(0)  # NaN fails both comparisons


def usage_from(raw: Any) -> Usage:
    """Usage of one call (the decoded `usage` object); `cost` is OpenRouter's extra field,
    reasoning and cached tokens sit in the details."""
    if not isinstance(raw, dict):
        return Usage()
    details = raw.get("completion_tokens_details")
    reasoning = details.get("reasoning_tokens") if isinstance(details, dict) else 0
    prompt_details = raw.get("prompt_tokens_details")
    cached = prompt_details.get("cached_tokens") if isinstance(prompt_details, dict) else 0
    return Usage(prompt_tokens=_number(raw.get("prompt_tokens"), int),
                 completion_tokens=_number(raw.get("completion_tokens"), int),
                 reasoning_tokens=_number(reasoning, int), cost=_number(raw.get("cost"), float),
                 cached_tokens=_number(cached, int))


def call_usage(raw: Any, price: Price | None) -> Usage:
    """Usage of one call with its cost: the provider's `cost` when it sent one, else priced by
    `price` (no price and no reported cost: 0)."""
    usage = usage_from(raw)
    reported = isinstance(raw, dict) and isinstance(raw.get("cost"), (int, float)) and not isinstance(
        raw.get("cost"), bool)
    if not reported and price is not None:
        usage.cost = price.cost(usage)
    return usage

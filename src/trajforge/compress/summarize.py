"""Writing one `[CONTEXT SUMMARY]:` turn for a run of trajectory turns, through the project's model client.

The client (trajforge.model) retries transport failures (429, 5xx, timeouts) under the project's
one retry policy (model.retry); this module adds what is specific to summaries: the prompt, and
that an unusable answer is retryable too. A summary cut off by the token limit
(finish_reason == "length") or an empty one is retried under the same policy (backoff starting at
`retry_delay` seconds), up to `max_retries` times, then the summary fails: the caller keeps the
trajectory unchanged. A rejected API key (FatalModelError) is not a per-trajectory failure and
propagates to stop the run; a missing one (UsageError) is found by `check` before the run writes
anything. The client itself is built on first use (a run in which nothing is over the budget
loads no model and imports no SDK). No temperature is sent when the config says
`temperature: null` or when the model is known to refuse one (`rejects_temperature`).
"""

from __future__ import annotations

import asyncio
import os
import re
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from trajforge.compress.config import DEFAULT_SUMMARY_MODEL, SummarizationSection
from trajforge.errors import UsageError
from trajforge.model.errors import ModelCallError
from trajforge.model.retry import RetryPolicy
from trajforge.model.types import ModelClient, ModelSettings

SUMMARY_PREFIX = "[CONTEXT SUMMARY]:"
_TURN_CHARS = 3000  # longer turn values are shown to the summariser with their middle elided
_HEAD_CHARS, _TAIL_CHARS = 2000, 800


# Models whose API refuses a `temperature` (or any but the default): Moonshot's Kimi models (the
# reference compressor omits it for them too), OpenAI's o-series and gpt-5 reasoning models.
_NO_TEMPERATURE = re.compile(r"(^|/)(kimi|o[134](-|$)|gpt-5)", re.IGNORECASE)


def rejects_temperature(model: str) -> bool:
    """True when `model` is known to reject a temperature parameter."""
    return bool(_NO_TEMPERATURE.search(model))


class SummaryFailed(Exception):
    """No usable summary after all attempts; the message says why (never contains the API key)."""


@dataclass(slots=True)
class CallCount:
    calls: int = 0
    errors: int = 0


def _elide(value: str) -> str:
    if len(value) <= _TURN_CHARS:
        return value
    omitted = len(value) - _HEAD_CHARS - _TAIL_CHARS
    return f"{value[:_HEAD_CHARS]}\n...[{omitted} characters omitted]...\n{value[-_TAIL_CHARS:]}"


def summary_prompt(turns: list[dict[str, Any]], first_index: int, target_tokens: int) -> str:
    shown = "\n\n".join(f"[Turn {first_index + k} - {str(t.get('from', '?')).upper()}]:\n{_elide(t['value'])}"
                        for k, t in enumerate(turns))
    return (
        "Summarize the following agent conversation turns concisely. This summary will replace these "
        "turns in the conversation history.\n\n"
        "Write the summary in the SAME LANGUAGE as the turns below; never translate.\n\n"
        "Write from a neutral perspective describing what the assistant did and learned. Include:\n"
        "1. What actions the assistant took (tool calls, searches, file operations)\n"
        "2. Key information or results obtained\n"
        "3. Any important decisions or findings\n"
        "4. Relevant data, file names, values, or outputs\n\n"
        f"Keep the summary factual and informative. Target approximately {target_tokens} tokens.\n\n"
        f"---\nTURNS TO SUMMARIZE:\n{shown}\n---\n\n"
        f'Write only the summary, starting with "{SUMMARY_PREFIX}" prefix.'
    )


def normalise(text: str) -> str:
    """The summary with the prefix exactly once; empty string when there is no summary text."""
    body = text.strip()
    while body.startswith(SUMMARY_PREFIX):
        body = body[len(SUMMARY_PREFIX):].strip()
    return f"{SUMMARY_PREFIX} {body}" if body else ""


def falls_back_to_local(cfg: SummarizationSection, api_key: str | None, environ: Mapping[str, str]) -> bool:
    """Like `trajforge run`: no summariser model named (by --model or `summarization.model`), no
    --base_url and no API key anywhere means the bundled local model. A model or URL the user
    chose, even the default's name, is never replaced."""
    from trajforge.model.endpoint import resolve_api_key

    return ("model" not in cfg.model_fields_set and cfg.model == DEFAULT_SUMMARY_MODEL and cfg.base_url is None
            and resolve_api_key(_own_key(cfg, api_key, environ), environ) is None)


def _own_key(cfg: SummarizationSection, api_key: str | None, environ: Mapping[str, str]) -> str | None:
    """The summariser's own key: --api_key, else the variable summarization.api_key_env names
    (unset or empty: the run's key lookup takes over, as in the reference compressor)."""
    return api_key or (environ.get(cfg.api_key_env) if cfg.api_key_env else None) or None


class _Unusable(Exception):
    """A reply that is no summary (cut off, empty): worth another attempt."""


class Summariser:
    """Shared by every trajectory of a run (the caller bounds how many summaries run at once)."""

    def __init__(self, cfg: SummarizationSection, *, target_tokens: int,
                 api_key: str | None = None, environ: Mapping[str, str] = os.environ) -> None:
        self._cfg = cfg
        self._target = target_tokens
        self._environ = environ
        self._settings = ModelSettings(model=cfg.model, base_url=cfg.base_url, api_key=_own_key(cfg, api_key, environ),
                                       max_tokens=2 * target_tokens,
                                       temperature=None if rejects_temperature(cfg.model) else cfg.temperature,
                                       max_retries=cfg.max_retries, request_timeout=cfg.request_timeout)
        self._policy = RetryPolicy(max_retries=cfg.max_retries, base=cfg.retry_delay)
        self._client: ModelClient | None = None
        self._client_lock = asyncio.Lock()

    def check(self) -> None:
        """Raise the UsageError building the client would (no key for a remote API, no local
        backend), before the run writes anything."""
        from trajforge.model.factory import check_client

        with self._explained():
            check_client(self._settings, self._environ)

    @contextmanager
    def _explained(self) -> Iterator[None]:
        from trajforge.model.endpoint import NoKey

        try:
            yield
        except NoKey as e:  # model/endpoint.py's wording, naming the setting for the summariser's own key
            own = "summarization.api_key_env" if not self._cfg.api_key_env else f"${self._cfg.api_key_env}"
            raise UsageError(f"summariser: {e} (or set {own})") from None
        except UsageError as e:
            raise UsageError(f"summariser: {e}") from None

    async def _get_client(self) -> ModelClient:
        async with self._client_lock:
            if self._client is None:
                # Imported here: the SDK takes a second to import and most runs over short
                # trajectories, or --dry_run, never need it.
                from trajforge.model.factory import make_client

                with self._explained():
                    self._client = make_client(self._settings, self._environ)
            return self._client

    async def summarise(self, turns: list[dict[str, Any]], first_index: int, count: CallCount) -> str:
        """One summary of `turns`, prefixed; raises SummaryFailed when none is usable."""
        client = await self._get_client()
        messages = [{"role": "user", "content": summary_prompt(turns, first_index, self._target)}]


        async def attempt() -> str:
            count.calls += 1
            try:
                completion = await client.complete(messages, [])  # transport failures: retried in the client
            except ModelCallError as e:
                count.errors += 1
                raise SummaryFailed(f"summariser call failed: {e}") from None
            text = normalise(completion.content or "")
            if completion.finish_reason == "length":
                count.errors += 1
                raise _Unusable("summary cut off by the token limit (finish_reason=length)")
            if not text:
                count.errors += 1
                raise _Unusable("summariser returned an empty summary")
            return text

        try:  # an unusable summary is retried under the one policy, like any model call
            return await self._policy.run(attempt, lambda e: isinstance(e, _Unusable), what="summariser")
        except _Unusable as e:
            raise SummaryFailed(str(e)) from None

    async def aclose(self) -> None:
        if self._client is not None:
            await self._client.aclose()

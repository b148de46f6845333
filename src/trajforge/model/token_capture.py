"""Token ids and logprobs from an OpenAI-compatible reply, in the shapes vLLM gives them (pure).

Asked for with two request fields, sent only under --capture_tokens so that a strict provider
never sees them: `return_token_ids: true` makes vLLM's chat completions report the ids of the
prompt as its chat template rendered and tokenized it (`prompt_token_ids`, at the top of the
reply) and of each choice's generated text (`choices[].token_ids`), and `logprobs: true` adds a
logprob per generated token (`choices[].logprobs.content[].logprob`, OpenAI's shape). The ids
are taken exactly as reported; a reply without usable ones yields None (the caller records
why), never ids made here from text. Logprobs that do not come one per generated id are left
out rather than guessed into place.
"""

from __future__ import annotations

from array import array
from operator import itemgetter
from typing import Any

from trajforge.model.types import TokenCapture

REQUEST_FIELDS = {"return_token_ids": True, "logprobs": True}
_LOGPROB = itemgetter("logprob")


def _ids(raw: Any) -> array | None:
    if not isinstance(raw, list):
        return None
    try:
        return array("i", raw)  # refuses anything but whole numbers that fit 32 bits, at C speed
    except (TypeError, OverflowError):
        return None


def _logprobs(choice: dict[str, Any], count: int) -> list[float] | None:
    block = choice.get("logprobs")
    content = block.get("content") if isinstance(block, dict) else None
    if not isinstance(content, list) or len(content) != count:
        return None
    try:
        values = list(map(_LOGPROB, content))
        array("d", values)  # refuses anything but numbers, at C speed (a reply holds thousands)
    except (TypeError, KeyError):
        return None
    return values


def from_reply(response: dict[str, Any], choice: dict[str, Any]) -> TokenCapture | None:
    """The capture of one reply (its first choice), or None when it lacks the prompt's or the
    completion's ids."""
    prompt = _ids(response.get("prompt_token_ids"))
    if prompt is None:
        prompt = _ids(choice.get("prompt_token_ids"))  # some servers put it beside the choice's own ids
    completion = _ids(choice.get("token_ids"))
    if prompt is None or completion is None or not prompt:
        return None
    return TokenCapture(prompt, completion, _logprobs(choice, len(completion)))

"""The `rubric` judge: a model grades the final answer against the row's rubric.

The judge is asked for one JSON object {"score": <0..1>, "reasoning": "..."}; the sample passes
when score >= judge_threshold. The request goes through the project's model client, so the
client's retry policy (429/5xx/timeouts, --max_retries) applies. A judge that still fails after
its retries is the error kind `judge_failed`; a reply without a valid score is `judge_invalid`.
Neither is ever a pass or a fail. A rejected key (FatalModelError) stops the run, as for the
agent's own model.

Endpoint: --judge_model (default: the run's --model), --judge_base_url (default: the run's
--base_url) and --judge_api_key_env (a variable holding the judge's key; default: the run's key
lookup), like the endpoints of the tools' auxiliary models (tools/aux_models.py).
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import orjson

from trajforge.errors import FatalModelError
from trajforge.model.endpoint import Endpoint, NoKey, endpoint, settings_for
from trajforge.model.errors import ModelCallError
from trajforge.model.types import ModelClient, Usage
from trajforge.verify.result import Part

if TYPE_CHECKING:
    from trajforge.config import RunConfig

NO_ANSWER = "(the agent gave no final answer)"
REPLY_TAIL = 500
_SYSTEM = (
    "You are a strict grader. You are given a task, the final answer an AI agent gave, and a rubric. "
    "Grade the answer against the rubric only. Reply with exactly one JSON object and nothing else: "
    '{"score": <a number from 0 to 1>, "reasoning": "<one or two sentences>"}'
)
_OBJECT = re.compile(r"\{.*\}", re.DOTALL)


class InvalidReply(ValueError):
    """The judge's reply holds no valid score."""


def judge_messages(task: str, answer: str | None, rubric: str) -> list[dict[str, Any]]:
    user = (f"## Task\n{task}\n\n## Final answer of the agent\n{answer if answer else NO_ANSWER}\n\n"
            f"## Rubric\n{rubric}\n\nReply with the JSON object only.")
    return [{"role": "system", "content": _SYSTEM}, {"role": "user", "content": user}]


def parse_reply(text: str) -> tuple[float, str]:
    """(score, reasoning) from the judge's reply (pure); InvalidReply when there is no valid score.

    Accepts the object alone or inside prose / a ```json fence; the score must be a JSON number
    (not a string, not a boolean) within [0, 1]."""
    m = _OBJECT.search(text or "")
    if m is None:
        raise InvalidReply("no JSON object in the reply")
    try:
        obj = orjson.loads(m.group(0))
    except orjson.JSONDecodeError as e:
        raise InvalidReply(f"the JSON object does not parse: {e}") from None
    if not isinstance(obj, dict) or "score" not in obj:
        raise InvalidReply("the JSON object has no 'score'")
    score = obj["score"]
    if isinstance(score, bool) or not isinstance(score, (int, float)) or not math.isfinite(score):
        raise InvalidReply(f"'score' must be a number, got {score!r}")
    if not 0 <= score <= 1:
        raise InvalidReply(f"'score' must be within 0..1, got {score}")
    reasoning = obj.get("reasoning")
    return float(score), reasoning if isinstance(reasoning, str) else ""


def judge_settings_differ(config: RunConfig) -> bool:
    """Whether the judge needs its own client (otherwise the run's agent client is reused)."""
    return any(v is not None for v in (config.judge_model, config.judge_base_url, config.judge_api_key_env))


def judge_endpoint(config: RunConfig, environ: Mapping[str, str] = os.environ) -> Endpoint:
    """The judge's endpoint: --judge_base_url (default: the run's --base_url) and the key in
    --judge_api_key_env (default: the run's key). NoKey when it could only refuse every call."""
    return endpoint(config.judge_base_url or config.base_url,
                    api_key=config.api_key.get_secret_value() if config.api_key else None,
                    key_env=config.judge_api_key_env, key_setting="--judge_api_key_env", environ=environ)


def make_judge_client(config: RunConfig, environ: Mapping[str, str] = os.environ) -> ModelClient:
    """A client for the judge endpoint, with the run's retry policy. Raises UsageError."""
    from trajforge.model.factory import make_client

    settings = settings_for(config.model_settings(), config.judge_model or config.resolved.model,
                            judge_endpoint(config, environ))
    return make_client(settings, environ)


def judge_endpoint_problem(config: RunConfig, environ: Mapping[str, str] = os.environ) -> str | None:
    """Why the judge endpoint cannot work (a missing key), checked before the run starts."""
    if not judge_settings_differ(config):
        return None  # the run's own client, whose key the runner has already checked
    try:
        judge_endpoint(config, environ)
    except NoKey as e:
        return f"the judge: {e}"
    return None


async def judge(client: ModelClient, *, task: str, answer: str | None, rubric: str,
                threshold: float) -> tuple[Part, Usage]:
    """Grade one answer; the Usage is the judge's spend (added to the sample's)."""
    try:
        completion = await client.complete(judge_messages(task, answer, rubric), [])
    except FatalModelError:
        raise
    except ModelCallError as e:
        return Part.failure("rubric", "judge_failed", {"model": client.model_name, "message": str(e)[:500]}), Usage()
    text = completion.content or ""
    try:
        score, reasoning = parse_reply(text)
    except InvalidReply as e:
        detail = {"model": client.model_name, "message": str(e), "reply_tail": text[-REPLY_TAIL:]}
        return Part.failure("rubric", "judge_invalid", detail), completion.usage
    detail = {"model": client.model_name, "score": score, "threshold": threshold,
              "reasoning": reasoning or (completion.reasoning or "")[-REPLY_TAIL:]}
    return Part.verdict("rubric", score >= threshold, detail, score=score), completion.usage

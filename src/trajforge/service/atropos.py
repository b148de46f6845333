"""`--push atropos=URL`: each finished group goes to an Atropos API server as `scored_data`.

The service registers as an environment (`/register-env`: its group size and token budget) once
a trainer has started there, then posts one ScoredData per group: a sequence per training
segment of each scored rollout (the token export's rows: export.tokens.segment_rows), `tokens`
its input ids, `masks` the ids where the model generated them and -100 on the prompt's,
`inference_logprobs` the logprobs there and 1.0 elsewhere (Atropos' conventions), `scores` the
rollout's reward. Masked and dropped rollouts are left out. A group is not pushed, and is counted
(RolloutService.unpushed), when a scored rollout has no captured token ids or none is scored.
Pushed groups are noted in the service's store, so a resumed service pushes only the others.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import aiohttp

from trajforge.export.tokens import segment_rows

log = logging.getLogger("trajforge")
MAX_TOKEN_LENGTH = 1 << 16  # what the service tells Atropos a sequence may hold
PROMPT = -100  # Atropos' mask of a token the model did not generate
MASKED_LOGPROB = 1.0  # and its logprob there
ENV_NAME = "trajforge"


def scored_data(group: dict[str, Any]) -> tuple[dict[str, Any] | None, str | None]:
    """(ScoredData, None), or (None, why it is not pushed)."""
    tokens, masks, logprobs, scores = [], [], [], []
    for rollout in group["rollouts"]:
        if not rollout or rollout["status"] != "scored":
            continue
        rows = segment_rows(rollout["record"], None)
        if not rows:
            return None, "no_tokens"
        for row in rows:
            tokens.append(row["input_ids"])
            masks.append([t if m else PROMPT for t, m in zip(row["input_ids"], row["loss_mask"], strict=True)])
            logprobs.append([lp if m and lp is not None else MASKED_LOGPROB
                             for lp, m in zip(row["logprobs"], row["loss_mask"], strict=True)])
            scores.append(float(rollout["reward"] or 0.0))
    if not tokens:
        return None, "no_usable"
    return {"tokens": tokens, "masks": masks, "scores": scores, "inference_logprobs": logprobs}, None


class AtroposPush:
    """Pushes finished groups in order from a queue; `count` notes what was not pushed and why."""

    def __init__(self, url: str, pushed: Any, count: dict[str, int]) -> None:
        self.url = url.rstrip("/")
        self.pushed = pushed  # callable(gid): note the group as pushed in the store
        self.count = count
        self.queue: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self.env_id: int | None = None

    async def run(self, stop: asyncio.Event) -> None:
        async with aiohttp.ClientSession() as session:
            while not stop.is_set():
                group = await self.queue.get()
                body, why = scored_data(group)
                if body is None:
                    self.count[why or "?"] = self.count.get(why or "?", 0) + 1
                    self.pushed(group["id"])
                    continue
                try:
                    await self._register(session, stop, len(group["rollouts"]))
                    async with session.post(f"{self.url}/scored_data", json={**body, "env_id": self.env_id}) as r:
                        r.raise_for_status()
                except (aiohttp.ClientError, OSError) as e:  # the next start of the service pushes it again
                    log.warning("could not push group %s to %s: %s", group["id"], self.url, e)
                    self.count["push_failed"] = self.count.get("push_failed", 0) + 1
                    continue
                self.pushed(group["id"])

    async def _register(self, session: aiohttp.ClientSession, stop: asyncio.Event, group_size: int) -> None:
        """Registered as an environment once a trainer has started (Atropos answers "wait for
        trainer to start" before): it announces no start, so this asks again with a backoff. The
        group size it announces is the first pushed group's."""
        delay = 0.05
        while self.env_id is None and not stop.is_set():
            async with session.post(f"{self.url}/register-env", json={
                    "max_token_length": MAX_TOKEN_LENGTH, "desired_name": ENV_NAME, "weight": 1.0,
                    "group_size": group_size}) as r:
                r.raise_for_status()
                answer = await r.json()
            if answer.get("status") == "success":
                self.env_id = int(answer["env_id"])
                return
            await asyncio.sleep(delay)
            delay = min(delay * 2, 2.0)

"""The Python API of the rollout service, for a trainer in the same process:

    async with trajforge.Rollouts({"base_url": URL, "model": M, "run_name": "rl"}) as r:
        async for group in r.generate(rows, n=8):
            ...

The same service (service.core) without HTTP: the same engine, run directory, listener and
masking. `generate` submits its rows as groups, yields each group as it finishes (the stream's
JSON shape, as `trajforge serve` sends it) and acks it once the loop body has taken it, so an
interrupted loop gets the unacked ones again from a Rollouts made with `resume=True`.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any

import orjson

from trajforge.config import RunConfig
from trajforge.config.load import build_config
from trajforge.runner.scheduling.engine import ExecutorFactory
from trajforge.service.core import RolloutService

# the service's dataset is its own (RunLayout.service_rows): a placeholder until the service names it
_PLACEHOLDER = "service_rows.jsonl"


class Rollouts:
    def __init__(self, config: RunConfig | Mapping[str, Any], *, retry_masked: int = 0, resume: bool = False,
                 make_executor: ExecutorFactory | None = None) -> None:
        """`config`: a RunConfig, or the run's settings by flag name (`{"model": ..., "run_name": ...}`)."""
        if not isinstance(config, RunConfig):
            config = build_config({"dataset_file": _PLACEHOLDER, "batch_size": 64, **config})
        if make_executor is None:
            from trajforge.executors import make_executor as local_or_ray

            make_executor = local_or_ray
        # in-process: the caller is the service's owner, and may name any endpoint (service.policy)
        self.service = RolloutService(config, make_executor, retry_masked=retry_masked, resume=resume, redirects=True)

    async def __aenter__(self) -> Rollouts:
        await self.service.__aenter__()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.service.close()

    def set_policy(self, version: int) -> None:
        """Calls sent from now on are stamped with `version` (the rollouts in flight go on)."""
        self.service.set_policy(version)

    async def generate(self, rows: Sequence[Mapping[str, Any]], n: int = 8) -> AsyncIterator[dict[str, Any]]:
        """One group of `n` rollouts per row, each yielded as soon as it finished; then acked."""
        waiting = set(self.service.submit([dict(r) for r in rows], n))
        async for finished in self.service.stream(0):
            if finished.id not in waiting:
                continue
            yield orjson.loads(finished.line)
            self.service.ack([finished.id])
            waiting.discard(finished.id)
            if not waiting:
                return

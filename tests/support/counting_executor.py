"""A test-only executor: the in-process one, counting what it processes (registered by one line)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from trajforge.config import RunConfig
from trajforge.dataset import Sample
from trajforge.executors.local_executor import LocalExecutor
from trajforge.sample.outcome import Outcome

PROCESSED: list[str] = []


class CountingExecutor(LocalExecutor):
    async def process(self, sample: Sample, attempt: int) -> Outcome:
        PROCESSED.append(sample.identity)
        return await super().process(sample, attempt)


def make(config: RunConfig, prefill: list[dict[str, Any]] | None, run_dir: Path) -> CountingExecutor:
    return CountingExecutor(config, prefill=prefill)

"""The in-process executor: one SampleWorker serving `num_workers` concurrent sessions.

Its model gate (runner.governor.gate_for) is bound to every session, so each model request of
the run, tools' included, waits there for its turn.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from trajforge.config import RunConfig
from trajforge.dataset import Sample
from trajforge.model import gate as model_gate
from trajforge.model.types import ModelClient
from trajforge.runner.governor import gate_for
from trajforge.runner.outcome import Outcome
from trajforge.runner.worker import SampleWorker
from trajforge.tools.base import Unavailable

log = logging.getLogger("trajforge.agent")


class LocalExecutor:
    def __init__(self, config: RunConfig, *, prefill: list[dict[str, Any]] | None = None,
                 workspace_root: Path | None = None, model: ModelClient | None = None) -> None:
        self.capacity = config.num_workers
        self._model = model
        self._worker = SampleWorker(config, prefill=prefill, workspace_root=workspace_root)
        self._verbose = config.verbose
        self._chars = config.log_prefix_chars
        self.gate = gate_for(config)

    async def start(self) -> list[Unavailable]:
        return await self._worker.start(self._model)

    async def process(self, sample: Sample, attempt: int) -> Outcome:
        trace = _tracer(sample, self._worker.config.batch_size or 1, self._chars) if self._verbose else None
        with model_gate.bound(self.gate):
            return await self._worker.process(sample, attempt=attempt, trace=trace)

    async def aclose(self) -> None:
        await self._worker.aclose()


def _tracer(sample: Sample, batch_size: int, chars: int) -> Any:
    prefix = f"[B{sample.index // batch_size}:P{sample.index}]"

    def cut(text: str) -> str:
        text = " ".join(text.split())
        return text if len(text) <= chars else text[:chars] + "..."

    def trace(kind: str, item: Any) -> None:
        if kind == "model":
            calls = ", ".join(c.name for c in item.tool_calls) or "none"
            log.info("%s model: %s | tool calls: %s", prefix, cut(item.content or ""), calls)
        else:
            status = "failed" if item.failed else "ok"
            log.info("%s tool %s %s: %s", prefix, item.call.name, status, cut(item.result))

    return trace

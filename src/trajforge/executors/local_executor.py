"""The in-process executor: one SampleWorker serving `num_workers` concurrent sessions.

Its model gate (trajforge.sample.gate_builder.gate_for) is bound to every session, so each model request of
the run, tools' included, waits there for its turn.
"""

from __future__ import annotations

from collections.abc import Collection
from pathlib import Path
from typing import Any

from trajforge.config import RunConfig
from trajforge.dataset import Sample
from trajforge.model import gate as model_gate
from trajforge.model.types import ModelClient
from trajforge.run_layout import RunLayout
from trajforge.sample.gate_builder import gate_for
from trajforge.sample.outcome import Outcome
from trajforge.model.policy import PolicyVersion
from trajforge.sample.worker import SampleWorker
from trajforge.tools.tool import Unavailable


class LocalExecutor:
    def __init__(self, config: RunConfig, *, prefill: list[dict[str, Any]] | None = None,
                 workspace_root: Path | None = None, model: ModelClient | None = None,
                 run_dir: Path | None = None) -> None:
        self.capacity = config.num_workers
        self._model = model
        self._worker = SampleWorker(config, prefill=prefill, workspace_root=workspace_root, run_dir=run_dir)
        self.gate = gate_for(config)

    async def start(self, images: Collection[str] = ()) -> list[Unavailable]:
        unavailable = await self._worker.start(self._model)
        await self._worker.prefetch(images)
        return unavailable

    async def process(self, sample: Sample, attempt: int) -> Outcome:
        with model_gate.bound(self.gate):
            return await self._worker.process(sample, attempt=attempt)

    @property
    def policy(self) -> PolicyVersion | None:
        """The version the model client stamps its calls with (model.policy), once started."""
        return getattr(self._worker.model, "policy", None)

    @property
    def sandboxes_warm(self) -> int:
        """The samples' sandboxes alive now: made and not yet closed."""
        return self._worker.sandboxes_alive

    def drain(self) -> None:
        self._worker.drain()

    async def aclose(self) -> None:
        await self._worker.aclose()


def make(config: RunConfig, prefill: list[dict[str, Any]] | None, run_dir: Path) -> LocalExecutor:
    """The spec's target (trajforge.catalog.executors.EXECUTORS)."""
    ws = RunLayout(run_dir).workspaces if config.keep_workspaces else None
    return LocalExecutor(config, prefill=prefill, workspace_root=ws, run_dir=run_dir)

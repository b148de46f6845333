"""Where samples run: in this process (local) or on a Ray cluster (ray).

An executor is a plugin: one module with a factory `make(config, prefill, run_dir)` returning an
object that fits runner.scheduling.engine.Executor, plus one line in EXECUTORS (trajforge.catalog.executors,
where config reads the names). The command layer picks one by `--executor` and hands its factory
to the runner, which never imports an executor; executors import trajforge.sample (the
per-sample worker), never the runner. A module is imported only when chosen, so a local run
never loads Ray.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from trajforge.catalog.executors import EXECUTORS
from trajforge.config import RunConfig
from trajforge.errors import UsageError

__all__ = ["EXECUTORS", "make_executor"]


def make_executor(config: RunConfig, prefill: list[dict[str, Any]] | None, run_dir: Path) -> Any:
    """The executor `config.executor` names, built for this run."""
    spec = EXECUTORS.get(config.executor)
    if spec is None:
        raise UsageError(f"--executor: invalid value {config.executor!r}: must be one of {', '.join(EXECUTORS)}")
    return spec.load()(config, prefill, run_dir)

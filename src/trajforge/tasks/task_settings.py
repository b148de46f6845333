"""The task layer's section of the run's configuration, and TaskSettings, what the task layer reads of it.

TaskSection declares the flags of `--tasks` runs (trajforge.config collects it into RunConfig);
`task_settings()` turns them into TaskSettings (caps in bytes), whose defaults the section shows.
The task layer never sees RunConfig.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from trajforge.fields import SIZE_PATTERN, limit_bytes, shown


@dataclass(frozen=True, slots=True)
class TaskSettings:
    agent: str = "model"  # model | oracle
    pass_threshold: float = 1.0  # a reward at least this passes
    timeout_multiplier: float = 1.0  # scales agent, verifier and build timeouts
    max_cpus: float | None = None  # caps on what a task's [environment] asks for
    max_memory: int | None = None  # bytes
    max_storage: int | None = None  # bytes
    build_log_dir: Path | None = None  # None: the trajforge cache directory (Ray nodes)

    def scaled(self, seconds: float | None) -> float | None:
        return None if seconds is None else seconds * self.timeout_multiplier

    def capped(self, value: float | int | None, cap: float | int | None) -> float | int | None:
        """A task's own limit, at most the run's cap; the cap alone when the task sets none."""
        if cap is None:
            return value
        return cap if value is None else min(value, cap)


_DEFAULT = TaskSettings()  # the one spelling of each default


class TaskSection(BaseModel):
    model_config = ConfigDict(extra="forbid")

    agent: Literal["model", "oracle"] = Field(
        _DEFAULT.agent, description="model, or oracle: run each task's solution/solve.sh instead of a model")
    pass_threshold: float = Field(_DEFAULT.pass_threshold, ge=-1e12, le=1e12,
                                  description="a task passes when its reward is at least this")
    timeout_multiplier: float = Field(_DEFAULT.timeout_multiplier, gt=0, le=1_000,
                                      description="scales every task's agent, verifier and build timeouts")
    task_max_cpus: float | None = Field(None, gt=0, le=100_000,
                                        description="cap on the CPUs a task's [environment] asks for",
                                        json_schema_extra=shown("no cap"))
    task_max_memory: str | None = Field(None, pattern=SIZE_PATTERN,
                                        description="cap on the memory a task's [environment] asks for (e.g. 8g)",
                                        json_schema_extra=shown("no cap"))
    task_max_storage: str | None = Field(None, pattern=SIZE_PATTERN,
                                         description="cap on the storage a task's [environment] asks for (e.g. 20g)",
                                         json_schema_extra=shown("no cap"))

    def task_settings(self, build_log_dir: Path | None = None) -> TaskSettings:
        """What the task layer reads; `build_log_dir`: where build logs go."""
        return TaskSettings(agent=self.agent, pass_threshold=self.pass_threshold,
                            timeout_multiplier=self.timeout_multiplier, max_cpus=self.task_max_cpus,
                            max_memory=limit_bytes(self.task_max_memory), max_storage=limit_bytes(self.task_max_storage),
                            build_log_dir=build_log_dir)

"""TaskSettings: what the task layer reads of the run (built by trajforge.sample.lower_settings, never RunConfig)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

OUTPUTS_CAP = 10 << 30  # bytes of the agent's outputs the sealed verifier copies, without a sandbox disk limit


@dataclass(frozen=True, slots=True)
class TaskSettings:
    agent: str = "model"  # model | oracle
    pass_threshold: float = 1.0  # a reward at least this passes
    timeout_multiplier: float = 1.0  # scales agent, verifier and build timeouts
    max_cpus: float | None = None  # caps on what a task's [environment] asks for
    max_memory: int | None = None  # bytes
    max_storage: int | None = None  # bytes
    build_log_dir: Path | None = None  # None: the trajforge cache directory (Ray nodes)
    verifier_log_dir: Path | None = None  # None: the trajforge cache directory (Ray nodes)
    verifier: str = "default"  # default | sealed (--verifier): where a task's tests run
    rebuild: bool = False  # build every task image anew
    outputs_cap: int = OUTPUTS_CAP  # bytes of the agent's outputs the sealed verifier copies

    def scaled(self, seconds: float | None) -> float | None:
        return None if seconds is None else seconds * self.timeout_multiplier

    def capped(self, value: float | int | None, cap: float | int | None) -> float | int | None:
        """A task's own limit, at most the run's cap; the cap alone when the task sets none."""
        if cap is None:
            return value
        return cap if value is None else min(value, cap)

"""Where samples run, declared for config to read: EXECUTORS, one spec per executor.

A spec's target is the executor's factory `make(config, prefill, run_dir)` (trajforge.executors
builds it; it fits runner.scheduling.engine.Executor). Its capabilities say what the runner's preflight and
start line ask: whether samples run in this process (workspaces, the sandbox and task engine
checked here) or on other hosts; the spec's `needs` and `extra`, the Python modules it needs beyond
the base install (checked before a run starts).
`settings` names the run setting only it reads (`ray_address`), refused with another executor.
Adding an executor is one module in trajforge/executors plus one `EXECUTORS.register` line.
"""

from __future__ import annotations

from dataclasses import dataclass

from trajforge.registry import Registry, Spec


@dataclass(frozen=True, slots=True)
class ExecutorCaps:
    in_process: bool  # samples run in this process: its workspaces, sandboxes and engine checks are here


EXECUTORS: Registry[ExecutorCaps] = Registry("executor", ExecutorCaps)

EXECUTORS.register(Spec("local", "trajforge.executors.local_executor:make", "in this process",
                        ExecutorCaps(in_process=True)))
EXECUTORS.register(Spec("ray", "trajforge.executors.ray:make", "on a Ray cluster",
                        ExecutorCaps(in_process=False), settings="ray_address", needs=("ray",), extra="ray"))

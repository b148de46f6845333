"""The narrow settings the sample layer hands to the layers below it, built from RunConfig.

Layers below the sample (tools, model, sandbox) never see RunConfig; each gets its own settings
object, built here once per process from the run's configuration.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from trajforge.catalog.sandboxes import NetworkMode
from trajforge.config import RunConfig, size_bytes
from trajforge.model.types import ModelSettings
from trajforge.sandbox.sandbox_settings import ContainerSettings, ResourceLimits, SandboxSettings
from trajforge.tasks.task_settings import TaskSettings
from trajforge.tools.tool_settings import ToolSettings


def agent_model_settings(config: RunConfig) -> ModelSettings:
    """The agent's own model client's settings: the run's, plus what only the policy's calls do
    (token capture, the policy version); the judge's and the tools' clients never ask for ids."""
    return dataclasses.replace(config.model_settings(), capture_tokens=config.capture_tokens,
                               policy_version=config.policy_version)


def tool_settings(config: RunConfig) -> ToolSettings:
    """What the toolsets and their tools read of the run (tools/tool_settings.py)."""
    return ToolSettings(sections=config.tools, model=config.model_settings(),
                        network_allow=tuple(config.network.allow),
                        fetch_model_urls=config.sandbox_network != NetworkMode.NONE, tool_timeout=config.tool_timeout)


def sandbox_settings(config: RunConfig) -> SandboxSettings:
    """What the sandbox provider and its backends read of the run (sandbox/sandbox_settings.py)."""
    def size(text: str) -> int | None:
        return size_bytes(text) or None  # "0": no limit (an address-space limit of 0 would stop every command)

    limits = ResourceLimits(memory=size(config.sandbox_memory), tmp_size=size(config.sandbox_tmp_size),
                          shm_size=size(config.sandbox_shm_size), disk=size(config.sandbox_disk),
                          cpu_seconds=config.sandbox_cpu_seconds, cpus=config.sandbox_cpus)
    container = ContainerSettings(
        engine=config.container_engine, max_sandboxes=config.max_sandboxes, image_pull_timeout=config.image_pull_timeout,
        image=config.container_image, memory=config.container_memory or config.sandbox_memory,
        pids_limit=config.container_pids_limit, cpus=config.container_cpus or config.sandbox_cpus, run_name=config.run_name or "")
    return SandboxSettings(backend=config.sandbox, network=config.sandbox_network, allow=tuple(config.network.allow),
                           keep_workspaces=config.keep_workspaces, limits=limits, nproc=config.sandbox_nproc,
                           container=container)


def task_settings(config: RunConfig, build_log_dir: Path | None = None) -> TaskSettings:
    """What the task layer reads of the run (tasks/task_settings.py); `build_log_dir`: where build logs go."""
    def size(text: str | None) -> int | None:
        return size_bytes(text) or None if text else None

    return TaskSettings(agent=config.agent, pass_threshold=config.pass_threshold,
                        timeout_multiplier=config.timeout_multiplier, max_cpus=config.task_max_cpus,
                        max_memory=size(config.task_max_memory), max_storage=size(config.task_max_storage),
                        build_log_dir=build_log_dir)

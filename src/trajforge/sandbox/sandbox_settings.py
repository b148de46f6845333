"""SandboxSettings: all the sandbox layer knows of the run, and the one spelling of its defaults.

The sandbox never sees RunConfig (tests/test_architecture.py forbids trajforge.sandbox importing
trajforge.config): RunConfig.sandbox_settings() builds one SandboxSettings from the sandbox's
section of the configuration (section.py, whose defaults are these), which the run's
SandboxProvider (factory.py) holds and every backend reads. Sizes are bytes. Standard library
only: the bwrap backend imports it under a plain system Python too.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from trajforge.catalog.sandboxes import AUTO, NetworkMode


@dataclass(frozen=True, slots=True)
class ResourceLimits:
    """Per-sample limits (host/resources.py); None: not limited."""

    memory: int | None = 4 << 30
    tmp_size: int | None = 1 << 30
    shm_size: int | None = 256 << 20
    disk: int | None = 10 << 30
    cpu_seconds: int | None = 600
    cpus: float | None = 1.0  # CPUs' worth of time per period (cgroups.py); None: no share


@dataclass(frozen=True, slots=True)
class ContainerSettings:
    """The container backend's settings (container_sandbox.py, container_backend.py)."""

    engine: str = "auto"  # auto | podman | docker
    max_sandboxes: int = 16  # containers being created at once
    image_pull_timeout: float = 300.0
    image: str | None = None  # for rows without one (`container_image`)
    memory: str | None = None  # the engine's --memory; None: the sample memory limit
    pids_limit: int | None = 1024
    cpus: float | None = None
    run_name: str = ""  # a label on the run's containers


@dataclass(frozen=True, slots=True)
class SandboxSettings:
    backend: str = AUTO  # auto, or a backend of trajforge.catalog.sandboxes.SANDBOXES
    network: str = AUTO  # auto, or a NetworkMode (catalog.sandboxes); the provider resolves auto once
    allow: tuple[str, ...] = ()  # `network.allow`: destinations the firewall opens (CIDRs)
    keep_workspaces: bool = False
    limits: ResourceLimits = field(default_factory=ResourceLimits)
    nproc: int = 512  # processes of one bwrap sample (its uid's RLIMIT_NPROC, root mode)
    container: ContainerSettings = field(default_factory=ContainerSettings)

    def with_network(self, mode: NetworkMode) -> SandboxSettings:
        return replace(self, network=mode)

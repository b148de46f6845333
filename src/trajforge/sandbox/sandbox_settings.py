"""The sandbox layer's section of the run's configuration, and SandboxSettings, all it knows of the run.

SandboxSection declares the sandbox's run flags and --config keys (trajforge.config collects it
into RunConfig): which backend and network, the per-sample limits as the user writes them, the
container engine's own settings. `sandbox_settings()` turns them into SandboxSettings (sizes in
bytes, the container's fallbacks applied), which the run's SandboxProvider (factory.py) holds and
every backend reads; the sandbox never sees RunConfig (tests/test_architecture.py). The dataclasses'
defaults are the section's: each is spelled once, in its Field.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from trajforge.catalog.sandboxes import (
    AUTO, OLD_NAMES, SANDBOXES, NetworkMode, backend_choices, network_choices, network_help,
)
from trajforge.fields import FILE_ONLY, PID_MAX, SIZE_PATTERN, OneOf, limit_bytes


class NetworkConfig(BaseModel):
    """`network:` section. `allow`: CIDRs, addresses or host names that samples and the runner's
    fetches on their behalf may reach although they are loopback/private/link-local/CGNAT
    (netpolicy.py); host names only apply to the runner's fetches."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    allow: list[str] = Field(default_factory=list)

    @field_validator("allow")
    @classmethod
    def _valid_entries(cls, v: list[str]) -> list[str]:
        from trajforge.netpolicy import valid_allow_entry

        for entry in v:
            if not valid_allow_entry(entry):
                raise ValueError(f"{entry!r} is neither a CIDR/address nor a host name")
        return v


class SandboxSection(BaseModel):
    model_config = ConfigDict(extra="forbid")

    sandbox: Annotated[str, OneOf(backend_choices, outside=SANDBOXES.outside)] = Field(AUTO, description="{choices}")
    # egress: own network namespace, internet only (sandbox/network.py); "on" is the old name of host.
    sandbox_network: Annotated[str, OneOf(network_choices, network_help)] = Field(AUTO, description="{choices}")
    network: NetworkConfig = Field(default_factory=NetworkConfig, json_schema_extra=FILE_ONLY)
    keep_workspaces: bool = Field(False, description="keep each sample's workspace directory after it ends")
    sandbox_memory: str = Field("4g", pattern=SIZE_PATTERN, description="memory of one sample (bwrap: cgroup)",
                                json_schema_extra=FILE_ONLY)
    sandbox_tmp_size: str = Field("1g", pattern=SIZE_PATTERN, description="size of a sample's /tmp (tmpfs)",
                                  json_schema_extra=FILE_ONLY)
    sandbox_shm_size: str = Field("256m", pattern=SIZE_PATTERN, description="size of a sample's /dev/shm",
                                  json_schema_extra=FILE_ONLY)
    sandbox_disk: str = Field("10g", pattern=SIZE_PATTERN, description="bytes a sample may write to its workspace",
                              json_schema_extra=FILE_ONLY)
    sandbox_cpu_seconds: int | None = Field(600, ge=1, le=10**7, description="CPU seconds per process of a command",
                                            json_schema_extra=FILE_ONLY)
    sandbox_cpus: float | None = Field(1.0, gt=0, le=4096,
                                       description="CPUs one sample may keep busy (cgroup CPU quota)",
                                       json_schema_extra=FILE_ONLY)
    max_sandboxes: int = Field(16, ge=1, le=100_000, description="containers being created at once")
    sandbox_nproc: int = Field(512, ge=16, le=PID_MAX, description="processes of one bwrap sample (enforced as root)",
                               json_schema_extra=FILE_ONLY)
    container_engine: Literal["auto", "podman", "docker"] = Field(
        "auto", description="{choices}: engine of the container sandbox")
    container_image: str | None = Field(None, description="image of --sandbox container rows without an image",
                                        json_schema_extra=FILE_ONLY)
    container_memory: str | None = Field(None, pattern=r"^[0-9]+(\.[0-9]+)?[bkmgBKMG]?$",
                                         description="memory limit per container (default: sandbox_memory)",
                                         json_schema_extra=FILE_ONLY)
    container_pids_limit: int = Field(1024, ge=16, le=PID_MAX, description="processes per container",
                                      json_schema_extra=FILE_ONLY)
    container_cpus: float | None = Field(None, gt=0, description="CPUs per container (default: sandbox_cpus)",
                                         json_schema_extra=FILE_ONLY)
    image_pull_timeout: float = Field(300.0, gt=0, description="seconds to pull one missing image",
                                      json_schema_extra=FILE_ONLY)

    @field_validator("sandbox_network", mode="before")
    @classmethod
    def _network_alias(cls, v: Any) -> Any:
        return OLD_NAMES.get(v, v) if isinstance(v, str) else v  # configs written before egress keep working

    def sandbox_settings(self, *, backend: str | None = None, network: str | None = None,
                         run_name: str = "") -> SandboxSettings:
        """What the sandbox provider and its backends read. `backend`, `network`: what the run
        decided where --sandbox or --sandbox_network say `auto`; `run_name`: its containers' label."""
        limits = ResourceLimits(memory=limit_bytes(self.sandbox_memory), tmp_size=limit_bytes(self.sandbox_tmp_size),
                                shm_size=limit_bytes(self.sandbox_shm_size), disk=limit_bytes(self.sandbox_disk),
                                cpu_seconds=self.sandbox_cpu_seconds, cpus=self.sandbox_cpus)
        container = ContainerSettings(
            engine=self.container_engine, max_sandboxes=self.max_sandboxes, image_pull_timeout=self.image_pull_timeout,
            image=self.container_image, memory=self.container_memory or self.sandbox_memory,
            pids_limit=self.container_pids_limit, cpus=self.container_cpus or self.sandbox_cpus, run_name=run_name)
        return SandboxSettings(backend=backend or self.sandbox, network=network or self.sandbox_network,
                               allow=tuple(self.network.allow), keep_workspaces=self.keep_workspaces, limits=limits,
                               nproc=self.sandbox_nproc, container=container)


_DEFAULT = SandboxSection()  # the defaults below are the section's: nothing here spells one of its own


@dataclass(frozen=True, slots=True)
class ResourceLimits:
    """Per-sample limits (host/resources.py); None: not limited."""

    memory: int | None = limit_bytes(_DEFAULT.sandbox_memory)
    tmp_size: int | None = limit_bytes(_DEFAULT.sandbox_tmp_size)
    shm_size: int | None = limit_bytes(_DEFAULT.sandbox_shm_size)
    disk: int | None = limit_bytes(_DEFAULT.sandbox_disk)
    cpu_seconds: int | None = _DEFAULT.sandbox_cpu_seconds
    cpus: float | None = _DEFAULT.sandbox_cpus  # CPUs' worth of time per period (cgroups.py); None: no share


@dataclass(frozen=True, slots=True)
class ContainerSettings:
    """The container backend's settings (container_sandbox.py, container_backend.py)."""

    engine: str = _DEFAULT.container_engine  # auto | podman | docker
    max_sandboxes: int = _DEFAULT.max_sandboxes  # containers being created at once
    image_pull_timeout: float = _DEFAULT.image_pull_timeout
    image: str | None = _DEFAULT.container_image  # for rows without one (`container_image`)
    memory: str | None = _DEFAULT.container_memory  # the engine's --memory; None: the sample memory limit
    pids_limit: int | None = _DEFAULT.container_pids_limit
    cpus: float | None = _DEFAULT.container_cpus
    run_name: str = ""  # a label on the run's containers


@dataclass(frozen=True, slots=True)
class SandboxSettings:
    backend: str = _DEFAULT.sandbox  # auto, or a backend of trajforge.catalog.sandboxes.SANDBOXES
    network: str = _DEFAULT.sandbox_network  # auto, or a NetworkMode (catalog.sandboxes); the provider resolves auto
    allow: tuple[str, ...] = ()  # `network.allow`: destinations the firewall opens (CIDRs)
    keep_workspaces: bool = _DEFAULT.keep_workspaces
    limits: ResourceLimits = field(default_factory=ResourceLimits)
    nproc: int = _DEFAULT.sandbox_nproc  # processes of one bwrap sample (its uid's RLIMIT_NPROC, root mode)
    container: ContainerSettings = field(default_factory=ContainerSettings)

    def with_network(self, mode: NetworkMode) -> SandboxSettings:
        return replace(self, network=mode)

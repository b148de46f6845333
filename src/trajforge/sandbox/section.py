"""The sandbox layer's section of the run's configuration: its flags and --config keys.

SandboxSection declares which backend and network, the per-sample limits as the user writes them
and the container engine's own settings; trajforge.config collects it into RunConfig, and
`sandbox_settings()` turns it into the SandboxSettings every backend reads (sizes in bytes, the
container's fallbacks applied). Its defaults are SandboxSettings' (sandbox_settings.py, which
stays free of pydantic: the bwrap backend runs under a plain system Python too), shown as a user
writes them.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from trajforge.catalog.sandboxes import OLD_NAMES, SANDBOXES, backend_choices, network_choices, network_help
from trajforge.fields import FILE_ONLY, PID_MAX, SIZE_PATTERN, OneOf, limit_bytes, size_text
from trajforge.sandbox.sandbox_settings import ContainerSettings, ResourceLimits, SandboxSettings

_SETTINGS = SandboxSettings()  # the one spelling of each default
_LIMITS, _CONTAINER = _SETTINGS.limits, _SETTINGS.container


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

    sandbox: Annotated[str, OneOf(backend_choices, outside=SANDBOXES.outside)] = Field(_SETTINGS.backend, description="{choices}")
    # egress: own network namespace, internet only (sandbox/network.py); "on" is the old name of host.
    sandbox_network: Annotated[str, OneOf(network_choices, network_help)] = Field(_SETTINGS.network, description="{choices}")
    network: NetworkConfig = Field(default_factory=NetworkConfig, json_schema_extra=FILE_ONLY)
    keep_workspaces: bool = Field(_SETTINGS.keep_workspaces, description="keep each sample's workspace directory after it ends")
    sandbox_memory: str = Field(size_text(_LIMITS.memory), pattern=SIZE_PATTERN,
                                description="memory of one sample, e.g. 4g (bwrap: a cgroup); 0 turns the limit off")
    sandbox_tmp_size: str = Field(size_text(_LIMITS.tmp_size), pattern=SIZE_PATTERN, description="size of a sample's /tmp (tmpfs)")
    sandbox_shm_size: str = Field(size_text(_LIMITS.shm_size), pattern=SIZE_PATTERN, description="size of a sample's /dev/shm")
    sandbox_disk: str = Field(size_text(_LIMITS.disk), pattern=SIZE_PATTERN,
                              description="bytes a sample may write to its workspace, e.g. 10g (a disk of its own, "
                              "as root); 0 turns the disk off")
    sandbox_cpu_seconds: int | None = Field(_LIMITS.cpu_seconds, ge=1, le=10**7, description="CPU seconds per process of a command")
    sandbox_cpus: float | None = Field(_LIMITS.cpus, gt=0, le=4096,
                                       description="CPUs one sample may keep busy (cgroup CPU quota)")
    max_sandboxes: int = Field(_CONTAINER.max_sandboxes, ge=1, le=100_000, description="containers being created at once")
    sandbox_nproc: int = Field(_SETTINGS.nproc, ge=16, le=PID_MAX, description="processes of one bwrap sample (enforced as root)")
    container_engine: Literal["auto", "podman", "docker"] = Field(
        _CONTAINER.engine, description="{choices}: engine of the container sandbox")
    container_image: str | None = Field(None, description="image of --sandbox container rows without an image",
                                        json_schema_extra=FILE_ONLY)
    container_memory: str | None = Field(None, pattern=r"^[0-9]+(\.[0-9]+)?[bkmgBKMG]?$",
                                         description="memory limit per container (default: sandbox_memory)",
                                         json_schema_extra=FILE_ONLY)
    container_pids_limit: int = Field(_CONTAINER.pids_limit, ge=16, le=PID_MAX, description="processes per container",
                                      json_schema_extra=FILE_ONLY)
    container_cpus: float | None = Field(None, gt=0, description="CPUs per container (default: sandbox_cpus)",
                                         json_schema_extra=FILE_ONLY)
    image_pull_timeout: float = Field(_CONTAINER.image_pull_timeout, gt=0, description="seconds to pull one missing image",
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

"""Choosing and starting the sandbox backend for one sample (`--sandbox`).

A small dispatch on `config.sandbox`; each backend module is imported only when chosen. A row
with an image (or `--sandbox container`) runs in a container; "auto" means bwrap when a probe
sandbox works on this machine, else local; asking for an unusable backend explicitly is a clear
SandboxError rather than a silent downgrade.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from trajforge.sandbox.base import Sandbox, SandboxError
from trajforge.sandbox.process import DEFAULT_LIMITS, Limits
from trajforge.sandbox.resources import SampleLimits, cgroup_parent

if TYPE_CHECKING:
    from trajforge.config import RunConfig


def limits_for(config: RunConfig, *, memory_cgroup: bool = False) -> Limits:
    """Per-process rlimits of sandboxed commands: CPU seconds, and the memory limit as an
    address-space limit where no memory cgroup holds the whole sample (sandbox/resources.py)."""
    from trajforge.config import size_bytes

    return replace(DEFAULT_LIMITS, cpu_seconds=config.sandbox_cpu_seconds,
                   address_space_bytes=None if memory_cgroup else size_bytes(config.sandbox_memory))


def sample_limits(config: RunConfig) -> SampleLimits:
    from trajforge.config import size_bytes

    return SampleLimits(memory=size_bytes(config.sandbox_memory), tmp_size=size_bytes(config.sandbox_tmp_size),
                        shm_size=size_bytes(config.sandbox_shm_size), disk=size_bytes(config.sandbox_disk),
                        cpu_seconds=config.sandbox_cpu_seconds)


async def create_sandbox(config: RunConfig, *, cwd: str | None, image: str | None, root: Path) -> Sandbox:
    """A started sandbox for one sample, its workspace created under `root`. Raises SandboxError.

    `image` is not honoured by the local backend (it runs on the host as is); the container
    backend will take it over when it lands."""
    kind = config.sandbox
    network = await _network_mode(config)
    if image is not None or kind == "container":
        sandbox: Sandbox = await _container(config, cwd=cwd, image=image, root=root)
    elif kind == "bwrap" or (kind == "auto" and await _bwrap_usable()):
        from trajforge.sandbox.bwrap import BwrapSandbox, probe

        status = await probe()
        if not status.usable:
            raise SandboxError(f"--sandbox bwrap is not usable here: {status.detail} (see `trajforge doctor`)")
        sandbox = BwrapSandbox(root, keep=config.keep_workspaces, cwd=cwd, nproc=config.sandbox_nproc,
                               limits=limits_for(config, memory_cgroup=status.mode == "root" and cgroup_parent() is not None),
                               network=network == "host", egress=network == "egress", allow=config.network.allow,
                               sample_limits=sample_limits(config), bwrap=status.path)
    elif kind in ("auto", "local"):
        from trajforge.sandbox.local import LocalSandbox

        if network in ("none", "egress"):  # refusing beats silently leaving the network on
            raise SandboxError(f"the local sandbox cannot restrict networking (--sandbox_network {network}); "
                               "use --sandbox bwrap or --sandbox container")
        sandbox = LocalSandbox(root, keep=config.keep_workspaces, cwd=cwd, limits=limits_for(config))
    else:
        raise SandboxError(f"sandbox backend {kind!r} is not available yet; use --sandbox local")
    try:
        await sandbox.start()
    except BaseException:
        await sandbox.close()
        raise
    return sandbox


async def _network_mode(config: RunConfig) -> str:
    """The run's concrete network mode (runner/main.py resolves `auto` at start; callers that
    skip that, such as tests and Ray workers, resolve it here, once per process)."""
    from trajforge.errors import UsageError
    from trajforge.sandbox.network import resolve_mode

    try:
        return (await resolve_mode(config))[0]
    except UsageError as e:
        raise SandboxError(str(e)) from None


async def _bwrap_usable() -> bool:
    from trajforge.sandbox.bwrap import probe

    return (await probe()).usable


async def _container(config: RunConfig, *, cwd: str | None, image: str | None, root: Path) -> Sandbox:
    """A row with an image always runs in a container (the image is never silently ignored)."""
    from trajforge.sandbox.container import ContainerSandbox, backend_for

    image = image or config.container_image
    if image is None:
        raise SandboxError("--sandbox container needs an image: give the row an `image` field or set "
                           "`container_image` in the config file")
    backend = await backend_for(config)
    return ContainerSandbox(
        root, backend=backend, image=image, cwd=cwd, network=await _network_mode(config),
        allow=config.network.allow, limits=sample_limits(config),
        memory=config.container_memory or config.sandbox_memory, pids_limit=config.container_pids_limit,
        cpus=config.container_cpus,
        run_name=config.run_name, keep=config.keep_workspaces,
    )


async def prefetch_images(config: RunConfig, images: set[str]) -> None:
    """Start checking (and pulling) the run's distinct images in the background, before the first
    sample needs them; a problem surfaces later as that image's samples' `sandbox` failure."""
    if not images:
        return
    from trajforge.sandbox.container import backend_for

    try:
        backend = await backend_for(config)
    except SandboxError:
        return  # no engine: every sample with an image will say so
    backend.images.prefetch(sorted(images))

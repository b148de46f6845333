"""Choosing and starting the sandbox backend for one sample (`--sandbox`).

A small dispatch on `config.sandbox`; each backend module is imported only when chosen. A row
with an image (or `--sandbox container`) runs in a container; "auto" means bwrap when a probe
sandbox works on this machine, else local; asking for an unusable backend explicitly is a clear
SandboxError rather than a silent downgrade.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from trajforge.sandbox.base import Sandbox, SandboxError
from trajforge.sandbox.process import DEFAULT_LIMITS, Limits

if TYPE_CHECKING:
    from trajforge.config import RunConfig


def limits_for(config: RunConfig) -> Limits:
    """Resource limits of sandboxed processes. RunConfig has no limit settings yet, so these are
    the defaults; this is the one place to map such settings when they are added."""
    return DEFAULT_LIMITS


async def create_sandbox(config: RunConfig, *, cwd: str | None, image: str | None, root: Path) -> Sandbox:
    """A started sandbox for one sample, its workspace created under `root`. Raises SandboxError.

    `image` is not honoured by the local backend (it runs on the host as is); the container
    backend will take it over when it lands."""
    kind = config.sandbox
    if image is not None or kind == "container":
        sandbox: Sandbox = await _container(config, cwd=cwd, image=image, root=root)
    elif kind == "bwrap" or (kind == "auto" and await _bwrap_usable()):
        from trajforge.sandbox.bwrap import BwrapSandbox, probe

        status = await probe()
        if not status.usable:
            raise SandboxError(f"--sandbox bwrap is not usable here: {status.detail} (see `trajforge doctor`)")
        sandbox = BwrapSandbox(root, keep=config.keep_workspaces, cwd=cwd, limits=limits_for(config),
                               network=config.sandbox_network == "on", nproc=config.sandbox_nproc, bwrap=status.path)
    elif kind in ("auto", "local"):
        from trajforge.sandbox.local import LocalSandbox

        if config.sandbox_network == "none":  # refusing beats silently leaving the network on
            raise SandboxError("the local sandbox cannot disable networking (--sandbox_network none); "
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


async def resolve_backend(config: RunConfig) -> tuple[str, str | None]:
    """The backend `--sandbox` means on this machine for rows without an image, and, when `auto`
    fell back to `local` (no isolation), why bwrap could not be used."""
    if config.sandbox != "auto":
        return config.sandbox, None
    from trajforge.sandbox.bwrap import probe

    status = await probe()
    return ("bwrap", None) if status.usable else ("local", status.detail)


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
        root, backend=backend, image=image, cwd=cwd, network=config.sandbox_network == "on",
        memory=config.container_memory, pids_limit=config.container_pids_limit, cpus=config.container_cpus,
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

"""Choosing and starting the sandbox backend for one sample (`--sandbox`).

A small dispatch on `config.sandbox`; each backend module is imported only when chosen. Until
the bwrap and container backends exist, "auto" means local and asking for them explicitly is a
clear SandboxError rather than a silent downgrade.
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
    if kind in ("auto", "local"):
        from trajforge.sandbox.local import LocalSandbox

        if config.sandbox_network == "none":  # refusing beats silently leaving the network on
            raise SandboxError("the local sandbox cannot disable networking (--sandbox_network none); "
                               "use --sandbox bwrap or --sandbox container")
        sandbox: Sandbox = LocalSandbox(root, keep=config.keep_workspaces, cwd=cwd, limits=limits_for(config))
    else:
        raise SandboxError(f"sandbox backend {kind!r} is not available yet; use --sandbox local")
    try:
        await sandbox.start()
    except BaseException:
        await sandbox.close()
        raise
    return sandbox

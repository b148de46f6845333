"""A container's own filesystem on its sample's disk (rootful Podman): the size limit beyond the
workspace.

What a container writes outside its mounts (`/root`, `/usr`, `/var`...) goes to its copy-on-write
layer in the engine's storage, which no engine limits without quota-capable storage. As root, with
a sample disk (host/disk.py), the container is made in two steps instead of `run -d`: `create`
makes the layer's directories without mounting anything; they are then put on the sample's disk
(DiskImage.attach_layer: the layer's directory copied there and bound over), and `start` mounts
the overlay through that bind. The workspace and the layer then share the one `sandbox_disk` limit,
the kernel refuses writes beyond it, and Resources.check names it. All of it happens before any
process of the sample exists. Storage drivers other than overlay keep an unlimited layer (one
warning a run); Docker is left to `run -d` (untested here: see the README).
"""

from __future__ import annotations

import logging

from trajforge.sandbox.backends.container.container_engine import Engine
from trajforge.sandbox.host.disk import DiskImage
from trajforge.sandbox.interface import ExecResult

_LAYER = "{{.GraphDriver.Name}}\n{{.GraphDriver.Data.UpperDir}}\n{{.GraphDriver.Data.WorkDir}}"
_warned: set[str] = set()


def layered(engine: Engine, disk: DiskImage | None) -> DiskImage | None:
    """The disk a container's layer goes on, or None (`run -d` as before)."""
    return disk if disk is not None and engine.kind == "podman" else None


async def run_container(engine: Engine, run_args: list[str], name: str, disk: DiskImage | None) -> ExecResult:
    """Start the container of `run_args` (`run -d ...`), its layer on `disk` when there is one.
    The first failing step's result is returned, as `run -d`'s would be."""
    if disk is None:
        return await engine.run(*run_args, timeout=120)
    res = await engine.run("create", *run_args[2:], timeout=120)  # the same options, after `run -d`
    if res.exit_code != 0:
        return res
    info = await engine.run("inspect", "--format", _LAYER, name, timeout=60)
    driver, upper, work = (info.stdout.splitlines() + ["", "", ""])[:3]
    if info.exit_code != 0:
        return info
    if driver == "overlay":
        await disk.attach_layer(upper.strip(), work.strip())
    elif driver not in _warned:
        _warned.add(driver)
        logging.getLogger("trajforge.sandbox").warning(
            "containers' own filesystems are not size-limited: %s's storage driver is %r, not overlay "
            "(sandbox_disk limits their workspaces only)", engine.kind, driver)
    return await engine.run("start", name, timeout=120)

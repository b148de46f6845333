"""Run `trajforge` and hold it at a named step of making or removing a container, for a test to SIGKILL it.

`python tests/support/crash_container.py POINT ARGS...` runs `trajforge ARGS...` with one step of
the container backend wrapped: right after the step, the process prints `at POINT` on stdout and
waits, doing nothing more, until it is killed (as tests/support/crash_at.py does for the run's
files). The steps, in the order a container sample takes them:

- image-mounted: `podman image mount` returned (the image's root is being copied into the cache);
- disk-mounted: the sample's disk is mounted and bound on its workspace;
- lower-attached: the image's root is mounted, idmapped, as the overlay's lower layer;
- rootfs-mounted: the container's root filesystem (the overlay) is mounted;
- container-running: `podman run -d` returned;
- container-removed: `podman rm` returned (at the sample's end);
- rootfs-detached: the root filesystem is unmounted;
- disk-unmounted: the disk is unmounted and deleted.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run as a script: the repository's root

from tests.support.crash_at import hold  # noqa: E402
from trajforge.sandbox.backends.container.container_engine import Engine  # noqa: E402
from trajforge.sandbox.host import disk  # noqa: E402
from trajforge.sandbox.host.disk import DiskImage  # noqa: E402


def after(owner: Any, name: str, point: str, when: Callable[..., bool] = lambda *a: True) -> None:
    original = getattr(owner, name)

    @functools.wraps(original)
    async def wrapped(*args: Any, **kwargs: Any) -> Any:
        result = await original(*args, **kwargs)
        if when(*args):
            hold(point)
        return result

    setattr(owner, name, wrapped)


def after_sync(owner: Any, name: str, point: str) -> None:
    original = getattr(owner, name)

    @functools.wraps(original)
    def wrapped(*args: Any, **kwargs: Any) -> Any:
        result = original(*args, **kwargs)
        hold(point)
        return result

    setattr(owner, name, wrapped)


def install(point: str) -> None:
    engine_step = {"image-mounted": ("image", "mount"), "container-running": ("run", "-d"), "container-removed": ("rm",)}
    if point in engine_step:
        step = engine_step[point]
        after(Engine, "run", point, lambda self, *args: args[:len(step)] == step)
    elif point == "disk-mounted":
        after(DiskImage, "mount", point)
    elif point == "lower-attached":
        after_sync(disk, "idmapped_bind", point)
    elif point == "rootfs-mounted":
        after(DiskImage, "attach_rootfs", point)
    elif point == "rootfs-detached":
        after_sync(DiskImage, "detach_rootfs", point)
    elif point == "disk-unmounted":
        after(DiskImage, "unmount", point)
    else:
        raise SystemExit(f"crash_container: no point {point!r}")


POINTS = ("image-mounted", "disk-mounted", "lower-attached", "rootfs-mounted", "container-running",
          "container-removed", "rootfs-detached", "disk-unmounted")

if __name__ == "__main__":
    install(sys.argv[1])
    sys.argv = ["trajforge", *sys.argv[2:]]
    from trajforge.cli import entry

    entry()

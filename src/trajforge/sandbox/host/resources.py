"""Per-sample resource limits beside the cgroup (cgroups.py): /tmp, /dev/shm, workspace disk.

- /tmp and /dev/shm: sized tmpfs (root_view.py for bwrap, the engine for containers);
  `tmpfs_full` tells that a sample filled one.
- disk: a size-limited loop-mounted image (disk.py for a container's workspace and own filesystem,
  loopdisk.py for the bwrap sandboxes' workspaces).
A runner killed with SIGKILL cannot unmount or remove anything: `sweep_leftovers` (once per
process, before the first sample's limits are set up) unmounts and deletes the disk images and
removes the cgroups and workspace roots of runners that no longer exist; all carry the owner's pid
in their name.
After each command `Resources.check` turns a hit limit into a SandboxLimitError (the sample fails as
`sandbox` with a message naming the limit), so other samples run on while this one ends.
"""

from __future__ import annotations

import os
from pathlib import Path

from trajforge.sandbox.host import cgroups
from trajforge.sandbox.interface import SandboxLimitError
from trajforge.sandbox.host.disk import DiskImage, disk_usable, human, sweep_images
from trajforge.sandbox.sandbox_settings import ResourceLimits
from trajforge.sandbox.workspace import report_swept, sweep_roots

_swept = False


async def sweep_leftovers(force: bool = False) -> list[str]:
    """Remove disk images and cgroups of runners that are dead; what went.
    Once per process unless `force` (the container backend's own sweep of dead runners' leftovers)."""
    global _swept
    if (_swept and not force) or os.geteuid() != 0:
        return []
    _swept = True
    gone = await sweep_images()
    gone += sweep_roots()  # the workspace roots those disks were mounted in
    gone += cgroups.sweep()
    report_swept(gone)
    return gone



def tmpfs_full(path: str, size: int | None) -> bool:
    """A sized tmpfs with (almost) nothing left: the sample filled it."""
    if size is None:
        return False
    try:
        st = os.statvfs(path)
    except OSError:
        return False
    return st.f_bavail * st.f_frsize < max(64 << 10, size // 1000)


class Resources:
    """The limits of one root-mode container sample beside the engine's (container_sandbox.py): its
    workspace disk, and the checks of /tmp and /dev/shm."""

    def __init__(self, limits: ResourceLimits) -> None:
        self.limits = limits
        self.disk: DiskImage | None = None
        self.ns_pid = 0

    async def before_holder(self, workspace: Path) -> None:
        await sweep_leftovers()
        if self.limits.disk and disk_usable() is None:
            self.disk = DiskImage(workspace, self.limits.disk)
            await self.disk.mount()

    def after_holder(self, ns_pid: int) -> None:
        self.ns_pid = ns_pid

    def check(self) -> None:
        """After a command: SandboxLimitError naming the limit the sample hit, if any."""
        lim = self.limits
        if self.ns_pid:
            for path, size, key in ((f"/proc/{self.ns_pid}/root/tmp", lim.tmp_size, "sandbox_tmp_size"),
                                    (f"/proc/{self.ns_pid}/root/dev/shm", lim.shm_size, "sandbox_shm_size")):
                if tmpfs_full(path, size):
                    inside = path.split("/root", 1)[1]
                    raise SandboxLimitError(f"the sample filled {inside} ({human(size or 0)}, {key})")
        if self.disk is not None and self.disk.full():
            also = "; the container's own filesystem counts toward it" if self.disk.rootfs is not None else ""
            raise SandboxLimitError(f"the sample filled its workspace disk limit of {human(self.disk.size)} "
                                    f"(sandbox_disk{also})")

    async def close(self, keep: bool) -> None:
        if self.disk is not None:
            await self.disk.unmount(keep)
            self.disk = None

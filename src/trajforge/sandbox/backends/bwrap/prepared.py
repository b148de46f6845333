"""One root-mode bwrap sandbox made ahead of time (sandbox_pool.py), and its limit checks.

What the runner holds of a sandbox between its making and its end: its first process's pid and
channel, the uid the sample will have, its cgroup, its workspace and disk, its network link. After
each of the sample's commands `check` turns a limit the sample hit into SandboxLimitError.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from pathlib import Path

from trajforge.sandbox.channel import HelperChannel
from trajforge.sandbox.host import loopdisk
from trajforge.sandbox.host.cgroups import SampleGroup
from trajforge.sandbox.host.disk import human
from trajforge.sandbox.host.resources import tmpfs_full
from trajforge.sandbox.interface import SandboxLimitError
from trajforge.sandbox.sandbox_settings import ResourceLimits


@dataclass(slots=True)
class Prepared:
    """One sandbox made ahead of time (module doc)."""

    name: str
    uid: int
    root: Path  # its disk's mount point, or a plain directory
    workspace: Path = Path()  # on the host; /workspace inside
    channel: HelperChannel | None = None
    pid: int = 0  # host pid of its first process
    exited: asyncio.Future[int] | None = None  # once reaped: every process of the sandbox is dead
    group: SampleGroup | None = None
    disk: loopdisk.Region | None = None
    link: int | None = None  # its network link's index (egress)
    _oom_seen: int = field(default=0, repr=False)

    @property
    def alive(self) -> bool:
        return self.channel is not None and not self.channel.broken and not (self.exited and self.exited.done())

    def check(self, limits: ResourceLimits) -> None:
        """After a command: SandboxLimitError naming the limit the sample hit, if any."""
        if self.group is not None:
            kills = self.group.oom_kills()
            if kills > self._oom_seen:
                self._oom_seen = kills
                raise SandboxLimitError(f"the sample exceeded its memory limit of {human(limits.memory or 0)} "
                                        "(sandbox_memory): a process was killed by the kernel")
        for inside, size, key in (("tmp", limits.tmp_size, "sandbox_tmp_size"),
                                  ("dev/shm", limits.shm_size, "sandbox_shm_size")):
            if tmpfs_full(f"/proc/{self.pid}/root/{inside}", size):
                raise SandboxLimitError(f"the sample filled /{inside} ({human(size or 0)}, {key})")
        if self.disk is not None and limits.disk and loopdisk.full(self.root, limits.disk):
            raise SandboxLimitError(f"the sample filled its workspace disk limit of {human(limits.disk)} "
                                    "(sandbox_disk)")

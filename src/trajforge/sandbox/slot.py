"""One slot of the root-mode bwrap runtime: its helper, namespaces, cgroup and disk (slots.py
makes, reuses and destroys them), and the limit checks after a sample's command."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from pathlib import Path

from trajforge.sandbox import loopdisk
from trajforge.sandbox.base import SandboxLimitError
from trajforge.sandbox.channel import HelperChannel
from trajforge.sandbox.disk import human
from trajforge.sandbox.resources import MemoryGroup, SampleLimits, tmpfs_full


@dataclass(slots=True)
class Slot:
    index: int
    root: Path  # the mount point of its disk (on the disks' tmpfs), or a plain directory
    channel: HelperChannel | None = None  # to the slot's helper
    helper_pid: int = 0  # its host pid
    exited: asyncio.Future[int] | None = None  # resolves once the helper is reaped
    net: int | None = None  # the zygote's handle of its network namespace; None: the host's network
    memory: MemoryGroup | None = None
    disk: loopdisk.Region | None = None  # where its disk lives, when the workspace disk is limited
    _oom_seen: int = field(default=0, repr=False)

    @property
    def workspaces(self) -> Path:
        """Where its samples' workspaces are made (loopdisk.WORKSPACES on its disk)."""
        return self.root / loopdisk.WORKSPACES if self.disk is not None else self.root

    @property
    def alive(self) -> bool:
        return self.channel is not None and not self.channel.broken and not (self.exited and self.exited.done())

    def begin(self) -> None:
        """A new sample: memory kills before it are not its."""
        if self.memory is not None:
            self._oom_seen = self.memory.oom_kills()

    def check(self, limits: SampleLimits, helper_pid: int, *, parked: bool = False) -> None:
        """After a command: SandboxLimitError naming the limit the sample hit, if any. A sample that
        parked after it has nothing in /tmp, /dev/shm or its workspace: only memory can be hit."""
        if self.memory is not None:
            kills = self.memory.oom_kills()
            if kills > self._oom_seen:
                self._oom_seen = kills
                raise SandboxLimitError(f"the sample exceeded its memory limit of {human(limits.memory or 0)} "
                                   "(sandbox_memory): a process was killed by the kernel")
        if parked:
            return
        for inside, size, key in (("tmp", limits.tmp_size, "sandbox_tmp_size"),
                                  ("dev/shm", limits.shm_size, "sandbox_shm_size")):
            if tmpfs_full(f"/proc/{helper_pid}/root/{inside}", size):
                raise SandboxLimitError(f"the sample filled /{inside} ({human(size or 0)}, {key})")
        if self.disk is not None and limits.disk and loopdisk.full(self.root, limits.disk):
            raise SandboxLimitError(f"the sample filled its workspace disk limit of {human(limits.disk)} (sandbox_disk)")

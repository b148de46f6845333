"""Ids unique on the host: the root-mode sandboxes' uids, from blocks leased per process.

Per-uid limits and accounts of the kernel (RLIMIT_NPROC's process count, inotify instances,
pipe buffers, locked memory) hold per uid, so two sandboxes that shared a uid would share them;
drawn at random from 200 million, two of 5,000 sandboxes alive at once did about 6% of the time,
and two runs (or two test suites) on one machine could draw the same. Here a range is cut into
blocks; a process leases a block by holding an exclusive flock on the block's lock file under
LEASES (in /run, root's, never seen by a sample) and hands out ids of its blocks only, each to one
holder at a time. The kernel drops a lock when its holder dies, so a killed run's block is free
again with nothing to sweep; a block stays leased while its process lives (a forked child leases
blocks of its own). Within its blocks a process takes an id at random among those not in use, so
an id says nothing of how many came before it, and takes it back once its holder is gone (every
process of the sandbox dead). Processes that do not share /run (runners in containers of their
own) do not see each other's leases.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import secrets
import threading
from pathlib import Path

from trajforge.sandbox.interface import SandboxError

LEASES = Path("/run/trajforge")
# Sandbox uids come from a range no real account uses.
SANDBOX_UIDS = ("sandbox-uids", 1_800_000_000, 200_000_000, 1 << 16)  # (name, base, span, block)


class Leases:
    """Ids of `[base, base + span)`, in blocks of `block`, leased under `leases/name` (module doc)."""

    def __init__(self, name: str, base: int, span: int, block: int, *, leases: Path = LEASES) -> None:
        self.dir = leases / name
        self.base, self.block, self.blocks = base, block, span // block
        self._lock = threading.Lock()
        self._reset()

    def _reset(self) -> None:
        self._pid = os.getpid()
        self._held: dict[int, int] = {}  # block -> descriptor of its lock file
        self._live: dict[int, set[int]] = {}  # block -> its ids in use

    def take(self) -> int:
        """An id no other holder on the host has now: SandboxError when every block is in use."""
        with self._lock:
            if self._pid != os.getpid():  # a forked child: its parent's blocks are its parent's
                self._reset()
            block = next((b for b, live in self._live.items() if len(live) < self.block), None)
            if block is None:
                block = self._lease()
            live = self._live[block]
            while True:
                offset = secrets.randbelow(self.block)
                if offset not in live:
                    live.add(offset)
                    return self.base + block * self.block + offset

    def give_back(self, uid: int) -> None:
        """`uid` is free again: nothing holds it any more."""
        with self._lock:
            if self._pid == os.getpid():
                block, offset = divmod(uid - self.base, self.block)
                self._live.get(block, set()).discard(offset)

    def _lease(self) -> int:
        try:
            os.makedirs(self.dir, 0o700, exist_ok=True)
        except OSError as e:
            raise SandboxError(f"cannot make the lease directory {self.dir}: {e}") from e
        first = secrets.randbelow(self.blocks)  # not always block 0: fewer tries when runs are many
        for i in range(self.blocks):
            block = (first + i) % self.blocks
            if block in self._held:
                continue
            try:
                fd = os.open(self.dir / str(block), os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
            except OSError as e:
                raise SandboxError(f"cannot open the lease {self.dir / str(block)}: {e}") from e
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as e:
                os.close(fd)
                if e.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
                    continue  # another process's
                raise SandboxError(f"cannot lock the lease {self.dir / str(block)}: {e}") from e
            self._held[block], self._live[block] = fd, set()
            return block
        raise SandboxError(f"every block of ids under {self.dir} is leased by a live process")

    def close(self) -> None:
        """Every block given up (its ids must all be free)."""
        with self._lock:
            for fd in self._held.values():
                with contextlib.suppress(OSError):
                    os.close(fd)
            self._reset()


_sandbox_uids: Leases | None = None


def sandbox_uids() -> Leases:
    """The process's leases of sandbox uids (one per process: uniqueness is per host)."""
    global _sandbox_uids
    if _sandbox_uids is None:
        _sandbox_uids = Leases(*SANDBOX_UIDS)
    return _sandbox_uids

"""Killing processes by a tag in their environment: what process groups miss. Linux only.

A sandboxed command that calls setsid (a daemon, `setsid sleep &`) leaves its process group, and
`killpg` no longer reaches it. Every process a local sample starts inherits a marker variable
(`NAME=value`) in its environment, so a scan of /proc finds them all; Ray workers use the same
sweep for the agents of a node they started. A scan remembers what it read, so running one at
every sandbox close stays cheap with hundreds of processes alive (bench/RESULTS.md).
"""

from __future__ import annotations

import os
import select
import signal
import time

# kill_tagged remembers what it read, per variable name: (pid, inode of /proc/<pid>) -> the values
# of that variable in the process's environment. It runs at every sandbox close, and reading every
# process's environ each time (a few µs each) was one of the largest per-sample costs left with a
# few hundred samples in flight (bench/RESULTS.md). An entry stays valid while its process lives:
# a /proc inode belongs to one process, and a process carries a tag from birth (inherited) or not
# at all, since sandbox commands are spawned from the thread that scans and Popen returns only
# after the exec. Entries go when their process does, and all of them every _TAG_CACHE_SECONDS.
_TAG_CACHE_SECONDS = 2.0
_tag_cache: dict[bytes, tuple[float, dict[tuple[str, int], frozenset[bytes]]]] = {}


def _env_values(pid: str, name: bytes) -> frozenset[bytes]:
    """Values of variable `name` ("NAME=") in a process's environment.

    Unreadable counts as none: kernel threads and exited processes have no environment (ESRCH)
    and never will; one we may not read (EACCES) stays hidden from a fresh read as well."""
    try:
        fd = os.open(f"/proc/{pid}/environ", os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return frozenset()
    try:
        chunks = []
        while chunk := os.read(fd, 1 << 16):
            chunks.append(chunk)
    except OSError:
        return frozenset()
    finally:
        os.close(fd)
    environ = b"".join(chunks)
    if name not in environ:  # almost every process: no split needed
        return frozenset()
    return frozenset(e[len(name):] for e in environ.split(b"\0") if e.startswith(name))


def kill_tagged(marker: str, wait: float = 0.0) -> int:
    """SIGKILL every process whose environment contains `marker` ("NAME=value"); Linux only.

    Catches what process groups miss (children that called setsid, daemons). Rescans because a
    process may fork while we scan; returns how many processes were signalled. With `wait`, also
    waits up to that many seconds for them to exit: a killed process is still there (in /proc,
    holding its files) until the kernel has torn it down, which for a many-threaded process on a
    busy host is not instant; a caller that promises none is left must not return before that."""
    if not os.path.isdir("/proc"):
        return 0
    name, _, value = marker.encode().partition(b"=")
    name += b"="
    now = time.monotonic()
    stamp, cache = _tag_cache.get(name, (now, {}))
    if now - stamp > _TAG_CACHE_SECONDS:
        stamp, cache = now, {}
    me = os.getpid()
    killed: set[int] = set()
    pidfds: list[int] = []
    for _ in range(20):
        with os.scandir("/proc") as it:
            keys = [(entry.name, entry.inode()) for entry in it if entry.name.isdigit()]
        old = cache  # rebuilt from the listing, which drops the processes that are gone
        cache = {key: v if (v := old.get(key)) is not None else _env_values(key[0], name) for key in keys}
        found = [pid for pid in (int(k[0]) for k, v in cache.items() if value in v)
                 if pid not in killed and pid != me]
        if not found:
            break
        for pid in found:
            fd = _pidfd(pid) if wait > 0 else None  # before the kill: a pid is reused once reaped
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                if fd is not None:
                    os.close(fd)  # gone already, or not ours to kill: nothing to wait for
            else:
                if fd is not None:
                    pidfds.append(fd)
            killed.add(pid)
    _tag_cache[name] = (stamp, cache)
    if pidfds:
        _wait_exited(pidfds, wait)
    return len(killed)


def _pidfd(pid: int) -> int | None:
    try:
        return os.pidfd_open(pid)
    except OSError:  # exited meanwhile, or a kernel before 5.3 (no pidfds): not waited for
        return None


def _wait_exited(pidfds: list[int], timeout: float) -> None:
    """Until every process of `pidfds` has exited (its pidfd polls readable once its last thread
    is gone), at most `timeout` seconds: one stuck in the kernel must not hang the caller. Closes them."""
    poller = select.poll()
    for fd in pidfds:
        poller.register(fd, select.POLLIN)
    deadline, pending = time.monotonic() + timeout, len(pidfds)
    try:
        while pending and (left := deadline - time.monotonic()) > 0:
            for fd, _ in poller.poll(left * 1000):
                poller.unregister(fd)
                pending -= 1
    finally:
        for fd in pidfds:
            os.close(fd)

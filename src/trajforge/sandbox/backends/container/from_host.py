"""What the runner does to a running container from the host, executing nothing of the container's.

A sample is root in its container and may replace any program there (`/bin/sh`, `bash`, `kill`),
so the runner's own steps after the agent never `exec` into it: they act on the container's
processes and files from the host, through /proc, given the host pid of the container's init
(`inspect`'s State.Pid; the container's processes must run on this host):
- `members`: every process of the container, as the processes in its init's pid namespace;
- `stop_all`: SIGSTOP, then SIGKILL through a pidfd, of every one but the container's own (the
  init, and with an init process its first child, `sleep infinity`, the earliest started), pass
  after pass until a pass finds none; each kill waits for the process's exit on its pidfd (an
  event, not a timer). A stopped process cannot fork, so even a fork bomb ends within a few passes;
  `forks_refused` says whether the sample ran into its process limit (its pids cgroup's count);
- `kill_group`: the same for one process group (a command past its timeout), by the group id the
  container gives it (/proc's NSpgid);
- `fresh_dirs` / `remove`: paths of the container's root (its /proc/PID/root) removed with the
  standard library's fd-based rmtree (a symbolic link is unlinked, never followed) and made anew
  owned by the container's root (its uid_map), each opened with O_NOFOLLOW and checked by fstat;
- `read_file`: one regular file, every component opened with O_NOFOLLOW (the engine's `cp`
  follows a link at the path's end).
Nothing of the sample runs meanwhile (stop_all first), so nothing can swap a path between the
check and the use; the walk never leaves the container's root in any case.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
import select
import shutil
import signal
import stat
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from trajforge.sandbox.host.cgroups import ROOT as CGROUP_ROOT
from trajforge.sandbox.interface import SandboxError

class Gone(SandboxError):
    """The container's init is no longer there (the container stopped) or not on this host."""


STOP_PASSES = 50
EXIT_WAIT = 10.0  # seconds a pass waits for the processes it killed to exit


@dataclass(frozen=True, slots=True)
class Proc:
    pid: int  # on the host
    ppid: int
    state: str  # R, S, D, Z, T...
    start: int  # clock ticks after boot


def _stat(pid: int | str) -> Proc | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            raw = f.read().decode(errors="replace")
    except OSError:
        return None
    fields = raw[raw.rindex(")") + 2:].split()  # after the command name, which may hold spaces
    return Proc(int(pid), int(fields[1]), fields[0], int(fields[19]))


def pid_ns(pid: int | str) -> str | None:
    try:
        return os.readlink(f"/proc/{pid}/ns/pid")
    except OSError:
        return None


def is_init_of(pid: int | str, container_id: str) -> bool:
    """Whether host process `pid` is in a pid namespace of its own (never the runner's) and in a
    cgroup named after `container_id`: the container's, not a process that merely has its pid
    (an engine on another host reports pids of that host)."""
    ns = pid_ns(pid)
    if ns is None or ns == pid_ns("self") or len(container_id) < 12:
        return False
    try:
        with open(f"/proc/{pid}/cgroup", encoding="utf-8", errors="replace") as f:
            return container_id in f.read()
    except OSError:
        return False


def members(init: int) -> list[Proc]:
    """Every process in the pid namespace of `init` (the container's init included)."""
    ns = pid_ns(init)
    if ns is None:
        raise Gone(f"the container's init (host pid {init}) is gone or not on this host")
    found = []
    for entry in os.scandir("/proc"):
        if entry.name.isdigit() and pid_ns(entry.name) == ns:
            proc = _stat(entry.name)
            if proc is not None:
                found.append(proc)
    return found


def own(init: int, procs: list[Proc], has_init: bool) -> set[int]:
    """The container's own processes: its init and, when that is an init process (catatonit, tini),
    its earliest started child (the container's command), there before any `exec`."""
    keep = {init}
    if has_init:
        children = [p for p in procs if p.ppid == init]
        if children:
            keep.add(min(children, key=lambda p: (p.start, p.pid)).pid)
    return keep


async def ended(pid: int, timeout: float = EXIT_WAIT) -> bool:
    """Whether process `pid` has exited (or does within `timeout` seconds: one found exiting)."""
    try:
        fd = os.pidfd_open(pid)
    except OSError:
        return True
    try:
        await _exited([fd], timeout)
        return bool(select.select([fd], [], [], 0)[0])
    finally:
        os.close(fd)


def _open_same(proc: Proc, ns: str) -> int | None:
    """A pidfd of `proc` if the process with its pid is still it (same start, same namespace)."""
    try:
        fd = os.pidfd_open(proc.pid)
    except OSError:
        return None
    again = _stat(proc.pid)
    if again is None or again.start != proc.start or pid_ns(proc.pid) != ns:
        os.close(fd)
        return None
    return fd


async def _exited(fds: list[int], timeout: float) -> None:
    """Return once every pidfd reports its process's exit, or after `timeout` seconds."""
    loop = asyncio.get_running_loop()
    waits = []
    for fd in fds:
        done = loop.create_future()
        loop.add_reader(fd, lambda f=done: f.done() or f.set_result(None))
        waits.append(done)
    try:
        if waits:
            await asyncio.wait(waits, timeout=timeout)
    finally:
        for fd in fds:
            loop.remove_reader(fd)


async def _kill(procs: list[Proc], ns: str) -> int:
    """SIGSTOP all of `procs`, then SIGKILL them, and wait for their exits; how many were signalled."""
    fds = [fd for fd in (_open_same(p, ns) for p in procs) if fd is not None]
    killed = 0
    try:
        for fd in fds:  # all stopped first: none forks while its siblings die
            with contextlib.suppress(ProcessLookupError):
                signal.pidfd_send_signal(fd, signal.SIGSTOP)
        for fd in fds:
            with contextlib.suppress(ProcessLookupError):
                signal.pidfd_send_signal(fd, signal.SIGKILL)
                killed += 1
        await _exited(fds, EXIT_WAIT)
    finally:
        for fd in fds:
            os.close(fd)
    return killed


def _ns_of_init(init: int) -> str:
    ns = pid_ns(init)
    if ns is None:
        raise Gone(f"the container's init (host pid {init}) is gone or not on this host")
    return ns


async def _passes(init: int, chosen: Callable[[Proc], bool], *, has_init: bool, passes: int) -> tuple[int, bool]:
    """Kill the container's processes that `chosen` picks (never its own, never a zombie), pass after
    pass until a pass finds none: (how many were killed, whether none is left)."""
    ns = _ns_of_init(init)
    keep: set[int] | None = None
    killed = 0
    for _ in range(passes + 1):
        procs = members(init)
        if keep is None:
            keep = own(init, procs, has_init)
        targets = [p for p in procs if p.pid not in keep and p.state != "Z" and chosen(p)]
        if not targets:
            return killed, True
        if _ == passes:
            break
        killed += await _kill(targets, ns)
    return killed, False


async def stop_all(init: int, *, has_init: bool, passes: int = STOP_PASSES) -> int:
    """Kill every process of the container but its own; SandboxError when some are still alive after
    `passes`. Returns how many were killed."""
    killed, done = await _passes(init, lambda p: True, has_init=has_init, passes=passes)
    if not done:
        raise SandboxError(f"processes of the container were still alive after {passes} passes of SIGSTOP and "
                           "SIGKILL")
    return killed


def _group(pid: int) -> int | None:
    """A process's group id as its own pid namespace sees it (the last of /proc's NSpgid)."""
    try:
        with open(f"/proc/{pid}/status", encoding="ascii", errors="replace") as f:
            for line in f:
                if line.startswith("NSpgid:"):
                    return int(line.split()[-1])
    except (OSError, ValueError):
        return None
    return None


async def kill_group(init: int, pgid: int, *, passes: int = STOP_PASSES) -> int:
    """Kill process group `pgid` (as the container numbers it) of the container, pass after pass
    until none of it is left; the container's own processes never. How many were killed."""
    return (await _passes(init, lambda p: _group(p.pid) == pgid, has_init=True, passes=passes))[0]


def forks_refused(init: int) -> int | None:
    """How many forks the container's process limit refused so far (its pids cgroup's `pids.events`);
    None when that cannot be read."""
    try:
        with open(f"/proc/{init}/cgroup", encoding="utf-8") as f:
            lines = [line.rstrip("\n").split(":", 2) for line in f]
    except OSError:
        return None
    paths = [CGROUP_ROOT / "pids" / path.lstrip("/") for _, controllers, path in lines
             if "pids" in controllers.split(",")]
    paths += [CGROUP_ROOT / path.lstrip("/") for _, controllers, path in lines if not controllers]
    for path in paths:
        try:
            text = (path / "pids.events").read_text()
        except OSError:
            continue
        for line in text.splitlines():
            key, _, value = line.partition(" ")
            if key == "max" and value.strip().isdigit():
                return int(value)
    return None


def root_ids(init: int) -> tuple[int, int]:
    """The host uid and gid of the container's root (its user namespace's maps; 0 without one)."""
    ids = []
    for kind in ("uid_map", "gid_map"):
        with open(f"/proc/{init}/{kind}", encoding="ascii") as f:
            for line in f:
                inside, outside, _ = line.split()
                if inside == "0":
                    ids.append(int(outside))
                    break
            else:
                raise SandboxError(f"the container's user namespace maps no root ({kind} of host pid {init})")
    return ids[0], ids[1]


class _Root:
    """The container's root directory, opened from the host (its init's /proc root)."""

    def __init__(self, init: int) -> None:
        self.init = init
        before = _stat(init)
        try:
            self.fd = os.open(f"/proc/{init}/root", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except OSError as e:
            raise Gone(f"cannot open the container's root from the host: {e.strerror or e}") from None
        if before is None or _stat(init) != before:
            os.close(self.fd)
            raise Gone("the container's init ended while its root was being opened")

    def __enter__(self) -> _Root:
        return self

    def __exit__(self, *exc: object) -> None:
        os.close(self.fd)

    def open_dir(self, rel: str) -> int:
        """An fd of directory `rel` (relative to the root), each component opened without following a link."""
        fd = os.dup(self.fd)
        try:
            for part in [p for p in rel.split("/") if p]:
                nxt = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
                os.close(fd)
                fd = nxt
        except OSError:
            os.close(fd)
            raise
        return fd

    def remove(self, rel: str) -> None:
        """Remove `rel` (a tree, a file or a link), if there; its parent directory must be a real one."""
        parent, _, name = rel.rstrip("/").rpartition("/")
        pfd = self.open_dir(parent)
        try:
            try:
                st = os.stat(name, dir_fd=pfd, follow_symlinks=False)
            except FileNotFoundError:
                return
            if stat.S_ISDIR(st.st_mode):
                shutil.rmtree(name, dir_fd=pfd)  # fd-based: a link inside is unlinked, never followed
            else:
                os.unlink(name, dir_fd=pfd)
        finally:
            os.close(pfd)


def _rel(path: str) -> str:
    parts = [p for p in path.split("/") if p not in ("", ".")]
    if not path.startswith("/") or ".." in parts or not parts:
        raise SandboxError(f"not an absolute path beneath the container's root: {path!r}")
    return "/".join(parts)


def fresh_dirs(init: int, dirs: Mapping[str, int]) -> None:
    """Remove the top-level paths of `dirs` and make each anew, empty, the container root's, with its mode; checked."""
    rels = {_rel(p): mode for p, mode in dirs.items()}
    uid, gid = root_ids(init)
    with _Root(init) as root:
        for top in dict.fromkeys(r.split("/")[0] for r in rels):
            root.remove(top)
        for rel in sorted(rels, key=lambda r: r.count("/")):
            parent, _, name = rel.rpartition("/")
            pfd = root.open_dir(parent)
            try:
                with contextlib.suppress(FileExistsError):  # a parent made as such before
                    os.mkdir(name, 0o700, dir_fd=pfd)
                fd = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=pfd)
            finally:
                os.close(pfd)
            try:
                os.fchown(fd, uid, gid)
                os.fchmod(fd, rels[rel])
            finally:
                os.close(fd)
        for rel, mode in rels.items():  # the check: what the next step will use is what was made
            fd = root.open_dir(rel)
            try:
                st = os.fstat(fd)
                children = [c for c in os.listdir(fd) if f"{rel}/{c}" not in rels]
            finally:
                os.close(fd)
            if stat.S_IMODE(st.st_mode) != mode or (st.st_uid, st.st_gid) != (uid, gid) or children:
                raise SandboxError(f"/{rel} is not as it was just made (mode {stat.S_IMODE(st.st_mode):o}, owner "
                                   f"{st.st_uid}:{st.st_gid}, {len(children)} entries)")


def make_dirs(init: int, path: str) -> None:
    """Make directory `path` and its missing parents (0755, the container root's); an existing one
    is left as it is. Raises OSError where a component is not a directory (a link included)."""
    uid, gid = root_ids(init)
    with _Root(init) as root:
        fd = os.dup(root.fd)
        try:
            for part in _rel(path).split("/"):
                try:
                    os.mkdir(part, 0o755, dir_fd=fd)
                    made = True
                except FileExistsError:
                    made = False
                nxt = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
                os.close(fd)
                fd = nxt
                if made:
                    os.fchown(fd, uid, gid)
                    os.fchmod(fd, 0o755)
        finally:
            os.close(fd)


def remove(init: int, path: str) -> None:
    with _Root(init) as root:
        root.remove(_rel(path))


def read_file(init: int, path: str, limit: int) -> bytes | None:
    """The container's regular file `path` (at most `limit` bytes), no component followed as a
    link; None when it is not there. ValueError when it is something else or larger."""
    parent, _, name = _rel(path).rpartition("/")
    with _Root(init) as root:
        try:
            pfd = root.open_dir(parent)
        except FileNotFoundError:
            return None
        except OSError as e:
            raise ValueError(f"its directory cannot be opened without following a link ({e.strerror})") from None
        try:
            fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=pfd)
        except FileNotFoundError:
            return None
        except OSError as e:  # ELOOP: a link
            raise ValueError("not a regular file" if e.errno == errno.ELOOP else e.strerror) from None
        finally:
            os.close(pfd)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise ValueError("not a regular file")
        chunks, size = [], 0
        while size <= limit and (chunk := os.read(fd, min(1 << 20, limit + 1 - size))):
            chunks.append(chunk)
            size += len(chunk)
        data = b"".join(chunks)
    finally:
        os.close(fd)
    if len(data) > limit:
        raise ValueError(f"larger than {limit} bytes")
    return data

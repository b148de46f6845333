"""The mount namespace of one root-mode sandbox, built as root before any sample exists in it.

`build` runs in the sandbox's first process (sandbox_init.py) while it is still root and nothing
of a sample is there. It copies the run's template namespace (the read-only system view bwrap
made once per run, bwrap_runtime.py) and gives the sandbox a root of its own (a new tmpfs, then
pivot_root), so a mount point made for a row's cwd (/app/sub) exists in this sandbox alone. On
that root, no inode is shared with the host or with another sample:
- each system directory of the template (/usr, /opt, and /etc, the run's copy of the host's) is
  a read-only overlay of this sandbox's own, whose lower layers are an empty directory of the
  sandbox's root and the template's directory: the files are the host's, but every inode a
  sample opens, locks (flock, fcntl) or watches (inotify) is the overlay's, so a lock taken in a
  sample never blocks a host program or another sample, and an open in one sample wakes no
  other's watch; `df /usr` shows the sandbox's small root, not the host's disk;
- /dev is a directory of that root with its own device nodes (null, zero, full, random,
  urandom, tty), not binds of the host's (the root is mounted without nodev for them; a sample,
  without CAP_MKNOD and unable to write to the root, can make none);
- then a /proc of the sandbox's pid namespace (with bwrap's read-only parts), /dev/pts,
  /dev/mqueue, sized /tmp and /dev/shm, and the workspace at /workspace.
`alias` binds the workspace's directory of an absolute row cwd at that path (`begin`, still
before the drop). Nothing here is ever done again for another sample: a sandbox is used once.
Stdlib and ctypes only: part of the zygote's assembled source.
"""

from __future__ import annotations

import ctypes
import errno
import os
import stat

_NEWNS = 0x20000
_MS_RDONLY, _MS_NOSUID, _MS_NODEV, _MS_NOEXEC, _MS_REMOUNT, _MS_BIND = 0x1, 0x2, 0x4, 0x8, 0x20, 0x1000
_MS_REC, _MS_PRIVATE = 0x4000, 0x40000
_MNT_DETACH, _UMOUNT_NOFOLLOW = 2, 8
# What bwrap makes read-only in the /proc it mounts: the sandbox's own /proc keeps that.
_PROC_READ_ONLY = ("/proc/sys", "/proc/sysrq-trigger", "/proc/irq", "/proc/bus")
_SYS_MOVE_MOUNT = 429  # the same number on every architecture (asm-generic)
_SYS_PIVOT_ROOT = {"x86_64": 155, "aarch64": 41}
_MOVE_MOUNT_F_EMPTY_PATH, _AT_FDCWD = 0x4, -100
_MQUEUE = "/dev/mqueue"
# The new root while it is built: the template's /tmp, a mount point the sandbox gets anew anyway.
_STAGE = "/tmp"
# Template entries the sandbox mounts afresh rather than overlays.
_FRESH = ("proc", "tmp", "workspace", "dev")
# Its own device nodes: (name, major, minor), mode 0666 as the host's.
_DEVICES = (("null", 1, 3), ("zero", 1, 5), ("full", 1, 7), ("random", 1, 8), ("urandom", 1, 9), ("tty", 5, 0))
_DEV_LINKS = (("fd", "/proc/self/fd"), ("stdin", "/proc/self/fd/0"), ("stdout", "/proc/self/fd/1"),
              ("stderr", "/proc/self/fd/2"), ("core", "/proc/kcore"), ("ptmx", "pts/ptmx"))
# The overlays' empty top layer: a directory of the sandbox's own root, hidden beneath its /tmp.
_EMPTY = "/tmp"


def checked(result: int, what: str) -> int:
    """A libc call's result, or OSError with its errno (ctypes, use_errno=True)."""
    if result < 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")
    return result


class RootView:
    """The mount calls of a sandbox's first process, as root (ctypes' libc)."""

    def __init__(self, libc) -> None:  # type: ignore[no-untyped-def]
        self.libc = libc

    def mount(self, source: str | None, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
        enc = (lambda s: None if s is None else s.encode())
        checked(self.libc.mount(enc(source), target.encode(), enc(fstype), flags, enc(data)), f"mount {target}")

    def umount(self, target: str) -> None:
        checked(self.libc.umount2(target.encode(), _MNT_DETACH | _UMOUNT_NOFOLLOW), f"umount {target}")

    def build(self, template: int, workspace_tree: int, tmp: int | None, shm: int | None) -> None:
        """The sandbox's whole mount namespace (module doc); the caller is root, in the pid, IPC
        and network namespaces of the sandbox."""
        checked(self.libc.setns(template, _NEWNS), "setns(template)")
        checked(self.libc.unshare(_NEWNS), "unshare(mnt)")
        self.mount(None, "/", None, _MS_REC | _MS_PRIVATE)
        self._own_root()
        self.mount("proc", "/proc", "proc", _MS_NOSUID | _MS_NODEV | _MS_NOEXEC)  # this pid namespace's
        for path in _PROC_READ_ONLY:  # a second layer beside the samples' lack of privilege
            if os.path.exists(path):
                self.mount(path, path, None, _MS_BIND | _MS_REC)
                self.mount(None, path, None, _MS_BIND | _MS_REMOUNT | _MS_RDONLY | _MS_NOSUID | _MS_NODEV | _MS_NOEXEC)
        self._dev()
        self.mount("devpts", "/dev/pts", "devpts", _MS_NOSUID | _MS_NOEXEC, "newinstance,ptmxmode=0666,mode=620")
        self._mqueue()
        for path, size in (("/tmp", tmp), ("/dev/shm", shm)):
            self.mount("tmpfs", path, "tmpfs", _MS_NOSUID | _MS_NODEV, f"mode=1777{f',size={size}' if size else ''}")
        checked(self.libc.syscall(_SYS_MOVE_MOUNT, workspace_tree, b"", _AT_FDCWD, b"/workspace",
                                  _MOVE_MOUNT_F_EMPTY_PATH), "move_mount /workspace")
        os.chdir("/")

    def _own_root(self) -> None:
        """A root of this sandbox's own: a new tmpfs holding the template's entries (each system
        directory a read-only overlay of its own over the template's, module doc; links
        recreated), made the root with pivot_root; the template's root, shared by every copy,
        is then detached."""
        self.mount("tmpfs", _STAGE, "tmpfs", _MS_NOSUID, "mode=0755,size=1m,nr_inodes=4096")  # nodes in /dev
        empty = _STAGE + _EMPTY
        os.mkdir(empty, 0o755)
        with os.scandir("/") as entries:
            for entry in entries:
                name, new = entry.name, f"{_STAGE}/{entry.name}"
                if "/" + name == _EMPTY:
                    continue
                if entry.is_symlink():
                    os.symlink(os.readlink(entry.path), new)
                elif entry.is_dir(follow_symlinks=False):
                    os.mkdir(new, 0o755)
                    if name not in _FRESH:  # overlay wants two layers when it has no upper one
                        self.mount("overlay", new, "overlay", _MS_RDONLY | _MS_NOSUID | _MS_NODEV,
                                   f"lowerdir={empty}:{entry.path}")
        os.chdir(_STAGE)
        machine = os.uname().machine
        checked(self.libc.syscall(_SYS_PIVOT_ROOT.get(machine, 41), b".", b"."), "pivot_root")
        self.umount(".")  # the old root, stacked beneath the new one
        os.chdir("/")

    def _dev(self) -> None:
        """/dev: its own device nodes and the usual links, on the sandbox's root (module doc), and
        the mount points beneath it."""
        umask = os.umask(0)  # the nodes' own modes, with no chmod after
        try:
            for name, major, minor in _DEVICES:
                os.mknod(f"/dev/{name}", 0o666 | stat.S_IFCHR, os.makedev(major, minor))
        finally:
            os.umask(umask)
        for name, target in _DEV_LINKS:
            os.symlink(target, f"/dev/{name}")
        for name in ("pts", "shm", "mqueue"):
            os.mkdir(f"/dev/{name}", 0o755)  # each with a filesystem of its own mounted over it

    def _mqueue(self) -> None:
        """The IPC namespace's POSIX queues, where the sample can list them. A kernel without
        them (no mqueue file system: mq_open fails there too) has nothing to list."""
        try:
            self.mount("mqueue", _MQUEUE, "mqueue", _MS_NOSUID | _MS_NODEV | _MS_NOEXEC)
        except OSError as e:
            if e.errno != errno.ENODEV:
                raise

    def alias(self, inside: str, source: str) -> None:
        """Bind `source` (the workspace's directory, /workspace/...) at `inside`, an absolute row
        cwd: its missing directories are made on this sandbox's own root, world-searchable."""
        if not os.path.isdir(inside):
            os.makedirs(inside, 0o755, exist_ok=True)
        if os.path.realpath(inside) != inside:  # through a link of the system view: never beside it
            raise OSError(errno.EINVAL, f"the working directory {inside} leads through a link")
        self.mount(source, inside, None, _MS_BIND)

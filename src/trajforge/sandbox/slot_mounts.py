"""The mount and IPC namespace work of a root-mode slot helper (slot_helper.py), as root.

`SlotMounts` makes the slot's mount namespace once (copied from the run's template, with the
slot's /proc, /dev/pts and /dev/mqueue) and, per sample, moves its workspace in and out and
renews /tmp, /dev/shm and the IPC namespace when the sample left anything in them (`_used`,
`_ipc_used`); `pristine` tells the runner's parking check whether it left anything at all.
Stdlib and ctypes only: part of the helper's assembled source (helper.source).
"""

from __future__ import annotations

import ctypes
import errno
import os

from trajforge.sandbox.fsops import tree_state

_NEWNS, _NEWIPC = 0x20000, 0x8000000
_MS_NOSUID, _MS_NODEV, _MS_NOEXEC, _MS_REC, _MS_PRIVATE = 0x2, 0x4, 0x8, 0x4000, 0x40000
_MS_RDONLY, _MS_REMOUNT, _MS_BIND = 0x1, 0x20, 0x1000
# What bwrap makes read-only in the /proc it mounts: the slot's own /proc covers that one.
_PROC_READ_ONLY = ("/proc/sys", "/proc/sysrq-trigger", "/proc/irq", "/proc/bus")
_SYS_OPEN_TREE, _SYS_MOVE_MOUNT = 428, 429  # the same number on every architecture (asm-generic)
_OPEN_TREE_CLONE, _OPEN_TREE_CLOEXEC, _AT_SYMLINK_NOFOLLOW = 1, 0o2000000, 0x100
_MOVE_MOUNT_F_EMPTY_PATH, _AT_FDCWD = 0x4, -100
_MNT_DETACH, _UMOUNT_NOFOLLOW = 2, 8
_MQUEUE = "/dev/mqueue"
_SHM_INFO, _SEM_INFO, _MSG_INFO = 14, 19, 12


def checked(result: int, what: str) -> int:
    """A libc call's result, or OSError with its errno (ctypes, use_errno=True)."""
    if result < 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")
    return result


_IpcInfo = ctypes.c_int * 32  # room for struct shm_info, seminfo or msginfo


class SlotMounts:
    """The namespace calls of a slot helper (ctypes' libc, the host's and the template's mount ns).

    The slot's mount namespace is made once (`setup`), copied from the template, with the slot's
    /proc, /dev/pts and /dev/mqueue. Per sample only what a sample can change is renewed: its
    workspace is moved in (`enter`) and unmounted (`leave`); /tmp and /dev/shm are mounted afresh,
    and the IPC namespace made anew, when the sample left anything in them (an unprivileged sample
    cannot mount, unmount or write any other place of this namespace: the hygiene test looks for
    writable directories)."""

    def __init__(self, libc, host_mnt: int, template: int) -> None:  # type: ignore[no-untyped-def]
        self.libc, self.host_mnt, self.template = libc, host_mnt, template
        self.check = checked
        self.own = -1  # the slot's mount namespace
        self.points: list[str] = []  # the sample's workspace mount points, parents first
        self.sizes: tuple | None = None  # of the /tmp and /dev/shm mounted now
        self.mq = True  # /dev/mqueue is mounted (not on a kernel without POSIX queues)

    def mount(self, source: str | None, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
        enc = (lambda s: None if s is None else s.encode())
        self.check(self.libc.mount(enc(source), target.encode(), enc(fstype), flags, enc(data)), f"mount {target}")

    def umount(self, target: str) -> None:
        self.check(self.libc.umount2(target.encode(), _MNT_DETACH | _UMOUNT_NOFOLLOW), f"umount {target}")

    def setup(self) -> None:
        """The slot's mount namespace and a new IPC namespace; the caller is root."""
        libc, check = self.libc, self.check
        check(libc.setns(self.template, _NEWNS), "setns(template)")
        check(libc.unshare(_NEWNS | _NEWIPC), "unshare(mnt, ipc)")
        self.mount(None, "/", None, _MS_REC | _MS_PRIVATE)
        self.mount("proc", "/proc", "proc", _MS_NOSUID | _MS_NODEV | _MS_NOEXEC)  # this pid namespace's
        for path in _PROC_READ_ONLY:  # a second layer beside the samples' lack of privilege
            if os.path.exists(path):
                self.mount(path, path, None, _MS_BIND | _MS_REC)
                self.mount(None, path, None, _MS_BIND | _MS_REMOUNT | _MS_RDONLY | _MS_NOSUID | _MS_NODEV | _MS_NOEXEC)
        self.mount("devpts", "/dev/pts", "devpts", _MS_NOSUID | _MS_NOEXEC, "newinstance,ptmxmode=0666,mode=620")
        os.makedirs(_MQUEUE, 0o755, exist_ok=True)  # in the template's /dev: root's, the same for every slot
        self._mqueue()
        self.own = os.open("/proc/self/ns/mnt", os.O_RDONLY | os.O_CLOEXEC)
        os.chdir("/")

    def _mqueue(self) -> None:
        """The IPC namespace's POSIX queues, where the sample (and `_ipc_used`) can list them. A
        kernel without them (no mqueue file system: mq_open fails there too) has nothing to list."""
        try:
            self.mount("mqueue", _MQUEUE, "mqueue", _MS_NOSUID | _MS_NODEV | _MS_NOEXEC)
        except OSError as e:
            if e.errno != errno.ENODEV:
                raise
            self.mq = False

    def _tmpfs(self, tmp: int | None, shm: int | None, *, fresh: bool) -> None:
        for path, size in (("/tmp", tmp), ("/dev/shm", shm)):
            if fresh or _used(path):
                if self.sizes is not None:
                    self.umount(path)
                self.mount("tmpfs", path, "tmpfs", _MS_NOSUID | _MS_NODEV, f"mode=1777{f',size={size}' if size else ''}")
        self.sizes = (tmp, shm)

    def pristine(self, workdir: str, made: list | None) -> bool:
        """Whether the sample left nothing: its workspace as `made` recorded it (tree_state) and
        nothing in /tmp, /dev/shm or the IPC namespace. Run with the sample's uid: what it made
        unreadable is not pristine."""
        if made is None or workdir not in self.points or tree_state(workdir) != made:
            return False
        return not (_used("/tmp") or _used("/dev/shm") or _ipc_used(self.libc))

    def enter(self, mounts: list, tmp: int | None, shm: int | None) -> None:
        """The next sample's workspace (a detached clone of its host directory, made while the
        host's view is entered) and, the first time or for other sizes, /tmp and /dev/shm; the
        caller is root."""
        libc, check = self.libc, self.check
        check(libc.setns(self.host_mnt, _NEWNS), "setns(host mnt)")
        trees = []
        try:
            for inside, host in mounts:
                trees.append((inside, check(libc.syscall(_SYS_OPEN_TREE, _AT_FDCWD, host.encode(),
                              _OPEN_TREE_CLONE | _OPEN_TREE_CLOEXEC | _AT_SYMLINK_NOFOLLOW), "open_tree")))
            check(libc.setns(self.own, _NEWNS), "setns(slot mnt)")
            os.chdir("/")
            if self.sizes != (tmp, shm):
                self._tmpfs(tmp, shm, fresh=True)
            for inside, tree in trees:
                if not os.path.isdir(inside):
                    os.makedirs(inside, 0o755, exist_ok=True)  # a row's /app: an empty root-owned mount point
                check(libc.syscall(_SYS_MOVE_MOUNT, tree, b"", _AT_FDCWD, inside.encode(), _MOVE_MOUNT_F_EMPTY_PATH),
                      f"move_mount {inside}")
                self.points.append(inside)
        finally:
            for _, tree in trees:
                os.close(tree)
        os.chdir("/")

    def leave(self, *, empty: bool = False) -> None:
        """Once the sample's processes are dead: its workspace unmounted, /tmp and /dev/shm
        renewed if it left anything there, and a new IPC namespace if it left an object in its
        own (not looked at again when `pristine` just found them `empty`). The caller is root."""
        os.chdir("/")
        for inside in reversed(self.points):
            self.umount(inside)
        self.points = []
        if empty:
            return
        if self.sizes is not None:
            self._tmpfs(*self.sizes, fresh=False)
        if _ipc_used(self.libc):
            self.check(self.libc.unshare(_NEWIPC), "unshare(ipc)")
            if self.mq:
                self.umount(_MQUEUE)
                self._mqueue()


def _used(path: str) -> bool:
    """Whether anything is left in the file system mounted on `path`. A tmpfs with an inode limit
    (every one mounted here) counts its inodes in use, the root's included: one system call
    where listing the directory takes four."""
    st = os.statvfs(path)
    if st.f_files:
        return st.f_files - st.f_ffree > 1
    with os.scandir(path) as it:  # no inode count (the mqueue file system)
        return next(it, None) is not None


_INFO = _IpcInfo()


def _ipc_used(libc) -> bool:  # type: ignore[no-untyped-def]
    """Whether the IPC namespace holds a SysV segment, semaphore set or message queue (the
    counts of shmctl SHM_INFO, semctl SEM_INFO, msgctl MSG_INFO: no file to open) or a POSIX
    queue (the namespace's mqueue file system, mounted on /dev/mqueue)."""
    info = _INFO
    if libc.shmctl(0, _SHM_INFO, info) < 0 or info[0] > 0:  # shm_info.used_ids
        return True
    if libc.semctl(0, 0, _SEM_INFO, info) < 0 or info[7] > 0:  # seminfo.semusz
        return True
    if libc.msgctl(0, _MSG_INFO, info) < 0 or info[0] > 0:  # msginfo.msgpool
        return True
    return _used(_MQUEUE)

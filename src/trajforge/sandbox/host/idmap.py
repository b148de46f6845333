"""Idmapped mounts: a directory shown at another place with its owners shifted into a range of host ids.

A container in a user namespace whose ids 0..N-1 are host ids B..B+N-1 sees a file owned by host
uid U as U-B; a root filesystem kept with the image's own owners (0 for root) would show as
nobody's. An idmapped mount (mount_setattr MOUNT_ATTR_IDMAP, Linux 5.12; overlayfs accepts one as
a layer from 5.19) shows the same files owned by U+B without writing anything: the copy stays
shared, read-only, by runs of any id range. The mapping is a user namespace's: `UserNamespace`
holds one (a short-lived child made it; its descriptor keeps it), and `idmapped_bind` makes the
mount with the new mount API (open_tree, mount_setattr, move_mount), which no command-line tool
of Debian 12 offers. Root only.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import subprocess
from pathlib import Path

from trajforge.sandbox.process import SAFE_PATH

# Syscall numbers of the new mount API: one table for every architecture since Linux 5.2 (x86-64,
# arm64, ...), as they came after the tables were unified.
_OPEN_TREE, _MOVE_MOUNT, _MOUNT_SETATTR = 428, 429, 442
_OPEN_TREE_CLONE, _O_CLOEXEC, _AT_EMPTY_PATH, _AT_FDCWD = 1, 0o2000000, 0x1000, -100
_MOVE_MOUNT_F_EMPTY_PATH, _MOUNT_ATTR_IDMAP, _CLONE_NEWUSER = 0x4, 0x00100000, 0x10000000
_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long


class _MountAttr(ctypes.Structure):
    _fields_ = [("attr_set", ctypes.c_uint64), ("attr_clr", ctypes.c_uint64),
                ("propagation", ctypes.c_uint64), ("userns_fd", ctypes.c_uint64)]


def _unshare_user() -> None:  # in the child, before exec
    if _libc.unshare(_CLONE_NEWUSER) != 0:
        raise OSError(ctypes.get_errno(), "unshare(CLONE_NEWUSER)")


class UserNamespace:
    """A user namespace mapping ids 0..span-1 to host ids base..base+span-1, held by a descriptor."""

    def __init__(self, base: int, span: int) -> None:
        self.base, self.span = base, span
        # Its child leaves the namespace empty once killed; the descriptor keeps it (and its map).
        child = subprocess.Popen(["sleep", "infinity"], preexec_fn=_unshare_user, env={"PATH": SAFE_PATH},
                                 stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, cwd="/")
        try:  # Popen returns once the child exec'd: its unshare is done
            for name in ("uid_map", "gid_map"):
                with open(f"/proc/{child.pid}/{name}", "w", encoding="ascii") as f:
                    f.write(f"0 {base} {span}\n")
            self.fd: int | None = os.open(f"/proc/{child.pid}/ns/user", os.O_RDONLY | os.O_CLOEXEC)
        finally:
            child.kill()
            child.wait()

    def close(self) -> None:
        fd, self.fd = self.fd, None
        if fd is not None:
            os.close(fd)


def _check(result: int, what: str, path: Path) -> int:
    if result < 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what} {path}: {os.strerror(err)}")
    return result


def idmapped_bind(source: Path, target: Path, userns: UserNamespace) -> None:
    """Mount `source` on `target` (an existing directory) with owners shown through `userns`'s map.
    OSError when the kernel or the filesystem of `source` cannot (EINVAL, EPERM...)."""
    if userns.fd is None:
        raise OSError(f"the user namespace of {userns.base} is closed")
    tree = _check(_libc.syscall(_OPEN_TREE, _AT_FDCWD, os.fsencode(source), _OPEN_TREE_CLONE | _O_CLOEXEC),
                  "open_tree", source)
    try:
        attr = _MountAttr(_MOUNT_ATTR_IDMAP, 0, 0, userns.fd)
        _check(_libc.syscall(_MOUNT_SETATTR, tree, b"", _AT_EMPTY_PATH, ctypes.byref(attr), ctypes.sizeof(attr)),
               "mount_setattr", source)
        _check(_libc.syscall(_MOVE_MOUNT, tree, b"", _AT_FDCWD, os.fsencode(target), _MOVE_MOUNT_F_EMPTY_PATH),
               "move_mount", target)
    finally:
        os.close(tree)  # a detached tree not moved is freed here


def unmount_lazily(path: Path) -> bool:
    """umount2(MNT_DETACH): False when nothing is mounted there (or it cannot be)."""
    with contextlib.suppress(OSError):
        return _libc.umount2(os.fsencode(path), 2) == 0
    return False

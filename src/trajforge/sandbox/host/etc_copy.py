"""The run's own /etc for root-mode sandboxes: a copy of the host's, made once per run.

Host programs lock files of /etc (`/etc/passwd`, `/etc/group`... with flock or fcntl, through
lckpwdf, useradd, package managers). A lock is taken on an inode, read-only bind or not: a sample
that saw the host's own /etc could hold such a lock for as long as it runs and block those
programs. So the sandboxes' template (bwrap_runtime.py) binds this copy at /etc instead, and each
sandbox sees it through an overlay of its own (root_view.py). The copy holds what a sample could
read of the host's /etc anyway: directories, files and links that are world-readable (secrets
such as /etc/shadow are left out; links are copied as they are, and those that lead outside the
sandbox's view simply lead nowhere there); owners, modes and times are kept. `resolv.conf`
becomes a plain file: the run's own (egress: the DNS forwarder's address) or the host's content
(its link often leads into /run, which a sample does not see). No FIFO, socket or device is
copied. The runner writes it into the template's own tmpfs at /etc before any sandbox exists
(through /proc/<template init>/root: nothing of it is on the host's disk, and it goes with the
template).
"""

from __future__ import annotations

import os
import shutil
import stat
from pathlib import Path

_READABLE = stat.S_IROTH
_SEARCHABLE = stat.S_IROTH | stat.S_IXOTH
RESOLV = "resolv.conf"


def copy_etc(dest: Path, *, resolv: bytes | None = None, source: Path = Path("/etc")) -> None:
    """The empty directory `dest` made a copy of the world-readable part of `source` (module
    doc); `resolv`, if given, is its resolv.conf, else the host's content is."""
    _copy_dir(source, dest)
    _copy_meta(dest, os.stat(source))
    if resolv is None:
        try:
            with open(source / RESOLV, "rb") as f:  # through its link, wherever it leads on the host
                resolv = f.read(1 << 20)
        except OSError:
            resolv = None
    if resolv is not None:
        target = dest / RESOLV
        if target.is_symlink() or target.exists():
            target.unlink()
        target.write_bytes(resolv)
        target.chmod(0o644)


def _copy_dir(src: Path, dst: Path) -> None:
    stack, made = [(src, dst)], []
    while stack:  # no recursion: a deep tree must not exhaust Python's stack
        here, there = stack.pop()
        try:
            entries = list(os.scandir(here))
        except OSError:
            continue
        for entry in entries:
            target = there / entry.name
            try:
                st = entry.stat(follow_symlinks=False)
                if stat.S_ISLNK(st.st_mode):
                    os.symlink(os.readlink(entry.path), target)
                    os.lchown(target, st.st_uid, st.st_gid)
                elif stat.S_ISDIR(st.st_mode) and st.st_mode & _SEARCHABLE == _SEARCHABLE:
                    os.mkdir(target, 0o700)
                    stack.append((Path(entry.path), target))
                    made.append((Path(entry.path), target, st))
                elif stat.S_ISREG(st.st_mode) and st.st_mode & _READABLE:
                    shutil.copyfile(entry.path, target, follow_symlinks=False)
                    _copy_meta(target, st)
            except OSError:
                continue  # vanished or unreadable meanwhile: not in the copy
    for _, target, st in reversed(made):  # modes and times once the entries are in (a read-only directory)
        _copy_meta(target, st)


def _copy_meta(dst: Path, st: os.stat_result) -> None:
    os.chown(dst, st.st_uid, st.st_gid, follow_symlinks=False)
    os.chmod(dst, stat.S_IMODE(st.st_mode) & ~(stat.S_ISUID | stat.S_ISGID))
    os.utime(dst, ns=(st.st_atime_ns, st.st_mtime_ns), follow_symlinks=False)

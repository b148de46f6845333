"""What a container on trajforge's root filesystem (rootfs.py) changed, read from the host.

Its root is an overlay whose upper directory, on the sample's disk, holds exactly what the
container wrote: a file or directory there is added (A) or changed (C, when the image's root,
the lower directory, has that path too); a whiteout (a character device 0:0) is a deletion (D);
an opaque directory (xattr trusted.overlay.opaque = y) was made anew, hiding what the image had
in it (each such entry a D). The engine's `diff` says the same of a container on its own layer
(image_sandbox.ContainerTaskSandbox.changes). Pure reading of two host directories: the walk
never follows a link (the sample made them), and reads no file's content. Each directory of the
sample's tree is opened from its parent's descriptor with O_NOFOLLOW, so one that a process of
the sample swaps for a link while the walk runs leads nowhere.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Callable
from pathlib import Path

from trajforge.sandbox.interface import Change

_OPAQUE = "trusted.overlay.opaque"


def _in_lower(lower: Path, rel: str) -> bool:
    try:
        os.lstat(lower / rel)
        return True
    except OSError:  # absent, or a component is not a directory there
        return False


def _opaque(fd: int) -> bool:
    try:
        return os.getxattr(fd, _OPAQUE) == b"y"
    except OSError:
        return False


def _open_dir(name: str | Path, parent: int | None = None) -> int | None:
    """A directory of the sample's tree opened without following a link at any step: each level
    is opened from its parent's descriptor with O_NOFOLLOW, so a component swapped for a link
    (by a process of the sample that is still running) fails the open instead of leading out."""
    try:
        return os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=parent)
    except OSError:
        return None


def _entries(fd: int) -> list[tuple[str, os.stat_result]]:
    try:
        with os.scandir(fd) as it:
            return [(e.name, e.stat(follow_symlinks=False)) for e in it]
    except OSError:
        return []


def overlay_changes(lower: Path, upper: Path, wanted: Callable[[str], bool]) -> list[Change]:
    """The changes of the overlay `upper` over `lower` (the module doc), of the paths `wanted`
    accepts (absolute, as the container sees them). Depth first, with one open descriptor per
    level of the directory being read (a tree deeper than the process may open is read down to
    that depth)."""
    found: list[Change] = []

    def note(kind: str, rel: str) -> None:
        path = "/" + rel
        if wanted(path):
            found.append(Change(kind, path))

    def visit(rel_dir: str, fd: int) -> list[str]:
        """Note the entries of one directory; its subdirectories, to be read next."""
        subdirs = []
        for name, st in _entries(fd):
            rel = f"{rel_dir}/{name}" if rel_dir else name
            if stat.S_ISCHR(st.st_mode) and st.st_rdev == 0:
                note("D", rel)
                continue
            existed = _in_lower(lower, rel)
            note("C" if existed else "A", rel)
            if stat.S_ISDIR(st.st_mode):
                subdirs.append(name)
        return subdirs

    top = _open_dir(upper)
    if top is None:
        return found
    stack: list[tuple[str, int, list[str]]] = [("", top, visit("", top))]
    while stack:
        rel_dir, fd, pending = stack[-1]
        if not pending:
            os.close(fd)
            stack.pop()
            continue
        name = pending.pop()
        rel = f"{rel_dir}/{name}" if rel_dir else name
        child = _open_dir(name, fd)
        if child is None:
            continue
        if _opaque(child) and _in_lower(lower, rel):
            mine = {n for n, _ in _entries(child)}
            try:
                hidden = [e.name for e in os.scandir(lower / rel) if e.name not in mine]
            except OSError:
                hidden = []
            for gone in hidden:
                note("D", f"{rel}/{gone}")
        stack.append((rel, child, visit(rel, child)))
    return found

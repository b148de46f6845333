"""What a container on trajforge's root filesystem (rootfs.py) changed, read from the host.

Its root is an overlay whose upper directory, on the sample's disk, holds exactly what the
container wrote: a file or directory there is added (A) or changed (C, when the image's root,
the lower directory, has that path too); a whiteout (a character device 0:0) is a deletion (D);
an opaque directory (xattr trusted.overlay.opaque = y) was made anew, hiding what the image had
in it (each such entry a D). The engine's `diff` says the same of a container on its own layer
(image_sandbox.ContainerTaskSandbox.changes). Pure reading of two host directories: the walk
never follows a link (the sample made them), and reads no file's content.
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


def _opaque(path: str) -> bool:
    try:
        return os.getxattr(path, _OPAQUE, follow_symlinks=False) == b"y"
    except OSError:
        return False


def overlay_changes(lower: Path, upper: Path, wanted: Callable[[str], bool]) -> list[Change]:
    """The changes of the overlay `upper` over `lower` (the module doc), of the paths `wanted`
    accepts (absolute, as the container sees them)."""
    found: list[Change] = []

    def note(kind: str, rel: str) -> None:
        path = "/" + rel
        if wanted(path):
            found.append(Change(kind, path))

    stack = [""]
    while stack:
        rel_dir = stack.pop()
        try:
            entries = list(os.scandir(upper / rel_dir if rel_dir else upper))
        except OSError:
            continue
        for entry in entries:
            rel = f"{rel_dir}/{entry.name}" if rel_dir else entry.name
            st = entry.stat(follow_symlinks=False)
            if stat.S_ISCHR(st.st_mode) and st.st_rdev == 0:
                note("D", rel)
                continue
            existed = _in_lower(lower, rel)
            note("C" if existed else "A", rel)
            if stat.S_ISDIR(st.st_mode):
                stack.append(rel)
                if existed and _opaque(entry.path):
                    mine = {e.name for e in os.scandir(entry.path)}
                    try:
                        hidden = [e.name for e in os.scandir(lower / rel) if e.name not in mine]
                    except OSError:
                        hidden = []
                    for name in hidden:
                        note("D", f"{rel}/{name}")
    return found

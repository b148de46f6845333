"""Which row `cwd`s a sandbox on this host accepts: never one that would cover the runtime.

A row's absolute cwd becomes a mount point of the sample's workspace (bwrap) or a directory of
it (local). Mounted over the directories the sandbox's own interpreter and system live in, the
workspace would put files the sample writes where code is loaded from: the runner's Python
(its prefix and base prefix, their libraries, the directory of its executable, trajforge's own
package) and the system directories. `problem` says why such a cwd is refused, for every
spelling of it: repeated slashes (`//usr`, which normpath keeps), `.` and `..` components,
trailing slashes, and symbolic links on the host's path (a link to the runtime is the runtime).
It also refuses what cannot be a directory at all: the root, a NUL byte, a path longer than
the kernel takes. Rows with a container image are checked for that much only: the container's
own directories are the image's, and its file helper loads nothing from them (guard.py).
"""

from __future__ import annotations

import functools
import os
import posixpath
import sys
import sysconfig

SYSTEM = ("/usr", "/etc", "/opt", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/boot", "/sys", "/proc")
MAX_PATH = 1024  # bytes: far below PATH_MAX once the workspace's own host path is in front
MAX_NAME = 255  # bytes of one component


def normalise(path: str) -> str:
    """One spelling of a path: single slashes, no `.`, `..` resolved lexically, no trailing slash."""
    if path.startswith("/"):  # normpath keeps a leading "//": one slash first
        return posixpath.normpath("/" + path.lstrip("/"))
    return posixpath.normpath(path)


@functools.cache
def runtime() -> tuple[str, ...]:
    """The directories the runner's interpreter and trajforge load code from, each also as its
    real path."""
    import trajforge

    paths = {sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix,
             os.path.dirname(sys.executable), os.path.dirname(os.path.dirname(os.path.abspath(trajforge.__file__)))}
    for key in ("stdlib", "platstdlib", "purelib", "platlib"):
        with_path = sysconfig.get_paths().get(key)
        if with_path:
            paths.add(with_path)
    paths |= {os.path.realpath(p) for p in list(paths)}
    return tuple(sorted(normalise(p) for p in paths if p and p != "/"))


def _overlaps(a: str, b: str) -> bool:
    """One of two normalised absolute paths is the other or lies beneath it."""
    return a == b or a.startswith(b.rstrip("/") + "/") or b.startswith(a.rstrip("/") + "/")


def problem(cwd: object, *, host: bool = True) -> str | None:
    """Why a row's `cwd` cannot be used, or None. `host`: the row runs on this host's system
    view (bwrap, local), not in a container image."""
    if not isinstance(cwd, str) or not cwd.strip():
        return "must be a non-empty string"
    if "\0" in cwd:
        return "contains a NUL byte"
    raw = cwd.encode("utf-8", "surrogateescape")
    if len(raw) > MAX_PATH or any(len(part) > MAX_NAME for part in raw.split(b"/")):
        return f"is too long (at most {MAX_PATH} bytes, {MAX_NAME} per directory name)"
    if not cwd.startswith("/"):
        rel = normalise(cwd)
        return "leads outside the workspace" if rel == ".." or rel.startswith("../") else None
    path = normalise(cwd)
    if path == "/":
        return "is the root directory, which cannot hold the workspace"
    if not host:
        return None
    forms = {path, normalise(os.path.realpath(path))}
    for form in sorted(forms):
        for runtime_dir in runtime():
            if _overlaps(form, runtime_dir):
                return f"would cover the runner's Python runtime ({runtime_dir}); choose another directory"
        for system_dir in SYSTEM:
            if _overlaps(form, system_dir):
                return f"would cover the system directory {system_dir}; choose another directory"
    return None

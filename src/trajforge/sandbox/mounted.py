"""Workspaces that commands see at a different path than the host: the bwrap and container base.

The local backend shows commands the workspace at its host path. Isolating backends mount it
at a fixed path instead (`/workspace`, or a container row's `cwd`), so the model only ever sees
in-sandbox paths. This module owns the translation both ways: `resolve` maps what the model
writes (relative to the working directory, or absolute under a mount point) to a host path
inside the workspace and refuses everything else; `inside` maps a host path back for `cd`.
Workspace creation, job tracking and cleanup are LocalSandbox's, unchanged.
"""

from __future__ import annotations

import os
import posixpath
from pathlib import Path

from trajforge.sandbox.base import PathEscapeError, check_model_path
from trajforge.sandbox.local import LocalSandbox
from trajforge.sandbox.process import clean_env

# Resolved paths remembered for ownership hand-over (bwrap as root); past this, walk everything.
_MAX_TRACKED = 4096


class MountedSandbox(LocalSandbox):
    """A LocalSandbox whose workspace appears inside the sandbox at one or more mount points.

    Subclasses call `_mount(points, cwd_inside)` at the end of start(): `points` maps absolute
    in-sandbox paths to host directories inside the workspace."""

    _points: list[tuple[str, Path]]
    cwd_inside: str

    def _mount(self, points: dict[str, Path], cwd_inside: str) -> None:
        # Longest first, so a nested alias wins over /workspace.
        self._points = sorted(((p.rstrip("/") or "/", h) for p, h in points.items()), key=lambda x: -len(x[0]))
        self.workdir = next(p for p, h in self._points if h == self.workspace)
        self.cwd_inside = cwd_inside
        name, _, value = self._tag.partition("=")
        self.env = clean_env(self.workdir, {name: value})
        self.touched: set[Path] = set()
        self.touched_overflow = False

    def inside(self, host: Path) -> str:
        """The in-sandbox path of `host` (a path inside the workspace)."""
        best = None
        for point, root in self._points:
            if host == root or host.is_relative_to(root):
                rel = host.relative_to(root).as_posix()
                cand = point if rel == "." else posixpath.join(point, rel)
                best = cand if best is None or len(cand) < len(best) else best
        if best is None:
            raise PathEscapeError(f"{host} is not inside the workspace")
        return best

    def _to_host(self, path: str) -> Path:
        if path == "~" or path.startswith("~/"):  # HOME is the workspace mount
            path = self.workdir + path[1:]
        if not path.startswith("/"):
            return self.cwd / path
        norm = posixpath.normpath(path)
        for point, root in self._points:
            if norm == point or norm.startswith(point + "/"):
                return root / norm[len(point):].lstrip("/")
        raise PathEscapeError(self._escape_message(path))

    def _escape_message(self, path: str) -> str:
        return (f"{path!r} is outside the workspace {self.workdir}; use a path relative to the working "
                f"directory {self.cwd_inside} or an absolute path under {self.workdir}")

    def resolve(self, path: str) -> Path:
        self._check_open()
        path = check_model_path(path)
        # realpath follows every symlink on the host, so a link the sandbox made pointing outside
        # (or at an in-sandbox absolute path, which means nothing on the host) is refused.
        real = Path(os.path.realpath(self._to_host(path)))
        if not real.is_relative_to(self.workspace):
            raise PathEscapeError(self._escape_message(path))
        if len(self.touched) < _MAX_TRACKED:
            self.touched.add(real)
        else:
            self.touched_overflow = True
        return real

    def inside_cwd(self, cwd: str | None) -> str:
        """The in-sandbox working directory of a command: the sample's, or `cwd` resolved."""
        return self.inside(self._host_cwd(cwd))

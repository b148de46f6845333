"""A sample's workspace directory on the host: created under the run's root, removed at close.

Shared by the backends that keep the workspace on the runner's machine (local, bwrap and the
container's bind mount). The row's `cwd` becomes a directory inside it: relative as given, and
an absolute one (/app) mapped beneath it, since it cannot exist on the host for every sample.

The run's root, unless `keep_workspaces` puts it in the run directory, is a temporary directory
(`RunRoot`) named with the runner's pid and locked (flock) while the runner lives: a runner killed
with SIGKILL cannot remove it, so the next one removes those whose owner is gone and whose lock
it can take (`sweep_roots`), as it does their disks and cgroups. The lock settles what the pid
cannot: a runner in another pid namespace sharing the directory, or a reused pid.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import logging
import os
import stat
import subprocess
import tempfile
from pathlib import Path

from trajforge.sandbox.interface import SandboxError
from trajforge.sandbox.host.disk import mount_table, pid_alive
from trajforge.sandbox.process import SAFE_PATH


ROOT_PREFIX = "trajforge-ws-"


class RunRoot:
    """This process's workspace root in the temporary directory, made after sweeping dead runners'
    roots and locked until `cleanup` (or the process's death) so that no other runner sweeps it."""

    def __init__(self) -> None:
        report_swept(sweep_roots())
        self.name = tempfile.mkdtemp(prefix=f"{ROOT_PREFIX}{os.getpid()}-")
        self._fd: int | None = os.open(self.name, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        fcntl.flock(self._fd, fcntl.LOCK_EX)  # just made: never contended

    def cleanup(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            try:
                _remove_tree(Path(self.name))
            finally:
                os.close(fd)


def report_swept(gone: list[str]) -> None:
    """One warning line for what a sweep removed: the first sample of a run after a crash waits for
    it, and whoever finds a killed run's files gone should learn where they went."""
    if gone:
        more = f" and {len(gone) - 3} more" if len(gone) > 3 else ""
        logging.getLogger("trajforge.sandbox").warning(
            "removed %d leftover(s) of a killed trajforge run (disk images, memory cgroups, workspace roots): %s%s",
            len(gone), ", ".join(gone[:3]), more)


def sweep_roots(where: str | None = None) -> list[str]:
    """Remove the workspace roots of runners (of this user) that no longer exist; what went. A root
    still locked, or with a filesystem mounted beneath it (a killed runner's disks:
    resources.sweep_leftovers unmounts them first, and calls this again), is left alone."""
    where = where or tempfile.gettempdir()
    try:
        with os.scandir(where) as it:
            dead = [e.path for e in it if e.name.startswith(ROOT_PREFIX) and _owner_gone(e.name)
                    and e.is_dir(follow_symlinks=False) and e.stat(follow_symlinks=False).st_uid == os.geteuid()]
    except OSError:
        return []
    if not dead:
        return []
    mounts = mount_table()
    if mounts is None:  # no way to tell what is mounted beneath: remove nothing
        return []
    gone = []
    for root in dead:
        if any(point == root or point.startswith(root + "/") for _, point, _ in mounts):
            continue
        try:
            fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # held by a live runner: BlockingIOError
            _remove_tree(Path(root))
        except OSError:
            continue
        finally:
            os.close(fd)
        if not os.path.exists(root):
            gone.append(root)
    return gone


def _owner_gone(name: str) -> bool:
    pid = name[len(ROOT_PREFIX):].split("-", 1)[0]  # roots of older versions (no pid) stay
    return pid.isdigit() and int(pid) != os.getpid() and not pid_alive(int(pid))


def create(root: Path, cwd: str | None) -> tuple[Path, Path]:
    """(workspace, host directory of the cwd inside it), both created; SandboxError otherwise."""
    try:
        root.mkdir(parents=True, exist_ok=True)
        # resolve(): the real path, so containment checks compare like with like.
        workspace = Path(tempfile.mkdtemp(prefix="sample-", dir=root)).resolve()
    except OSError as e:
        raise SandboxError(f"cannot create a workspace under {root}: {e}") from e
    rel = (cwd or "").lstrip("/")
    host_cwd = Path(os.path.normpath(workspace / rel)) if rel else workspace
    if not host_cwd.is_relative_to(workspace):
        os.rmdir(workspace)
        raise SandboxError(f"task cwd {cwd!r} points outside the workspace")
    host_cwd.mkdir(parents=True, exist_ok=True)
    return workspace, host_cwd


def create_fresh(root: Path, cwd: str | None) -> tuple[Path, Path]:
    """Like create, in a directory of the runner's own that no sample can see or has seen (a
    root-mode sandbox's, backends/bwrap/sandbox_pool.py): a plain name, and no real-path lookup (`root` is one
    already)."""
    try:
        workspace = root / f"sample-{os.urandom(6).hex()}"
        os.mkdir(workspace, 0o700)
    except OSError as e:
        raise SandboxError(f"cannot create a workspace under {root}: {e}") from e
    try:
        return workspace, cwd_in(workspace, cwd)
    except SandboxError:
        os.rmdir(workspace)
        raise


def cwd_in(workspace: Path, cwd: str | None) -> Path:
    """The host directory of a row's cwd in a fresh workspace, made (absolute cwds beneath it)."""
    rel = os.path.normpath((cwd or "").lstrip("/")) if cwd and cwd.strip("/") else ""
    if rel in ("", "."):
        return workspace
    if rel == ".." or rel.startswith("../"):
        raise SandboxError(f"task cwd {cwd!r} points outside the workspace")
    host_cwd = workspace / rel
    try:
        os.makedirs(host_cwd, exist_ok=True)
    except OSError as e:
        raise SandboxError(f"cannot make the working directory {cwd!r} in the workspace: {e.strerror}") from None
    return host_cwd


async def remove(workspace: Path) -> None:
    if not _remove_if_flat(workspace):
        await asyncio.to_thread(_remove_tree, workspace)


def _remove_if_flat(root: Path, most: int = 16) -> bool:
    """Remove a workspace holding at most `most` plain files, on the spot; False if it holds more,
    has subdirectories or resists. Such a removal takes tens of µs, less than the thread hop it
    saves, and cannot stall the event loop; anything larger goes to a thread."""
    try:
        with os.scandir(root) as it:
            entries = [e for _, e in zip(range(most + 1), it)]
        if len(entries) > most or any(e.is_dir(follow_symlinks=False) for e in entries):
            return False
        for e in entries:
            os.unlink(e.path)
        os.rmdir(root)
    except FileNotFoundError:
        return not root.exists()
    except OSError:  # read-only directory and the like: _remove_tree knows how
        return False
    return True


_OPEN_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_DEPTH = 32  # directories open at once; a deeper subtree is moved up beside the top first


def _remove_tree(root: Path) -> None:
    """`rm -rf root` for a tree a sample made, best effort (what cannot go stays, silently, as
    with shutil.rmtree before): never following a link, without recursion (a sample's tree may
    be thousands of levels deep: shutil.rmtree's RecursionError left slots, disks and whole
    workspace roots behind) and holding at most _DEPTH directories open."""
    try:
        top = os.open(root, _OPEN_DIR)
    except OSError:
        return
    try:
        moved = [0]
        while _clear(top, moved):  # a pass that removed something: subtrees moved up may remain
            pass
    finally:
        os.close(top)
    with contextlib.suppress(OSError):
        os.rmdir(root)


def _clear(top: int, moved: list[int]) -> int:
    """One pass emptying the directory `top`; how many entries went or moved up."""
    done = 0
    stack = [(top, "", iter(_names(top)))]
    while stack:
        fd, here, names = stack[-1]
        name = next(names, None)
        if name is None:
            stack.pop()
            if stack:
                os.close(fd)
                done += _try(os.rmdir, here, stack[-1][0])
            continue
        try:
            st = os.stat(name, dir_fd=fd, follow_symlinks=False)
        except OSError:
            continue
        if not stat.S_ISDIR(st.st_mode):
            done += _try(os.unlink, name, fd)
            continue
        if len(stack) >= _DEPTH:  # too deep to hold open: the next pass takes it from the top
            moved[0] += 1
            try:
                os.rename(name, f".trajforge-deep-{moved[0]}", src_dir_fd=fd, dst_dir_fd=top)
                done += 1
                continue
            except OSError:  # another filesystem beneath: go down anyway
                pass
        try:
            sub = os.open(name, _OPEN_DIR, dir_fd=fd)
        except OSError:
            continue
        stack.append((sub, name, iter(_names(sub))))
    return done


def _names(fd: int) -> list[str]:
    try:
        return os.listdir(fd)
    except OSError:
        return []


def _try(op, name: str, parent: int) -> int:  # type: ignore[no-untyped-def]
    """1 when op(name, dir_fd=parent) worked; a directory the model made read-only is made
    writable by its owner first."""
    for attempt in (1, 2):
        try:
            op(name, dir_fd=parent)
            return 1
        except PermissionError:
            if attempt == 1:
                with contextlib.suppress(OSError):
                    os.fchmod(parent, stat.S_IRWXU)
        except OSError:
            return 0
    return 0


def shift_owners(root: Path, base: int, span: int) -> None:
    """Owner and group of everything beneath `root` (not `root` itself) moved up by `base`, as the
    files of a container whose ids 0..span-1 map to host ids from `base` (others stay)."""
    for parent, dirs, files in os.walk(root):
        for name in dirs + files:
            path = os.path.join(parent, name)
            st = os.lstat(path)
            os.lchown(path, st.st_uid + base if st.st_uid < span else -1,
                      st.st_gid + base if st.st_gid < span else -1)
            if st.st_mode & (stat.S_ISUID | stat.S_ISGID) and stat.S_ISREG(st.st_mode):
                os.chmod(path, stat.S_IMODE(st.st_mode))  # chown cleared them


async def defuse(kept: Path) -> None:
    """A kept workspace loses what would act with its owner's rights on the host: setuid and
    setgid bits (a sample's copy of a shell, owned by root under `local` or by a sample's uid)
    and device nodes. `find -P` never follows links; no process of the sample runs any more.
    Links are kept as they are (they are the sample's data) and never followed here."""
    await asyncio.to_thread(subprocess.run, [
        "find", "-P", str(kept), "(", "-type", "b", "-o", "-type", "c", ")", "-delete", "-o",
        "-type", "f", "-perm", "/6000", "-exec", "chmod", "ug-s", "{}", "+"],
        capture_output=True, env={"PATH": SAFE_PATH}, cwd="/", timeout=600)


def keep(ws: Path, root: Path) -> Path | None:
    """`keep_workspaces`: the files outlive the sandbox in a directory beside the sandboxes' (moved when
    on the same filesystem, else copied by `cp -a`, which recreates FIFOs instead of opening them)."""
    target = root / ws.name
    try:
        os.rename(ws, target)
        return target
    except OSError:
        pass
    done = subprocess.run(["cp", "-a", "--", f"{ws}/.", str(target)], capture_output=True, env={"PATH": SAFE_PATH},
                          cwd="/", timeout=600)
    return target if done.returncode == 0 else None

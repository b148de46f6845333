"""The bwrap backend: every sample in its own namespaces (`--sandbox bwrap`, the auto default).

Commands see a read-only host system (/usr, /etc, /opt and the /bin, /lib... links), the
sample's workspace read-write at /workspace, private sized /tmp and /dev/shm, a private /proc,
and new pid/ipc/uts (and, unless `--sandbox_network host`, network) namespaces. /root, /home, /var,
/run and the runner's files are simply not there. A row's absolute cwd (/app, /app/sub) is a
directory of the workspace that is also mounted at that path.

Each sample has one helper process inside (helper.py), spoken to over a socketpair (channel.py):
commands are spawned by it and file operations run in it, inside the sample's mount view, so
there is no per-command entry chain and no file access from the host. Two modes, because the
kernel never enforces RLIMIT_NPROC for host uid 0:
- runner is root ("root" mode): a sample takes a slot (slots.py, bwrap_root.py): a warm helper
  forked once by the run's zygote as the init of the slot's pid namespace, with the slot's
  network namespace, memory cgroup, workspace disk and mount namespace (a copy of the run's
  bwrap-built template). From the helper the sample gets its workspace mounted in, /tmp,
  /dev/shm and the IPC namespace renewed if the previous sample left anything there, and a uid
  of its own, which is the helper's real and effective uid while the sample runs (saved uid 0, so it can
  set up the next sample; slot_helper.py). The process limit holds (fork bombs stop), the
  sandbox cannot signal, ptrace or read the helper, and nothing of a sample outlives it: the
  helper kills every other process of its namespace before the slot is reused. Egress goes
  through the run's router (router.py); the per-sample limits of resources.py hold.
- runner is unprivileged ("user" mode): --unshare-all creates a user namespace and the helper is
  bwrap's command (--as-pid-1), started with a host interpreter visible inside (helper_python);
  the helper and the files are the user's own.
Both modes: background jobs share the sample's pid namespace and live until the sample closes.
`bwrap_argv` builds the whole command line (the one place to add options).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import posixpath
import secrets
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path


from trajforge.sandbox import workspace
from trajforge.sandbox.base import ExecResult, Job, Sandbox, SandboxError
from trajforge.sandbox.bwrap_layout import (
    NOT_FOUND, RESERVED, SYSTEM_DIRS, WORKSPACE, bwrap_argv, find_bwrap, host_layout, resolv_conf_target,
)
from trajforge.sandbox.bwrap_root import RootRuntime, root_runtime
from trajforge.sandbox.bwrap_start import START_TIMEOUT, chown_beneath, helper_python, start_user
from trajforge.sandbox.channel import HelperChannel
from trajforge.sandbox.process import (
    DEFAULT_LIMITS, DEFAULT_OUTPUT_CAP, SHELL, Limits, bash_limits_prefix, clean_env, kill_group, limit_pairs,
)
from trajforge.sandbox.resources import MemoryGroup, SampleLimits

# Sandbox uids (root mode) come from a range no real account uses.
_UID_BASE, _UID_SPAN = 1_800_000_000, 200_000_000
from trajforge.sandbox.slots import Slot

@functools.lru_cache(maxsize=8)
def _shell_config(limits: Limits) -> dict[str, object]:
    """The helper's command settings for these limits (the same for every sample of a run)."""
    bash = os.path.basename(SHELL) == "bash"
    return {"workdir": WORKSPACE, "env": clean_env(WORKSPACE), "shell": SHELL,
            "prefix": bash_limits_prefix(limits) if bash else "",
            "limits": [] if bash else [(r, s, h) for r, (s, h) in limit_pairs(limits)]}


class BwrapSandbox(Sandbox):
    """One sample: its workspace, its namespaces and the helper inside them (module doc)."""

    def __init__(
        self, root: Path, *, keep: bool = False, cwd: str | None = None, limits: Limits = DEFAULT_LIMITS,
        network: bool = True, nproc: int | None = 512, bwrap: str | None = None,
        output_cap: int = DEFAULT_OUTPUT_CAP, runtime: RootRuntime | None = None, egress: bool = False,
        allow: Sequence[str] = (), sample_limits: SampleLimits | None = None,
    ) -> None:
        """Without a `runtime` (tests, the probe), a root-mode sandbox starts one of its own."""
        self.root, self.keep, self._cwd_arg = Path(root), keep, cwd
        self.privileged = os.geteuid() == 0
        # RLIMIT_NPROC is per real uid: only meaningful with a uid of the sample's own (root mode).
        self.limits = replace(limits, nproc=nproc if self.privileged else limits.nproc)
        self.network = network
        self.bwrap = bwrap or find_bwrap()
        self.output_cap = output_cap
        self.uid = _UID_BASE + secrets.randbelow(_UID_SPAN) if self.privileged else os.getuid()
        self.workspace: Path | None = None
        self.workdir = WORKSPACE
        self._holder: asyncio.subprocess.Process | None = None  # user mode: the sample's bwrap
        self._channel: HelperChannel | None = None
        self.egress, self.allow = egress and self.privileged, tuple(allow)
        self.sample_limits = sample_limits or SampleLimits(memory=None, disk=None)
        self._runtime, self._own_runtime = runtime, False
        self._slot: Slot | None = None
        self.helper_pid = 0  # root mode: host pid of the slot's helper (the sample's pid 1)
        self._exited: asyncio.Future[int] | None = None
        self._begun = False

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

    @property
    def memory_group(self) -> MemoryGroup | None:
        return self._slot.memory if self._slot is not None else None

    async def start(self) -> None:
        if self.bwrap is None:
            raise SandboxError(NOT_FOUND)
        if self.privileged:
            await self._start_root()
        else:
            await self._start_user()

    async def _start_root(self) -> None:
        if self._runtime is None:  # no run provider (tests, the probe): a runtime of our own
            mode = "egress" if self.egress else "host" if self.network else "none"
            self._runtime = await root_runtime(self.bwrap, mode, self.allow, self.sample_limits)
            self._own_runtime = True
        self._slot = slot = await self._runtime.pool(self.root).acquire()
        self.helper_pid, self._exited = slot.helper_pid, slot.exited
        self.workspace, host_cwd = workspace.create_fresh(slot.workspaces, self._cwd_arg)
        points, self.cwd = self.mounts(host_cwd)
        # The sample's uid is the helper's for this sample: hand it its directories.
        chown_beneath(self.workspace, host_cwd.relative_to(self.workspace).parts, self.uid)
        assert slot.channel is not None
        self._channel = slot.channel
        self._channel.output_cap = self.output_cap
        lim = self.sample_limits
        begin = {"op": "begin", "uid": self.uid, "tmp": lim.tmp_size, "shm": lim.shm_size,
                 "mounts": [(inside, str(host)) for inside, host in sorted(points.items(), key=lambda p: len(p[0]))],
                 **self._helper_config(sorted(points))}
        try:
            async with asyncio.timeout(START_TIMEOUT):
                reply, _ = await self._channel.call(begin)
        except TimeoutError:
            raise SandboxError(f"the sandbox helper did not set up the sample within {START_TIMEOUT:g}s") from None
        except (SandboxError, OSError) as e:
            raise SandboxError(f"the sandbox helper could not set up the sample: {e}") from None
        self._begun = True
        if reply.get("uid") != self.uid:
            raise SandboxError(f"the sandbox helper runs as uid {reply.get('uid')}, not {self.uid}")

    async def _start_user(self) -> None:
        self.workspace, host_cwd = workspace.create(self.root, self._cwd_arg)
        points, self.cwd = self.mounts(host_cwd)
        python, python_ro = helper_python(SYSTEM_DIRS)
        argv = bwrap_argv(
            self.bwrap or "bwrap", layout=host_layout(),
            binds=sorted(((h, p) for p, h in points.items()), key=lambda b: len(b[1])),
            chdir="/", network=self.network, privileged=False, extra_ro=[*resolv_conf_target(), *python_ro],
            tmp_size=self.sample_limits.tmp_size, shm_size=self.sample_limits.shm_size)
        self._holder, self._channel = await start_user(argv, python, output_cap=self.output_cap)
        await self._configure(sorted(points))

    def _helper_config(self, roots: list[str]) -> dict[str, object]:
        return {"cwd": self.cwd, "roots": roots, **_shell_config(self.limits)}

    async def _configure(self, roots: list[str]) -> None:
        """User mode: the helper's first frame is its configuration."""
        assert self._channel is not None
        cfg = {"id": 0, **self._helper_config(roots)}
        try:
            async with asyncio.timeout(START_TIMEOUT):
                reply, _ = await self._channel.call(cfg)
        except (TimeoutError, SandboxError) as e:
            why = "did not start within %gs" % START_TIMEOUT if isinstance(e, TimeoutError) else "failed to start"
            err = b""
            if self._holder is not None and self._holder.stderr is not None:
                self._holder.kill()
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(2):
                        err = await self._holder.stderr.read()
            raise SandboxError(f"bwrap {why}: {err.decode(errors='replace').strip()[-300:] or 'no output'}") from None

    def _live(self) -> HelperChannel:
        if self._channel is None:
            raise SandboxError("sandbox used before start() or after close()")
        gone = self._holder.returncode is not None if self._holder is not None else \
            self._exited is not None and self._exited.done()
        if self._channel.broken or gone:
            raise SandboxError("the bwrap sandbox of this sample is gone")
        return self._channel

    async def exec(self, command: str, *, timeout: float, cwd: str | None = None) -> ExecResult:
        res = await self._live().exec(command, timeout=timeout, cwd=cwd)
        if self._slot is not None:
            self._slot.check(self.sample_limits, self.helper_pid)  # a hit limit ends the sample (SandboxError)
        return res

    async def spawn(self, command: str, *, cwd: str | None = None) -> Job:
        return await self._live().spawn(command, cwd=cwd)

    async def read_file(self, path: str, *, max_bytes: int = 256 << 20) -> bytes:
        return await self._live().read_file(path, max_bytes)

    async def write_file(self, path: str, data: bytes, *, how: str = "overwrite") -> str:
        return await self._live().write_file(path, data, how)

    async def search(self, path: str, pattern: str, *, target: str = "content", glob: str | None = None,
                     limit: int = 50, max_file: int = 2 << 20, max_files: int = 50_000) -> tuple[list[str], bool]:
        return await self._live().search(path, pattern, target=target, glob=glob, limit=limit, max_file=max_file,
                                         max_files=max_files)

    async def close(self) -> None:
        channel, self._channel = self._channel, None
        try:
            if self.privileged:
                await self._close_root(channel)
            else:
                # The helper exits when its channel closes, and as the pid namespace's init it
                # takes every process of the sample with it.
                if channel is not None:
                    channel.close()
                await self._close_user()
        finally:
            if self._own_runtime and self._runtime is not None:
                runtime, self._runtime = self._runtime, None
                await runtime.aclose()

    async def _close_root(self, channel: HelperChannel | None) -> None:
        slot, self._slot = self._slot, None
        if slot is None or self._runtime is None:
            return
        clean = False
        if channel is not None and self._begun:
            self._begun = False
            try:  # every process of the sample killed, its namespaces left (slot_helper.op_end)
                async with asyncio.timeout(15):
                    reply, _ = await asyncio.shield(channel.call({"op": "end"}))
                clean = reply.get("clean") is True
            except (TimeoutError, SandboxError, OSError):
                clean = False
        kept = await self._runtime.pool(self.root).release(slot, self.workspace, keep=self.keep, clean_exit=clean)
        if kept is not None:
            self.workspace = kept

    async def _close_user(self) -> None:
        holder, self._holder = self._holder, None
        if holder is not None:
            # bwrap reaps the helper and exits; killing bwrap first would leave the helper a zombie
            # of whatever reaps orphans on this host.
            for grace in (2.0, 5.0):
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(grace):
                        await asyncio.shield(holder.wait())
                if holder.returncode is not None:
                    break
                kill_group(holder)  # a helper stuck in the kernel: --die-with-parent ends it
        if self.workspace is not None and not self.keep:
            await workspace.remove(self.workspace)

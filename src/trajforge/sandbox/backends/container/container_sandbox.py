"""The container backend: one container per sample, in the row's image (Podman or Docker CLI).

A sample's container runs `sleep infinity` under an init, with the workspace mounted at the
row's `cwd` (default /workspace; what the image has there is copied in first, see
images.ImageChecker.seed) as its working directory, the configured memory/pids/cpu
limits (plus /tmp, /dev/shm, CPU and a size-limited disk for the workspace and, with rootful
Podman, the container's own filesystem: resources.py, rootfs.py), the network
of `--sandbox_network` (network.py), and only the image's own environment (the
engine CLI never passes the runner's); with rootful Podman, in a user namespace
(container_backend.py: the workspace's directories and the seeded files are then shifted to its
ids). Commands run with `exec`. Creation is bounded by
`--max_sandboxes`, separately from model concurrency; the image is checked once per run
(container_images.py). File operations go through a helper in the container's mount namespace when the
runner is root (container_backend.file_helper), else one `exec` of a sh script each
(container_files.py): either way paths resolve in the container's own view, never through the
bind-mounted host directory.

Killing what runs inside. Killing the `podman exec` client does not stop the process in the
container, so every command runs under a small sh wrapper (container_argv.py, with the `run`
command line; the exec'd process leads its own process group): foreground commands record their
group id under /dev/shm (or /tmp) and, on timeout or cancellation, a second exec kills that group; background commands (`spawn`) keep
the client's stdin open and a watchdog inside kills the group when it closes, i.e. when the
client is killed by the process tool. close() removes the container (`rm -f`), which ends
everything else. Containers carry labels and an owner (host, pid) in their name: leftovers of
a crashed runner are removed by the sweep at the next start, and an atexit hook removes the
live ones when the interpreter exits without closing them.
"""

from __future__ import annotations

import asyncio
import os
import posixpath
import secrets
import shlex
from dataclasses import replace
from pathlib import Path

from trajforge.catalog.sandboxes import NetworkMode
from trajforge.sandbox import workspace
from trajforge.sandbox.interface import ExecResult, Job, PathEscapeError, Provider, Sandbox, SandboxError
from trajforge.sandbox.channel import HelperChannel
from trajforge.sandbox.backends.container.container_argv import (
    EXEC_WRAP, ID_RANGE, JOB_LOG_BYTES, KILL_WRAP, SPAWN_WRAP, WORKSPACE, cpu_prefix, run_args,
)
from trajforge.sandbox.backends.container.container_backend import ContainerBackend, _live, backend_for, kill_exec_monitors
from trajforge.sandbox.backends.container.container_files import ContainerFiles
from trajforge.sandbox.backends.container.container_engine import container_name, last_line
from trajforge.sandbox.backends.local.local_sandbox import LocalJob
from trajforge.sandbox.dns.service import DnsForwarder
from trajforge.sandbox.process import DEFAULT_OUTPUT_CAP, Limits, make_preexec
from trajforge.sandbox.host.resources import Resources, ResourceLimits


def _engine_failed(res: ExecResult) -> bool:
    """Podman exits 125 for its own errors; the Docker CLI reports the daemon's with this prefix."""
    err = res.stderr.lstrip()
    return (res.exit_code == 125 and err.startswith("Error")) or err.startswith("Error response from daemon")


async def make(provider: Provider, *, cwd: str | None, image: str | None, root: Path) -> ContainerSandbox:
    """A row with an image always runs in a container (the image is never silently ignored)."""
    settings, run = provider.settings, provider.settings.container
    image = image or run.image
    if image is None:
        raise SandboxError("--sandbox container needs an image: give the row an `image` field or set "
                           "`container_image` in the config file")
    backend = await backend_for(provider)
    return ContainerSandbox(
        root, backend=backend, image=image, cwd=cwd, network=await provider.network_mode(),
        allow=settings.allow, limits=provider.sample_limits(), memory=run.memory, pids_limit=run.pids_limit,
        cpus=run.cpus, run_name=run.run_name, keep=settings.keep_workspaces,
    )


class ContainerSandbox(Sandbox):
    def __init__(self, root: Path, *, backend: ContainerBackend, image: str, cwd: str | None = None,
                 network: NetworkMode = NetworkMode.HOST, memory: str | None = None, pids_limit: int | None = None,
                 cpus: float | None = None, run_name: str | None = None, keep: bool = False,
                 output_cap: int = DEFAULT_OUTPUT_CAP, allow: tuple[str, ...] | list[str] = (),
                 limits: ResourceLimits | None = None, file_helper: bool = True) -> None:
        """file_helper: file operations through a helper in the container's mount namespace (root
        runner); otherwise, or when it cannot start, one `exec` of a sh script each (container_files.py)."""
        # An absolute cwd is where the workspace is mounted; a relative one is a directory in it.
        self.seeded = bool(cwd and cwd.startswith("/"))  # the image's content at cwd is copied in
        self.mount_at = (posixpath.normpath(cwd) or "/") if self.seeded and cwd else WORKSPACE
        self.root, self.keep, self.output_cap = Path(root), keep, output_cap
        self._cwd_arg = None if cwd and cwd.startswith("/") else cwd
        self.workspace: Path | None = None
        self._removed = False
        self.workdir = self.mount_at
        self._jobs: list[ContainerJob] = []
        self.files: ContainerFiles | None = None
        self.helper: HelperChannel | None = None
        self.dns: DnsForwarder | None = None  # egress with Podman (network.start_dns)
        self._want_helper = file_helper
        self.backend, self.engine, self.image = backend, backend.engine, image
        self.network, self.memory, self.pids_limit, self.cpus = network, memory, pids_limit, cpus
        self.run_name = run_name or ""
        self.name: str | None = None
        # On trajforge's root filesystem, whose ids Podman does not know, the host ids `podman cp`
        # must write for a file to be the container's user's (container_ops.copy_in); else None.
        self.cp_owner: tuple[int, int] | None = None
        self.allow = tuple(allow)
        # /tmp, /dev/shm and CPU from the engine; the disk image and the full-checks as for bwrap.
        self.limits = limits or ResourceLimits(memory=None, disk=None, tmp_size=None, shm_size=None, cpu_seconds=None)
        self._res = Resources(replace(self.limits, memory=None)) if os.geteuid() == 0 else None

    def _create_args(self, name: str, image: list[str]) -> list[str]:
        return run_args(name=name, run_name=self.run_name, workspace=str(self.workspace), mount_at=self.mount_at,
                        cwd=self.cwd, image=image, engine_flags=[*self.backend.init_flag, *self.backend.security],
                        network=self.network, engine_kind=self.engine.kind, memory=self.memory, limits=self.limits,
                        pids_limit=self.pids_limit, cpus=self.cpus, idmap=self.backend.idmap)

    def _cpu_prefix(self, command: str) -> str:
        return cpu_prefix(command, self.limits.cpu_seconds)

    async def _after_create(self) -> None:
        """Egress: the sandbox firewall inside the container's namespace, before any exec; the
        file helper."""
        if self.network != NetworkMode.EGRESS and self._res is None and not self._want_helper:
            return
        res = await self.engine.run("inspect", "--format", "{{.State.Pid}}", self.name or "", timeout=60)
        pid = int(res.stdout.strip()) if res.exit_code == 0 and res.stdout.strip().isdigit() else 0
        if self._want_helper and pid:
            self.helper = await self.backend.file_helper(pid, cwd=self.cwd, mount=self.mount_at, cap=self.output_cap)
        if self._res is not None and pid:
            self._res.after_holder(pid)
        if self.network == NetworkMode.EGRESS:
            if not pid or not os.path.exists(f"/proc/{pid}/ns/net"):
                raise SandboxError(f"egress networking needs the container's process on this host "
                                   f"({self.engine.kind} inspect gave {res.stdout.strip()!r})")
            from trajforge.sandbox.network import install_rules, start_dns

            await install_rules(pid, self.allow)
            if self.engine.kind == "podman":  # its slirp4netns's DNS at 10.0.2.3: only through a forwarder
                self.dns = await start_dns(pid)

    async def start(self) -> None:
        if self.mount_at == "/":
            raise SandboxError("task cwd '/' cannot hold the workspace; give a directory such as /app")
        self.workspace, host_cwd = workspace.create(self.root, self._cwd_arg)
        if self._res is not None:  # the size-limited workspace disk, mounted over it: cwd again
            await self._res.before_holder(self.workspace)
            host_cwd.mkdir(parents=True, exist_ok=True)
        rel = host_cwd.relative_to(self.workspace).as_posix()
        self.cwd = self.mount_at if rel == "." else f"{self.mount_at}/{rel}"
        await self.backend.images.ensure(self.image)
        if self.seeded:  # keep what the image has at the row's cwd
            seed = await self.backend.images.seed(self.image, self.mount_at)
            if seed is not None:
                await self._copy_in(seed)
        # After the copy, whose `cp -a` gave it the seed directory's 0700: the image's USER may not
        # be root; with a user namespace, the directories the runner made (the workspace, the cwd's)
        # are the container root's. No process of the sample runs yet: nothing can swap them.
        os.chmod(self.workspace, 0o777)
        if self.backend.idmap is not None:
            path = self.workspace
            for part in ("", *host_cwd.relative_to(self.workspace).parts):
                path = path / part
                if os.lstat(path).st_uid == 0:
                    os.lchown(path, self.backend.idmap, self.backend.idmap)
        async with self.backend.creating:
            image = await self.backend.own_rootfs.mount(self.image, self._res.disk if self._res is not None else None)
            self.cp_owner = image.cp_owner
            self.name = container_name()
            _live[self.name] = self.engine
            res = await self.engine.run(*self._create_args(self.name, image.args), timeout=120)
        if res.exit_code != 0:
            raise SandboxError(f"cannot start a container from {self.image!r} ({self.engine.kind}): {last_line(res)}")
        await self._after_create()
        self.files = ContainerFiles(self.engine.argv("exec", "-i", self.name), self.engine.env, mount=self.mount_at,
                                    cwd=self.cwd)

    async def _copy_in(self, seed: Path) -> None:
        # cp -a keeps owners and modes, so a non-root image USER can still write its files.
        proc = await asyncio.create_subprocess_exec("cp", "-a", f"{seed}/.", str(self.workspace),
                                                    stderr=asyncio.subprocess.PIPE)
        _, err = await proc.communicate()
        if proc.returncode != 0:
            raise SandboxError(f"cannot copy {self.mount_at} of {self.image!r} into the workspace: "
                               f"{err.decode(errors='replace')[-300:]}")
        if self.backend.idmap is not None:  # the image's owners as the container's user namespace sees them
            await asyncio.to_thread(workspace.shift_owners, self.workspace, self.backend.idmap, ID_RANGE)

    def _exec_args(self, command: str, cwd: str | None, *flags: str) -> tuple[list[str], str]:
        """(exec arguments, command): the command first enters its working directory, made if the
        model removed it (the mount point itself, the -w, always exists), on its first line."""
        if self.name is None:
            raise SandboxError("the container of this sample is gone")
        where = self.cwd if not cwd else posixpath.normpath(posixpath.join(self.cwd, cwd))
        if not (where == self.mount_at or where.startswith(self.mount_at.rstrip("/") + "/")):
            raise PathEscapeError(f"{cwd!r} is outside the workspace {self.mount_at}")
        if where != self.mount_at:
            q = shlex.quote(where)
            command = f"mkdir -p {q} 2>/dev/null; cd {q} || exit 125; {command}"
        return ["exec", *flags, "-w", self.mount_at, "-e", "TERM=dumb", "-e", "PAGER=cat", self.name], command

    async def exec(self, command: str, *, timeout: float, cwd: str | None = None) -> ExecResult:
        exec_id = secrets.token_hex(6)
        args, command = self._exec_args(self._cpu_prefix(command), cwd)
        argv = self.engine.argv(*args, "sh", "-c", EXEC_WRAP, "sh", exec_id, command)
        try:
            res = await self._run(argv, timeout)
        except BaseException:  # cancelled: the process inside must not outlive the call
            await asyncio.shield(self._kill_inside(exec_id))
            raise
        if res.timed_out:
            await self._kill_inside(exec_id)
        elif _engine_failed(res):  # the container is gone or broken: infrastructure, not the model's doing
            raise SandboxError(f"{self.engine.kind} exec in container {self.name} failed: {last_line(res)}")
        if self._res is not None:
            self._res.check()
        return res

    async def _run(self, argv: list[str], timeout: float) -> ExecResult:
        from trajforge.sandbox.process import run_argv

        try:
            return await run_argv(argv, timeout=timeout, cwd="/", env=self.engine.env, output_cap=self.output_cap)
        except OSError as e:
            raise SandboxError(f"cannot run {self.engine.kind} exec: {e}") from e

    async def _kill_inside(self, exec_id: str) -> None:
        if self.name is not None:
            await self.engine.run("exec", self.name, "sh", "-c", KILL_WRAP, "sh", exec_id, timeout=30)

    async def spawn(self, command: str, *, cwd: str | None = None) -> Job:
        from trajforge.sandbox.backends.local.local_sandbox import anonymous_file

        args, command = self._exec_args(self._cpu_prefix(command), cwd, "-i")
        argv = self.engine.argv(*args, "sh", "-c", SPAWN_WRAP, "sh", "", command)
        log = anonymous_file()  # the runner's own unlinked file: no path leads to it
        try:
            # The exec client writes the log on the host, outside the container's limits: its
            # RLIMIT_FSIZE bounds it (SIGXFSZ ends the client, and the watchdog the job).
            proc = await asyncio.create_subprocess_exec(
                *argv, stdin=asyncio.subprocess.PIPE, stdout=log, stderr=asyncio.subprocess.STDOUT,
                env=self.engine.env, start_new_session=True, cwd="/",
                preexec_fn=make_preexec(Limits(file_size_bytes=JOB_LOG_BYTES)))
        except OSError as e:
            os.close(log)
            raise SandboxError(f"cannot run {self.engine.kind} exec: {e}") from e
        job = ContainerJob(proc, log)
        self._jobs.append(job)  # its log stays readable, and is closed, when the sample ends
        return job

    def _files(self) -> ContainerFiles:
        if self.files is None or self.name is None:
            raise SandboxError("the container of this sample is gone")
        return self.files

    async def read_file(self, path: str, *, max_bytes: int = 256 << 20, offset: int | None = None) -> bytes:
        if self.helper is not None:
            return await self._live_helper().read_file(path, max_bytes, offset)
        return await self._files().read(path, max_bytes, offset)

    async def write_file(self, path: str, data: bytes, *, how: str = "overwrite") -> str:
        if self.helper is not None:
            return await self._live_helper().write_file(path, data, how)
        return await self._files().write(path, data, how)

    async def search(self, path: str, pattern: str, *, target: str = "content", glob: str | None = None,
                     limit: int = 50, max_file: int = 2 << 20, max_files: int = 50_000) -> tuple[list[str], bool]:
        if self.helper is not None:
            return await self._live_helper().search(path, pattern, target=target, glob=glob, limit=limit,
                                                    max_file=max_file, max_files=max_files)
        return await self._files().search(path, pattern, target=target, glob=glob, limit=limit,
                                          max_file=max_file, max_files=max_files)

    def _live_helper(self) -> HelperChannel:
        helper = self.helper
        if helper is None or helper.broken or self.name is None:
            raise SandboxError("the container of this sample is gone")
        return helper

    async def close(self) -> None:
        helper, self.helper = self.helper, None
        if helper is not None:
            helper.close()  # the file helper exits, releasing the container's mount namespace
        dns, self.dns = self.dns, None
        if dns is not None:
            await dns.close()  # its sockets hold the container's network namespace
        name, self.name = self.name, None
        for job in self._jobs:
            job.kill_now()  # the exec clients; what runs inside goes with the container
        if name is not None:
            res = await asyncio.shield(self.engine.run(*self.engine.rm_args(name), timeout=120))
            if res.exit_code == 0 or "no such container" in (res.stderr + res.stdout).lower():
                _live.pop(name, None)
                # Podman's, also behind the Docker CLI (`podman system service`); none elsewhere.
                await asyncio.to_thread(kill_exec_monitors, name)
        waits = [asyncio.ensure_future(j.proc.wait()) for j in self._jobs if j.proc.returncode is None]
        if waits:
            await asyncio.wait(waits, timeout=5)
        for job in self._jobs:
            job.forget()
        self._jobs.clear()
        if self._res is not None:  # the workspace disk first: it is mounted on the workspace
            await self._res.close(self.keep)
        if self.workspace is not None and self.keep:
            await workspace.defuse(self.workspace)
        elif self.workspace is not None and not self._removed:
            self._removed = True  # the attribute stays: callers may check the directory is gone
            await workspace.remove(self.workspace)


class ContainerJob(LocalJob):
    """A background `exec`: killing its client closes the watchdog's stdin inside (SPAWN_WRAP),
    which kills the command's process group in the container."""

"""The container backend: one container per sample, in the row's image (Podman or Docker CLI).

A sample's container runs `sleep infinity` under an init, with the workspace mounted at the
row's `cwd` (default /workspace; what the image has there is copied in first, see
images.ImageChecker.seed) as its working directory, the configured memory/pids/cpu
limits (plus /tmp, /dev/shm, CPU and a size-limited workspace disk, see resources.py), the network
of `--sandbox_network` (network.py), and only the image's own environment (the
engine CLI never passes the runner's). Commands run with `exec`. Creation is bounded by
`--max_sandboxes`, separately from model concurrency; the image is checked once per run
(images.py).

Killing what runs inside. Killing the `podman exec` client does not stop the process in the
container, so every command runs under a small sh wrapper (the exec'd process leads its own
process group): foreground commands record their group id under /dev/shm (or /tmp) and, on
timeout or cancellation, a second exec kills that group; background commands (`spawn`) keep
the client's stdin open and a watchdog inside kills the group when it closes, i.e. when the
client is killed by the process tool. close() removes the container (`rm -f`), which ends
everything else. Containers carry labels and an owner (host, pid) in their name: leftovers of
a crashed runner are removed by the sweep at the next start, and an atexit hook removes the
live ones when the interpreter exits without closing them.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import os
import posixpath
import secrets
import shlex
import socket
import subprocess
from dataclasses import replace
from pathlib import Path

from trajforge.sandbox import workspace
from trajforge.sandbox.base import ExecResult, Job, PathEscapeError, Provider, Sandbox, SandboxError
from trajforge.sandbox.container_files import ContainerFiles
from trajforge.sandbox.engine import Engine, container_name, detect, last_line, owner_dead
from trajforge.sandbox.images import ImageChecker
from trajforge.sandbox.local import LocalJob
from trajforge.sandbox.process import DEFAULT_OUTPUT_CAP
from trajforge.sandbox.resources import Resources, SampleLimits, sweep_leftovers


WORKSPACE = "/workspace"
_SHELL_PICK = 'if command -v bash >/dev/null 2>&1; then bash -c "$2"{r}; else sh -c "$2"{r}; fi; rc=$?; '
_PIDFILES = '"/dev/shm/.trajforge-$1" "/tmp/.trajforge-$1"'
EXEC_WRAP = ('for d in /dev/shm /tmp; do [ -d "$d" ] && [ -w "$d" ] && { echo $$ > "$d/.trajforge-$1"; break; }; '
             'done 2>/dev/null; ' + _SHELL_PICK.format(r="") + f'rm -f {_PIDFILES} 2>/dev/null; exit $rc')
KILL_WRAP = f'for f in {_PIDFILES}; do [ -f "$f" ] && kill -9 -"$(cat "$f")" 2>/dev/null; rm -f "$f"; done; true'
# fd 3 keeps the client's stdin: an async list in a non-interactive shell gets /dev/null otherwise.
SPAWN_WRAP = ('exec 3<&0; (cat <&3 >/dev/null 2>&1; kill -9 -$$ 2>/dev/null) & '
              + _SHELL_PICK.format(r=" </dev/null 3<&-") + 'kill $! 2>/dev/null; exit $rc')
_CATATONIT = ("/usr/libexec/podman/catatonit", "/usr/bin/catatonit", "/usr/local/libexec/podman/catatonit")

_live: dict[str, Engine] = {}  # container name -> engine, for the atexit fallback


@atexit.register
def _remove_live() -> None:
    """Last resort at interpreter exit: remove containers whose sample never closed them."""
    groups: dict[int, tuple[Engine, list[str]]] = {}
    for name, engine in list(_live.items()):
        groups.setdefault(id(engine), (engine, []))[1].append(name)
    for engine, names in groups.values():
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            subprocess.run([engine.binary, *engine.rm_args(*names)], env=engine.env, timeout=60, capture_output=True)
    _live.clear()


def _engine_failed(res: ExecResult) -> bool:
    """Podman exits 125 for its own errors; the Docker CLI reports the daemon's with this prefix."""
    err = res.stderr.lstrip()
    return (res.exit_code == 125 and err.startswith("Error")) or err.startswith("Error response from daemon")


class ContainerBackend:
    """What samples of one run share: the engine, the image checks and the creation limit."""

    def __init__(self, engine: Engine, *, max_creating: int, pull_timeout: float) -> None:
        self.engine = engine
        self.images = ImageChecker(engine, pull_timeout=pull_timeout)
        self.creating = asyncio.Semaphore(max_creating)
        self.init_flag = ["--init"] if engine.kind == "docker" or any(map(os.path.exists, _CATATONIT)) else []

    async def sweep(self) -> list[str]:
        """Remove containers left by crashed runners on this host; returns their names."""
        res = await self.engine.run("ps", "-a", "--filter", "label=trajforge", "--format", "{{.Names}}", timeout=60)
        dead = [n for n in res.stdout.split() if owner_dead(n)] if res.exit_code == 0 else []
        if dead:
            await self.engine.run(*self.engine.rm_args(*dead), timeout=120)
            await sweep_leftovers(force=True)  # their workspace disks, now that nothing uses them
        return dead


async def backend_for(provider: Provider) -> ContainerBackend:
    """The run's backend, held by its provider: engine detected and swept once."""
    config = provider.config

    async def detect_and_sweep() -> ContainerBackend:
        status = await detect(config.container_engine)
        if status.engine is None:
            why = "; ".join(f"{k}: {v}" for k, v in status.reasons.items())
            raise SandboxError(f"no usable container engine ({why}); see `trajforge doctor`")
        backend = ContainerBackend(status.engine, max_creating=config.max_sandboxes,
                                   pull_timeout=config.image_pull_timeout)
        await backend.sweep()
        return backend

    return await provider.state("container.backend", detect_and_sweep, lambda b: b.images.aclose())


async def make(provider: Provider, *, cwd: str | None, image: str | None, root: Path) -> ContainerSandbox:
    """A row with an image always runs in a container (the image is never silently ignored)."""
    config = provider.config
    image = image or config.container_image
    if image is None:
        raise SandboxError("--sandbox container needs an image: give the row an `image` field or set "
                           "`container_image` in the config file")
    backend = await backend_for(provider)
    return ContainerSandbox(
        root, backend=backend, image=image, cwd=cwd, network=await provider.network_mode(),
        allow=config.network.allow, limits=provider.sample_limits(),
        memory=config.container_memory or config.sandbox_memory, pids_limit=config.container_pids_limit,
        cpus=config.container_cpus, run_name=config.run_name, keep=config.keep_workspaces,
    )


class ContainerSandbox(Sandbox):
    def __init__(self, root: Path, *, backend: ContainerBackend, image: str, cwd: str | None = None,
                 network: str = "host", memory: str | None = None, pids_limit: int | None = None,
                 cpus: float | None = None, run_name: str | None = None, keep: bool = False,
                 output_cap: int = DEFAULT_OUTPUT_CAP, allow: tuple[str, ...] | list[str] = (),
                 limits: SampleLimits | None = None) -> None:
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
        self.backend, self.engine, self.image = backend, backend.engine, image
        self.network, self.memory, self.pids_limit, self.cpus = network, memory, pids_limit, cpus
        self.run_name = run_name or ""
        self.name: str | None = None
        self.allow = tuple(allow)
        # /tmp, /dev/shm and CPU from the engine; the disk image and the full-checks as for bwrap.
        self.limits = limits or SampleLimits(memory=None, disk=None, tmp_size=None, shm_size=None, cpu_seconds=None)
        self._res = Resources(replace(self.limits, memory=None)) if os.geteuid() == 0 else None

    def _create_args(self, name: str) -> list[str]:
        args = ["run", "-d", "--name", name, "--label", "trajforge=1", "--label", f"trajforge.run={self.run_name}",
                "--label", f"trajforge.owner={socket.gethostname()}:{os.getpid()}",
                "-v", f"{self.workspace}:{self.mount_at}", "-w", self.cwd, *self.backend.init_flag]
        args += self._network_args()
        if self.memory:  # --memory-swap equal to --memory: no swap on top
            args += ["--memory", self.memory, "--memory-swap", self.memory]
        lim = self.limits
        if lim.tmp_size:
            args += ["--tmpfs", f"/tmp:rw,nosuid,nodev,size={lim.tmp_size},mode=1777"]
        if lim.shm_size:
            args += ["--shm-size", str(lim.shm_size)]
        # CPU time is set per command (_cpu_prefix): any --ulimit flag would replace the engine's
        # default ulimits, and with them the nofile cap a generated containers.conf sets.
        if self.pids_limit:
            args += ["--pids-limit", str(self.pids_limit)]
        if self.cpus:
            args += ["--cpus", f"{self.cpus:g}"]
        return args + ["--entrypoint", "sleep", self.image, "infinity"]

    def _cpu_prefix(self, command: str) -> str:
        n = self.limits.cpu_seconds
        return f"ulimit -t {n} 2>/dev/null; {command}" if n else command

    def _network_args(self) -> list[str]:
        """none/egress/host; "host" is the engine's default network, as before egress existed."""
        if self.network == "none":
            return ["--network", "none"]
        if self.network == "egress" and self.engine.kind == "podman":
            return ["--network", "slirp4netns:allow_host_loopback=false"]
        return []

    async def _after_create(self) -> None:
        """Egress: the sandbox firewall inside the container's namespace, before any exec."""
        if self.network != "egress" and self._res is None:
            return
        res = await self.engine.run("inspect", "--format", "{{.State.Pid}}", self.name or "", timeout=60)
        pid = int(res.stdout.strip()) if res.exit_code == 0 and res.stdout.strip().isdigit() else 0
        if self._res is not None and pid:
            self._res.after_holder(pid, pid)
        if self.network == "egress":
            if not pid or not os.path.exists(f"/proc/{pid}/ns/net"):
                raise SandboxError(f"egress networking needs the container's process on this host "
                                   f"({self.engine.kind} inspect gave {res.stdout.strip()!r})")
            from trajforge.sandbox.network import install_rules

            await install_rules(pid, self.allow)

    async def start(self) -> None:
        if self.mount_at == "/":
            raise SandboxError("task cwd '/' cannot hold the workspace; give a directory such as /app")
        self.workspace, host_cwd = workspace.create(self.root, self._cwd_arg)
        if self._res is not None:  # the size-limited workspace disk, mounted over it: cwd again
            await self._res.before_holder(self.workspace)
            host_cwd.mkdir(parents=True, exist_ok=True)
        rel = host_cwd.relative_to(self.workspace).as_posix()
        self.cwd = self.mount_at if rel == "." else f"{self.mount_at}/{rel}"
        os.chmod(self.workspace, 0o777)  # the image's USER may not be root
        await self.backend.images.ensure(self.image)
        if self.seeded:  # keep what the image has at the row's cwd
            seed = await self.backend.images.seed(self.image, self.mount_at)
            if seed is not None:
                await self._copy_in(seed)
        async with self.backend.creating:
            self.name = container_name()
            _live[self.name] = self.engine
            res = await self.engine.run(*self._create_args(self.name), timeout=120)
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
        from trajforge.sandbox.local import anonymous_file

        args, command = self._exec_args(self._cpu_prefix(command), cwd, "-i")
        argv = self.engine.argv(*args, "sh", "-c", SPAWN_WRAP, "sh", "", command)
        log = anonymous_file()  # the runner's own unlinked file: no path leads to it
        try:
            proc = await asyncio.create_subprocess_exec(
                *argv, stdin=asyncio.subprocess.PIPE, stdout=log, stderr=asyncio.subprocess.STDOUT,
                env=self.engine.env, start_new_session=True, cwd="/")
        except OSError as e:
            os.close(log)
            raise SandboxError(f"cannot run {self.engine.kind} exec: {e}") from e
        job = ContainerJob(proc, log)
        self._jobs = [j for j in self._jobs if j.returncode is None]
        self._jobs.append(job)
        return job

    def _files(self) -> ContainerFiles:
        if self.files is None or self.name is None:
            raise SandboxError("the container of this sample is gone")
        return self.files

    async def read_file(self, path: str, *, max_bytes: int = 256 << 20) -> bytes:
        return await self._files().read(path, max_bytes)

    async def write_file(self, path: str, data: bytes, *, how: str = "overwrite") -> str:
        return await self._files().write(path, data, how)

    async def search(self, path: str, pattern: str, *, target: str = "content", glob: str | None = None,
                     limit: int = 50, max_file: int = 2 << 20, max_files: int = 50_000) -> tuple[list[str], bool]:
        return await self._files().search(path, pattern, target=target, glob=glob, limit=limit,
                                          max_file=max_file, max_files=max_files)

    async def close(self) -> None:
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
        if self.workspace is not None and not self.keep and not self._removed:
            self._removed = True  # the attribute stays: callers may check the directory is gone
            await workspace.remove(self.workspace)


def kill_exec_monitors(name: str) -> int:
    """Kill the `conmon` exec-session monitors of the removed Podman container `name`.

    A `podman exec` client that is killed (a command's timeout, a cancelled sample, the process
    tool's kill) leaves its session's conmon waiting `exit_command_delay` (300 s by default) to
    run a cleanup that has nothing left to clean once the container is gone; hundreds of
    timed-out commands would keep hundreds of them around. Matched by the container's unique name
    on conmon's own command line (`-n NAME`). Returns how many were killed."""
    killed = 0
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/comm", "rb") as f:
                if f.read().strip() != b"conmon":
                    continue
            with open(f"/proc/{entry.name}/cmdline", "rb") as f:
                args = f.read().split(b"\0")
        except OSError:  # gone meanwhile
            continue
        if any(a == b"-n" and b == name.encode() for a, b in zip(args, args[1:])):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(int(entry.name), 9)
                killed += 1
    return killed


class ContainerJob(LocalJob):
    """A background `exec`: killing its client closes the watchdog's stdin inside (SPAWN_WRAP),
    which kills the command's process group in the container."""

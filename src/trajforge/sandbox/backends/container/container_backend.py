"""What the container samples of one run share: the engine, image checks, creation limit, file helpers.

One ContainerBackend per run, held by the provider (`backend_for`): the engine detected and a
crashed runner's leftovers swept once, each distinct image checked once (container_images.py),
`--max_sandboxes` bounding container creation, and, when the runner is root, a zygote
(zygote.py) that starts each container's file helper: a process in the container's mount
namespace with the uid of the container's own process and no capability, so reads, writes and
searches resolve exactly as the container sees its files (helper.py, fsops.py), at the cost of
a message instead of an `exec`. With Podman, containers get trajforge's seccomp profile, as strict
as Docker's default (container_seccomp.py), and with either engine the capabilities of DROPPED_CAPS
are taken out of the engine's default set. Rootful Podman's containers get a user namespace, one
range of unused host ids per run (`idmap`), so a sample that is root inside is no one on the host;
the file helper then runs as the container process's host uid (zygote.op_enter). Also here: the
last-resort removal of live containers at interpreter exit, and the sweep of Podman's exec-session
monitors.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import os
import secrets
import socket
import subprocess

from trajforge.sandbox.interface import Provider, SandboxError
from trajforge.sandbox.backends.bwrap.bwrap_start import helper_source
from trajforge.sandbox.channel import HelperChannel
from trajforge.sandbox.backends.container.container_argv import ID_RANGE
from trajforge.sandbox.backends.container.container_seccomp import profile_flags
from trajforge.sandbox.backends.container.container_engine import Engine, detect, owner_dead
from trajforge.sandbox.host.zygote_client import Zygote
from trajforge.sandbox.backends.container.container_images import ImageChecker
from trajforge.sandbox.backends.container.rootfs import OwnRootfs
from trajforge.sandbox.host.cgroups import ROOT
from trajforge.sandbox.host.disk import detach_all_now
from trajforge.sandbox.host.resources import sweep_leftovers

_CATATONIT = ("/usr/libexec/podman/catatonit", "/usr/bin/catatonit", "/usr/local/libexec/podman/catatonit")

# Of the engines' default capability set, those a task has no use for and a hostile sample does:
# raw sockets (forged packets, sniffing or ARP-spoofing other containers on a shared bridge),
# device nodes, file capabilities, capability-set changes, audit records. What package managers
# and builds use stays (chown, setuid/setgid, DAC override, low ports, chroot). Not
# no-new-privileges: it would break `sudo` in images whose user is not root, and gains nothing
# where it is (the container's root is that user's to reach).
DROPPED_CAPS = ("NET_RAW", "MKNOD", "SETFCAP", "SETPCAP", "AUDIT_WRITE")
# Host ids for containers' user namespaces: [1.0e9, 1.7e9), 64K-aligned; bwrap's sample uids start at 1.8e9.
ID_LOW, _ID_SLOTS = 1_000_013_824, 10_000  # 1_000_013_824 = 15259 * 65536

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
    detach_all_now()  # their root filesystems, if on a sample's disk (rootfs.py)


class ContainerBackend:
    """What samples of one run share: the engine, the image checks, the creation limit, and (root
    runner) the zygote that starts each container's file helper."""

    def __init__(self, engine: Engine, *, max_creating: int, pull_timeout: float) -> None:
        self.engine = engine
        self.images = ImageChecker(engine, pull_timeout=pull_timeout)
        self.creating = asyncio.Semaphore(max_creating)
        self.init_flag = ["--init"] if engine.kind == "docker" or any(map(os.path.exists, _CATATONIT)) else []
        self._security: list[str] | None = None
        # Rootful Podman: the run's containers get a user namespace, their ids mapped to a range of
        # host ids no account uses (below bwrap's sample uids), one range per run: a map per sample
        # would make Podman chown a copy of the image per container where the kernel cannot idmap
        # its layers. Docker has only its daemon-wide userns-remap.
        self.idmap = ID_LOW + secrets.randbelow(_ID_SLOTS) * ID_RANGE \
            if engine.kind == "podman" and os.geteuid() == 0 else None
        self.zygote: Zygote | None = None
        self._zygote_lock = asyncio.Lock()
        self.own_rootfs = OwnRootfs(engine, self.idmap)  # containers' own filesystems on their disks

    @property
    def security(self) -> list[str]:
        """`run` flags: with Podman, trajforge's seccomp profile (container_seccomp.py), written once,
        at the first container; DROPPED_CAPS with both."""
        if self._security is None:
            self._security = profile_flags(self.engine.kind) + [f"--cap-drop={c}" for c in DROPPED_CAPS]
        return self._security

    async def file_zygote(self) -> Zygote | None:
        """The zygote of file helpers, started on first use; None when the runner is not root."""
        if os.geteuid() != 0:
            return None
        async with self._zygote_lock:
            if self.zygote is None:
                self.zygote = await Zygote().start(helper_source(zygote=True))
        return self.zygote

    async def file_helper(self, pid: int, *, cwd: str, mount: str, cap: int) -> HelperChannel | None:
        """A helper in every namespace of the container whose process is `pid` (zygote.op_enter),
        as that process's uid and without capabilities, serving file operations with paths as
        the container sees them; None (exec-based file operations) when the runner is not root
        or the container cannot be entered."""
        zygote = await self.file_zygote()
        if zygote is None:
            return None
        try:
            uid, gid = _ids_of(pid)
        except (OSError, ValueError):
            return None
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        channel = HelperChannel(ours, cap)
        try:
            await zygote.fork(theirs, "enter", pid=pid, uid=uid, gid=gid, cgroups=_cgroups_of(pid))
            cfg = {"id": 0, "cwd": cwd, "roots": [mount], "workdir": mount, "env": {}, "shell": "/bin/sh",
                   "prefix": "", "limits": []}
            async with asyncio.timeout(30):
                await channel.call(cfg)
        except (SandboxError, TimeoutError, OSError):
            channel.close()
            return None
        return channel

    async def aclose(self) -> None:
        await self.images.aclose()
        self.own_rootfs.close()
        if self.zygote is not None:
            await self.zygote.aclose()
            self.zygote = None

    async def sweep(self) -> list[str]:
        """Remove containers left by crashed runners on this host, their root filesystems and
        disks with them; returns their names. With Podman, storage-only containers too (`ps
        --external`: a create or removal cut short leaves one, and it blocks `rmi` of its image):
        those have no labels, so ours are told by name alone."""
        external = ["--external"] if self.engine.kind == "podman" else ["--filter", "label=trajforge"]
        res = await self.engine.run("ps", "-a", *external, "--format", "{{.Names}}", timeout=60)
        dead = [n for n in res.stdout.split() if owner_dead(n)] if res.exit_code == 0 else []
        if dead:
            await self.engine.run(*self.engine.rm_args(*dead), timeout=120)
        # Then their mounts, lazily (a container whose removal failed may still run on its root).
        await sweep_leftovers(force=bool(dead))
        return dead


async def backend_for(provider: Provider) -> ContainerBackend:
    """The run's backend, held by its provider: engine detected and swept once."""
    run = provider.settings.container

    async def detect_and_sweep() -> ContainerBackend:
        status = await detect(run.engine)
        if status.engine is None:
            why = "; ".join(f"{k}: {v}" for k, v in status.reasons.items())
            raise SandboxError(f"no usable container engine ({why}); see `trajforge doctor`")
        backend = ContainerBackend(status.engine, max_creating=run.max_sandboxes, pull_timeout=run.image_pull_timeout)
        await backend.sweep()
        return backend

    return await provider.state("container.backend", detect_and_sweep, ContainerBackend.aclose)


async def prefetch(provider: Provider, images: list[str]) -> None:
    """Start checking (and pulling) `images` in the background (the spec's `prefetch`); without an
    engine, nothing: every sample with an image will say so."""
    try:
        backend = await backend_for(provider)
    except SandboxError:
        return
    backend.images.prefetch(images)


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


def _cgroups_of(pid: int) -> list[str]:
    """The cgroup.procs files of a process's cgroups (its /proc cgroup file, as the host sees it)."""
    out = []
    try:
        with open(f"/proc/{pid}/cgroup", encoding="utf-8") as f:
            for line in f:
                _, controllers, path = line.rstrip("\n").split(":", 2)
                name = controllers.removeprefix("name=") if controllers else ""
                base = ROOT if not controllers else ROOT / name
                if not controllers and not (ROOT / "cgroup.controllers").exists():
                    base = ROOT / "unified"
                procs = base / path.lstrip("/") / "cgroup.procs"
                if procs.exists():
                    out.append(str(procs))
    except (OSError, ValueError):
        return []
    return out


def _ids_of(pid: int) -> tuple[int, int]:
    """The effective uid and gid of a process (its /proc status)."""
    uid = gid = -1
    with open(f"/proc/{pid}/status", encoding="ascii") as f:
        for line in f:
            if line.startswith("Uid:"):
                uid = int(line.split()[2])
            elif line.startswith("Gid:"):
                gid = int(line.split()[2])
    if uid < 0 or gid < 0:
        raise ValueError(f"no uid/gid for process {pid}")
    return uid, gid

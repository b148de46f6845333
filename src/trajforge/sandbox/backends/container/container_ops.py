"""The container backend's ImageSandbox: a sample's container with the runner's own operations.

Task environments (trajforge.tasks) run the solution and the hidden tests in a sample's
container after the agent, which needs operations no tool may have (sandbox/interface.py's
ImageSandbox), each through the engine CLI on a started ContainerSandbox:
- `make`: a sample's container, with a task's own limits (SampleResources: cpus, memory, storage,
  network) where given, else the run's;
- `stop_processes`: SIGSTOP then SIGKILL of every process but the container's own (its init and
  `sleep infinity`, there before the sample's first command), pass after pass until one finds
  none, from the host (from_host.py: nothing of the container runs, whatever it replaced);
- `fresh_dirs` / `remove`: directories removed and made anew (the tests', the logs'), from the host;
- `upload` / `download` / `download_tree`: a host directory into the container (the engine's
  `cp`), one regular file out (read from the host, no link followed) and a tree out (the engine's
  tar stream, links kept as links, checked entry by entry: seed_tar.py);
- `changes`: the engine's diff of the container's own filesystem against its image.
These are the engine's own operations, not the sample's: paths are the container's, unrestricted.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import Callable, Mapping
from dataclasses import replace
from pathlib import Path

from trajforge.catalog.sandboxes import NetworkMode
from trajforge.sandbox.interface import (
    Change, Copied, ImageSandbox, Provider, SampleResources, SandboxError, SandboxSpoiled, Stopped,
)
from trajforge.sandbox.backends.container import from_host
from trajforge.sandbox.backends.container.container_sandbox import ContainerSandbox
from trajforge.sandbox.backends.container.container_argv import pid_files
from trajforge.sandbox.backends.container.container_backend import backend_for
from trajforge.sandbox.backends.container.container_engine import last_line
from trajforge.sandbox.backends.container.seed_tar import copy_tree_out


async def make(provider: Provider, *, cwd: str | None, image: str | None, root: Path,
               resources: SampleResources | None = None) -> ContainerTaskSandbox:
    """An unstarted container sandbox (the spec's `make`): a row's image, or the run's
    `container_image`; with `resources`, those limits instead of the run's (None: the run's)."""
    settings, run = provider.settings, provider.settings.container
    image = image or run.image
    if image is None:
        raise SandboxError("--sandbox container needs an image: give the row an `image` field or set "
                           "`container_image` in the config file")
    r = resources or SampleResources()
    backend = await backend_for(provider)
    limits = provider.sample_limits()
    if r.disk is not None:
        limits = replace(limits, disk=r.disk)
    sb = ContainerTaskSandbox(
        root, backend=backend, image=image, cwd=cwd, allow=settings.allow, limits=limits,
        network=NetworkMode.NONE if r.network_none else await provider.network_mode(),
        memory=str(r.memory) if r.memory is not None else run.memory, pids_limit=run.pids_limit,
        cpus=r.cpus if r.cpus is not None else run.cpus, run_name=run.run_name, keep=settings.keep_workspaces,
    )
    sb.seeded = sb.seeded and r.seed
    return sb


class ContainerTaskSandbox(ContainerSandbox, ImageSandbox):
    """A sample's container with the runner's own operations (the module doc)."""

    _init: int | None = None  # host pid of the container's init, once asked
    _refused: int | None = 0  # forks its process limit refused, at the last stop_processes

    def _name(self) -> str:
        if self.name is None:
            raise SandboxError("the container of this sample is gone")
        return self.name

    async def _init_pid(self) -> int:
        """The host pid of the container's init; SandboxSpoiled when the container no longer runs
        (only its own processes can stop it: the runner has not)."""
        if self._init is not None and from_host.pid_ns(self._init) is not None:
            return self._init
        res = await self.engine.run("inspect", "--format", "{{.State.Pid}} {{.State.Running}}", self._name(),
                                    timeout=60)
        pid, _, running = res.stdout.strip().partition(" ")
        if res.exit_code != 0:
            raise SandboxError(f"cannot inspect container {self.name} ({self.engine.kind}): {last_line(res)}")
        if running != "true" or not pid.isdigit() or pid == "0":
            raise SandboxSpoiled("the sample's container stopped before the runner's next step: only its own "
                                 "processes could stop it (its main process was killed, or it ran out of memory)")
        if from_host.pid_ns(pid) is None:
            raise SandboxError(f"the processes of container {self.name} are not on this host ({self.engine.kind} "
                               "elsewhere): the runner cannot act on them from outside")
        self._init = int(pid)
        return self._init

    async def stop_processes(self) -> Stopped:
        init = await self._init_pid()
        killed = await from_host.stop_all(init, has_init=bool(self.backend.init_flag))
        refused = from_host.forks_refused(init)
        note = None
        if refused and self._refused is not None and refused > self._refused:
            note = (f"the sample's processes had reached the container's limit of {self.pids_limit} ({refused} forks "
                    f"refused: a fork bomb?); the {killed} left were stopped from the host")
        self._refused = refused
        return Stopped(killed, note)

    async def _kill_inside(self, exec_id: str) -> None:
        """A command's process group, at its timeout or cancellation: from the host (the group id the
        command's wrapper wrote is read there, never followed through a link); where the container's
        processes are not on this host, with a command inside as before."""
        try:
            init = await self._init_pid()
        except SandboxSpoiled:
            return  # the container has stopped: nothing of it runs
        except SandboxError:
            await super()._kill_inside(exec_id)
            return
        for path in pid_files(exec_id):
            try:
                data = await asyncio.to_thread(from_host.read_file, init, path, 64)
            except (ValueError, SandboxError):
                continue
            if data is not None and data.strip().isdigit():
                await from_host.kill_group(init, int(data))
                with contextlib.suppress(OSError, SandboxError):
                    await asyncio.to_thread(from_host.remove, init, path)

    async def fresh_dirs(self, dirs: Mapping[str, int]) -> None:
        init = await self._init_pid()
        try:
            await asyncio.to_thread(from_host.fresh_dirs, init, dirs)
        except OSError as e:
            raise SandboxSpoiled(f"cannot make {', '.join(dirs)} anew in the container: {e.strerror or e} "
                                 f"({os.fsdecode(e.filename) if e.filename else 'the container root'})") from None

    async def remove(self, path: str) -> None:
        init = await self._init_pid()
        try:
            await asyncio.to_thread(from_host.remove, init, path)
        except OSError as e:
            raise SandboxSpoiled(f"cannot remove {path} in the container: {e.strerror or e}") from None

    async def upload(self, source: Path, path: str) -> None:
        res = await self.engine.run("cp", f"{source}/.", f"{self._name()}:{path}", timeout=300)
        if res.exit_code != 0:
            why = last_line(res)
            cls = SandboxSpoiled if "no space left" in why.lower() else SandboxError
            raise cls(f"cannot copy {source} into {path} of container {self.name}: {why}")

    async def download(self, path: str, limit: int) -> bytes | None:
        return await asyncio.to_thread(from_host.read_file, await self._init_pid(), path, limit)

    async def download_tree(self, path: str, dest: Path, limit: int) -> Copied | None:
        return await copy_tree_out(self.engine.argv("cp", f"{self._name()}:{path.rstrip('/')}/.", "-"),
                                   self.engine.env, dest, limit=limit, what=f"{path} of container {self.name}",
                                   timeout=600)

    async def changes(self, wanted: Callable[[str], bool]) -> list[Change] | None:
        """The engine's diff, read line by line (it may list every file of a large install)."""
        proc = await asyncio.create_subprocess_exec(*self.engine.argv("diff", self._name()),
                                                    stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
                                                    stderr=asyncio.subprocess.DEVNULL, env=self.engine.env, cwd="/")
        assert proc.stdout is not None
        found = []
        try:
            async with asyncio.timeout(300):
                async for raw in proc.stdout:
                    kind, _, path = raw.decode(errors="replace").rstrip("\n").partition(" ")
                    if kind in ("A", "C", "D") and path.startswith("/") and wanted(path):
                        found.append(Change(kind, path))
                code = await proc.wait()
        except BaseException:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
            raise
        return found if code == 0 else None


